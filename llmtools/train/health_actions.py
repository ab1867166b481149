"""What a run does when its health gate trips (:class:`HealthActions`, a part of the trainer).

A NaN/inf or a spike is the data's fault only when the same weights do well on other data: then the
offending samples are quarantined (the data part names them, :mod:`~llmtools.train.data_part`) and the run
passes over them; otherwise the config or the state is the cause and the run stops without saving. Too
many skipped updates, an update spike with ``stop``, a routing collapse with ``stop`` and an fp16 loss
scale at its minimum stop the run with the last good state saved. Every method is collective where it
says so; they read the trainer's engine, gate, progress and metrics (:class:`~llmtools.train.trainer._Trainer`).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import NoReturn

from llmtools.ckpt import layout
from llmtools.data.stages import ExhaustedSource
from llmtools.errors import InputError, RuntimeFailure
from llmtools.formats.quarantine import append_records, quarantine_path
from llmtools.train.distributed import any_rank, gather_objects, mean_over_ranks
from llmtools.train.metrics import event


class HealthActions:
    """The trainer's responses to its health gate (mixed into the trainer, whose state they act on)."""

    def loss_scale(self) -> float | None:
        """fp16: the loss scale DeepSpeed's scaler uses now."""
        scale = getattr(self.engine.optimizer, "loss_scale", None) if self.fp16 else None
        return None if scale is None else float(scale)

    def _stop_if_scale_collapsed(self, error: Exception) -> None:
        """DeepSpeed raises when gradients overflow at the minimum loss scale: stop with the last good state
        (that step was not applied) and say what to change. Any other failure is left to propagate."""
        if not self._scale_collapsed(error):
            return
        scale = self.loss_scale()
        step = self.progress.step
        reason = (
            f"the fp16 loss scale fell to its minimum {scale:g} (fp16.min_loss_scale) and the gradients of step "
            f"{step + 1} still overflow"
        )
        lower = f"{self.cfg.optimizer.lr / 10:g}"
        self._stop_run(
            lambda saved, _before: f"stopped at step {step}: {reason}; checkpoint {saved}",
            lambda saved, _before: (
                f"stopped at step {step}: {reason}; the last good state is saved in {saved}; values exceed "
                f"fp16's range: continue with a lower learning rate, --resume {saved} --set "
                f"optimizer.lr={lower}, or train in bf16 as a new run from these weights, -o NEW_RUN "
                f"--init-from {saved} --set training.precision=bf16"
            ),
            save=True,
        )

    def _scale_collapsed(self, error: Exception) -> bool:
        """Whether ``error`` is DeepSpeed's dynamic loss scaler giving up at its minimum scale. DeepSpeed
        raises a bare ``Exception`` for it (no type or attribute of its own), so its message is the only
        signal; it counts only at the minimum of a dynamic scale."""
        scale, floor = self.loss_scale(), self.cfg.fp16.min_loss_scale
        if scale is None or scale > floor or self.cfg.fp16.loss_scale:
            return False
        return "scale" in str(error).lower()

    def _report_health(self, grad_norm: float | None) -> None:
        """An event and a stderr line for a NaN/inf, a spike or an fp16 overflow, and the count of
        consecutive skips (fp16 overflows are the loss scaler's business and do not count)."""
        gate, health, step = self.gate, self.cfg.health, self.progress.step
        if gate.update_spike is not None:
            action = "stopping" if health.update_spike_action == "stop" else "continuing"
            event(self.metrics, step, "spike", f"{gate.update_spike}; {action}")
            self.log(f"step {step}: {gate.update_spike}; {action}", always=True)
        if gate.reason == "overflow":
            message = f"fp16 gradients overflowed: update skipped; loss scale now {self.loss_scale():g}"
            event(self.metrics, step, "overflow", message)
            self.log(f"step {step}: {message}")
            return
        if gate.reason is None:
            gate.consecutive_skips = 0
            return
        gate.consecutive_skips = gate.consecutive_skips + 1 if gate.skip else 0
        if gate.reason == "nan":
            what = "NaN/inf loss or grad norm"
        elif gate.reason == "loss_spike":
            what = f"loss spike {gate.loss:.4g} > {health.loss_spike_factor} x median {statistics.median(gate.loss_history):.4g}"
        else:
            what = (
                f"grad-norm spike {grad_norm:.3g} > {health.spike_factor} x median "
                f"{statistics.median(gate.history):.3g}"
            )
        action = "stopping" if gate.stop else ("update skipped" if gate.skip else "continuing")
        event(self.metrics, step, gate.reason, f"{what}; {action}")
        self.log(f"step {step}: {what}; {action}", always=True)

    def _note_good_state(self) -> None:
        """A step that passed every check of the health gate vouches for the weights it started from: the
        checkpoint holding them (saved after the step before, or resumed from) becomes the last good
        state, which pruning keeps and a divergence's stop names."""
        gate = self.gate
        if gate.reason is not None or gate.update_spike is not None or self.unchecked_checkpoint is None:
            return
        self.good_checkpoint, self.unchecked_checkpoint = self.unchecked_checkpoint, None
        self.manager.known_good = self.good_checkpoint

    def _report_collapse(self, collapse: str) -> None:
        """A ``moe_collapse`` event and a stderr line; with ``health.moe_collapse_action: stop``, a
        checkpoint of this state (the routing, not a single update, is what went wrong) and a stop."""
        step = self.progress.step
        stop = self.cfg.health.moe_collapse_action == "stop"
        event(self.metrics, step, "moe_collapse", f"{collapse}; {'stopping' if stop else 'continuing'}")
        self.log(f"step {step}: {collapse}; {'stopping' if stop else 'continuing'}", always=True)
        if not stop:
            return
        if "dropped" in collapse:  # over the experts' capacity: more capacity, or none (dropless)
            factor = self.plan.model_config.moe_capacity_factor or 1.0
            change = f"--set model.moe_capacity_factor={factor * 2:g} (or null: dropless)"
        else:  # most experts idle: the load-balancing loss weighs more
            coef = self.plan.model_config.router_aux_loss_coef or 0.001
            change = f"--set model.router_aux_loss_coef={coef * 10:g}"
        self._stop_run(
            lambda saved, _before: f"stopped at step {step}: health.moe_collapse_action=stop",
            lambda saved, _before: (
                f"stopped at step {step}: health.moe_collapse_action=stop ({collapse}); the state is saved "
                f"in {saved}; continue with --resume {saved} {change}"
            ),
            save=True,
        )

    def _other_data_loss(self) -> float | None:
        """The loss the current weights give on other data: the next step's first micro-batch of this rank
        (a function of the position alone, so a resumed run decides as the uninterrupted one), without
        gradients, in eval mode (no dropout: nothing drawn from the RNG). The mean over ranks
        (collective); None at the data's last step."""
        import torch

        micro = self.cfg.training.micro_batch_size
        first = self.progress.consumed_samples + self.rank * micro
        if self.progress.consumed_samples + self.world * micro > len(self.plan.train_data):
            return None  # the data's last step: no other data to try
        positions = list(range(first, first + micro))
        model = self.engine if self.router is None else self.router
        self.engine.eval()
        try:
            with torch.no_grad():
                out = self.plan.task.loss(model, self.plan.train_data.batch(positions), self.device)
                if self.router is not None:
                    self.router.take_aux()
        finally:
            self.engine.train()
        local = float(out.loss.detach().float())
        bad = any_rank(not math.isfinite(local), self.device)
        return float("nan") if bad else mean_over_ranks(local, self.device)

    def _finite_sample_in_step(self) -> bool:
        """Whether some sample of this step has a finite loss of its own with the same weights (every rank
        scores all its micro-batches: ZeRO-3 needs the same forwards on every rank). Collective."""
        import torch

        task, found = self.plan.task, False
        with torch.no_grad():
            for micro in self.step_batches:
                per_sample = task.sample_losses(self.engine, self.plan.train_data.batch(micro), self.device)
                found = found or any(math.isfinite(v) for v in per_sample or [])
        return any_rank(found, self.device)

    def _stop_unless_the_data_is_the_cause(self) -> None:
        """A NaN/inf or a spike is the data's fault only when the same weights do well on other data. When
        they do not, the weights themselves (the config: learning rate, init range, rope theta, a loss
        setting; or an update applied before) are the cause: nothing is quarantined, and the run stops
        without saving this state, which is not a good one. Collective."""
        gate = self.gate
        if gate.reason == "nan" and self._finite_sample_in_step():
            return
        loss = self._other_data_loss()
        if loss is None:
            return
        if gate.reason == "loss_spike" and gate.loss_limit is not None and gate.loss is not None:
            # the weights are to blame when other data is about as bad as the spiking batch (within the
            # spike factor of its loss), not merely over the limit: one micro-batch's loss is noisy
            bad = loss > gate.loss_limit and loss * self.cfg.health.loss_spike_factor >= gate.loss
            healthy = math.isfinite(loss) and not bad
        else:
            healthy = math.isfinite(loss)
        if healthy:
            return
        step = self.progress.step
        what = {"nan": "a NaN/inf loss or grad norm", "loss_spike": "a loss spike"}.get(
            gate.reason, "a grad-norm spike"
        )
        message = (
            f"stopped at step {step}: {what}, and the same weights give a loss of {loss:.4g} on other data: the "
            "cause is the config or the state (optimizer.lr, model.initializer_range, model.rope_theta, the "
            "task's settings), not the data; nothing was quarantined and this state was not saved"
        )
        self._stop_run(
            lambda _saved, _before: message,
            lambda _saved, before: message + self._last_good_advice(before),
            save=False,
            cause="config",
        )

    def _last_good_advice(self, newest: Path | None) -> str:
        """Where to continue from after a divergence the config caused: the last good state, never a
        checkpoint that may hold the update that diverged."""
        good = self.good_checkpoint
        if good is None:
            unsure = f"; the newest checkpoint, {newest}, may hold the update that diverged" if newest else ""
            return f"{unsure}; no checkpoint has passed a health-checked step since: fix the config and start over (--force)"
        step = layout.parse_step(good.name)
        newer = (
            f" ({newest} is newer but may hold the update that diverged)"
            if newest not in (None, good)
            else ""
        )
        return (
            f"; the last good state is {good}, whose weights then passed a health-checked step{newer}: "
            f"continue from it with a lower learning rate, --resume {step} --rollback --set "
            f"optimizer.lr={self.cfg.optimizer.lr / 10:g}"
        )

    def _quarantine(self) -> None:
        """The health gate tripped: append the offending samples of this step to RUN/quarantine.jsonl.

        For a NaN/inf, each rank scores its samples one by one (every rank runs the same forwards, which
        ZeRO-3 needs) and names those whose own loss is not finite; when no sample is (a non-finite
        gradient of finite losses), or for a grad-norm spike, the whole batch is named. Collective."""
        import torch

        task, gate = self.plan.task, self.gate
        if not self.data.quarantines:
            return
        losses: dict[int, float | None] = {}
        if gate.reason == "nan":
            for micro, loss in zip(self.step_batches, self.step_losses, strict=False):
                per_sample = task.sample_losses(self.engine, self.plan.train_data.batch(micro), self.device)
                if per_sample is None:
                    if not bool(torch.isfinite(loss).all()):
                        losses.update(dict.fromkeys(micro))
                    continue
                for position, value in zip(micro, per_sample, strict=True):
                    if not math.isfinite(value):
                        losses[position] = None
        elif gate.reason == "loss_spike" and gate.loss_limit is not None:
            # the samples whose own loss is above the limit the step's loss crossed
            for micro in self.step_batches:
                per_sample = task.sample_losses(self.engine, self.plan.train_data.batch(micro), self.device)
                for position, value in zip(micro, per_sample or [], strict=False):
                    if not math.isfinite(value) or value > gate.loss_limit:
                        losses[position] = value if math.isfinite(value) else None
        note = ""
        if not any_rank(bool(losses), self.device):
            losses = dict.fromkeys(p for micro in self.step_batches for p in micro)
            note = {
                "nan": "the whole batch: no single sample's loss was non-finite",
                "loss_spike": "the whole batch: no single sample's loss was above the limit",
            }.get(gate.reason, "the whole batch: a grad-norm spike is not one sample's")
        losses = self._once_per_group(losses)
        records = self.data.quarantine_samples(losses, self.progress.step, self.rank, gate.reason, note)
        where = quarantine_path(self.run_dir)
        if self.rank == 0:
            append_records(where, records)
            self._announce_quarantine(where, records)
        self._pass_over(records)

    def _once_per_group(self, losses: dict[int, float | None]) -> dict[int, float | None]:
        """The ranks of a sequence- or tensor-parallel group read the same samples: the group's first rank
        names them all once (what any rank of the group found; a non-finite loss wins), the others none.
        Collective."""
        n = self.cfg.model_parallel
        if n == 1:
            return losses
        first = self.rank - self.rank % n
        merged: dict[int, float | None] = {}
        for found in gather_objects(losses)[first : first + n]:
            for position, loss in found.items():
                known = merged.get(position, loss)
                merged[position] = None if loss is None or known is None else max(loss, known)
        return merged if self.rank == first else {}

    def _announce_quarantine(self, where, records: list[dict]) -> None:
        step = self.progress.step
        named = [s for r in records for s in r["samples"]]
        documents = sorted({(s["source"], d["document"]) for s in named for d in s["documents"]})
        shown = ", ".join(f"{src} doc {doc}" for src, doc in documents[:6])
        more = f" and {len(documents) - 6} more" if len(documents) > 6 else ""
        message = (
            f"{len(named)} sample(s) quarantined in {where} ({shown}{more}); the run passes over their "
            "documents from here on"
        )
        event(self.metrics, step, "quarantine", message, samples=len(named), documents=len(documents))
        self.log(f"step {step}: {message}", always=True)

    def _pass_over(self, records: list[dict]) -> None:
        """The quarantine takes effect at once, on every rank, exactly as a resume from this step would
        apply it (the same ledger, the same records): an interrupted run and an uninterrupted one read
        the same samples."""
        step = self.progress.step
        try:
            decided = self.data.pass_over(records, step, self.progress.consumed_samples)
        except ExhaustedSource as exc:
            # nothing left to train on from that source: stop with this state (its update was skipped);
            # the reason is kept as text, since the stop's messages are built after this block has ended
            exhausted = str(exc)
            self._stop_run(
                lambda saved, _before: f"stopped at step {step}: {exhausted}; checkpoint {saved}",
                lambda saved, _before: (
                    f"{exhausted} (stopped at step {step}; the last good state is {saved})"
                ),
                save=True,
                error=InputError,
            )
        for line in decided.lines:
            self.log(line, always=decided.event is not None)
        if decided.event is not None:
            event(self.metrics, step, "data", "; ".join(decided.lines), **decided.event)

    def _stop_if_unhealthy(self) -> None:
        """Save the last good state and raise when health says stop, or after too many skipped updates."""
        gate, step = self.gate, self.progress.step
        if gate.update_spike is not None and self.cfg.health.update_spike_action == "stop":
            self._stop_run(
                lambda _saved, _before: f"stopped at step {step}: health.update_spike_action=stop",
                lambda saved, before: (
                    f"stopped at step {step}: health.update_spike_action=stop ({gate.update_spike}); that "
                    f"update was applied: {saved} holds the state after it"
                    + (f"; {before} holds the last state saved before it" if before is not None else "")
                ),
                save=True,
            )
        if not (gate.stop or gate.consecutive_skips >= self.cfg.health.max_skips):
            return
        if gate.stop:
            reason = "health.nan_action=stop" if gate.reason == "nan" else "health.spike_action=stop"
            if gate.reason == "loss_spike":
                reason += " (a loss spike)"
        else:
            reason = f"{gate.consecutive_skips} consecutive skipped steps (health.max_skips)"
        self._stop_run(
            lambda saved, _before: f"stopped at step {step}: {reason}; checkpoint {saved}",
            lambda saved, _before: (
                f"stopped at step {step}: {reason} (the update was not applied); the last good state is "
                f"saved in {saved}; fix the cause and continue with --resume {saved}"
            ),
            save=True,
        )

    # -- the one ending of every stop ----------------------------------------------------------------
    def _settle_saves(self, save: bool) -> tuple[Path | None, Path | None]:
        """The saves a stop names, settled: the background save in flight committed (or, when its write
        failed, abandoned and said), then, with ``save``, this step saved at once. Returns (this step's
        checkpoint or None, the newest complete one before it or None); the last good state is
        forgotten when it is not a complete checkpoint. Collective."""
        try:
            self.finish_background_save()
        except RuntimeFailure as failed:  # the manager removed its folder: nothing half-written names it
            self.log(f"warning: {failed}", always=True)
        before = self.last_saved if _complete(self.last_saved) else None
        if not _complete(self.good_checkpoint):
            self.good_checkpoint = None
        saved = None
        if save:
            step = self.progress.step
            if before is not None and before.name == layout.step_name(step):
                saved, before = before, None
            else:
                saved = self.save(blocking=True)
        return saved, before

    def _stop_run(self, stop_event, message, *, save: bool, error=RuntimeFailure, **fields) -> NoReturn:
        """The one ending of every stop of the health gate (and of an fp16 scale or a source that gave
        out): :meth:`_settle_saves`, then the stop event and the message, built from the checkpoints as
        they now are (``stop_event`` and ``message``: callables of (saved, before)), metrics closed,
        ``error`` raised. Collective."""
        saved, before = self._settle_saves(save)
        event(self.metrics, self.progress.step, "stop", stop_event(saved, before), **fields)
        self.metrics.close()
        raise error(message(saved, before)) from None


def _complete(folder: Path | None) -> bool:
    """Whether ``folder`` is a committed checkpoint (meta.json is written last, at the commit)."""
    return folder is not None and (folder / layout.META).is_file()
