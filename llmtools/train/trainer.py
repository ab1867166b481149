"""One training run: the engine and everything around it, with one method per job of the loop.

:class:`_Trainer` builds the engine (:mod:`~llmtools.train.engine`), takes a checkpoint's state back into
the run's parts (:mod:`~llmtools.train.state`), runs the steps (:func:`~llmtools.train.step.accumulate_and_update`),
reports (:mod:`~llmtools.train.metrics`), evaluates and saves; what a tripped health gate leads to is
:class:`~llmtools.train.health_actions.HealthActions`' job, how the data continues the data part's
(:mod:`~llmtools.train.data_part`). Imported once the run is past its checks (torch is loaded by then).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from llmtools.ckpt import layout
from llmtools.ckpt.request import ResumeRequest
from llmtools.ckpt.signals import StopRequested, resume_command
from llmtools.ckpt.verify import sha256_file
from llmtools.data.dataset import MicroBatchSampler
from llmtools.errors import InputError
from llmtools.logs.plot import PlotConfig, plot_runs
from llmtools.logs.runs import collect_curves
from llmtools.logs.trackers import TrackerState, backfill, mark_superseded, open_trackers
from llmtools.model.flops import flops_per_token
from llmtools.model.lora import trainable_parameters
from llmtools.train import checkpointing
from llmtools.train import engine as engine_setup  # by module: tests replace its functions
from llmtools.train import resume as policy
from llmtools.train.data_part import PlainData
from llmtools.train.device import kernel_context
from llmtools.train.distributed import log0
from llmtools.train.downstream import evaluate_tasks
from llmtools.train.evaluate import evaluate as evaluate_valid
from llmtools.train.evaluate import evaluate_sources
from llmtools.train.health import HealthGate, routing_collapse, wrap_step
from llmtools.train.health_actions import HealthActions
from llmtools.train.loop import RunOptions, RunResult
from llmtools.train.metrics import StepWindow, build_metrics_logger, event, peak_tflops, step_line
from llmtools.train.moe import RouterLoss, RouterMeter
from llmtools.train.norms import NormMonitor
from llmtools.train.plan import TrainPlan
from llmtools.train.rundir import write_resolved
from llmtools.train.save_clock import SaveClock
from llmtools.train.state import Progress, run_state
from llmtools.train.step import accumulate_and_update, step_means
from llmtools.train.tasks import RunContext
from llmtools.train.tensor import tensor_layout


class _Trainer(HealthActions):
    """One run: the engine and everything around it, with one method per job of the loop."""

    def __init__(self, plan: TrainPlan, options: RunOptions, dist_info, data: PlainData) -> None:
        cfg = self.cfg = plan.config
        self.plan, self.options = plan, options
        self.rank, self.world, self.device = dist_info.rank, dist_info.world_size, dist_info.device
        self.run_dir = options.run_dir
        self.engine = engine = engine_setup.build_engine(plan, engine_setup.build_model(plan), self.device)
        self.choices = engine_setup.device_choices(plan, self.device)

        self.fp16 = cfg.training.precision == "fp16"
        self.gate = HealthGate(cfg.health, self._norm_of_deepspeed, loss_scaling=self.fp16)
        # The parameter norm and the update's size, measured inside the optimizer step (train/norms.py).
        self.norms = None
        if cfg.logging.norms or cfg.health.update_spike_factor:
            self.norms = NormMonitor(engine.basic_optimizer, engine.module)
        wrap_step(engine.basic_optimizer, self.gate, self.norms)
        self.own_norm = engine.optimizer is engine.basic_optimizer  # ZeRO-0 fp32: DeepSpeed keeps no norm
        self.coalesce = engine_setup.coalesce_reductions(engine, plan.grad_accumulation, self.world)
        # MoE: the tasks call the model through RouterLoss (the router's auxiliary loss joins each
        # micro-batch's loss); its meter sums the router's statistics into the train records.
        self.router = None
        if plan.model_config.is_moe:
            self.router = RouterLoss(engine, RouterMeter(plan.model_config))

        self.manager = checkpointing.make_manager(
            self.run_dir,
            cfg.checkpoint.keep_last,
            cfg.checkpoint.keep_every,
            async_save=cfg.checkpoint.async_,
        )
        self.save_clock = SaveClock(cfg.checkpoint.save_every_minutes, self.rank, self.world, self.device)
        self.resolved: dict | None = None  # the resolved config, recorded in every checkpoint (resume())
        self.progress = Progress()
        self.last_saved: Path | None = None
        # The newest checkpoint whose weights have since passed a step the health gate checked (the last
        # good state a divergence's stop advises), and the one saved or loaded after it, not yet checked.
        self.good_checkpoint: Path | None = None
        self.unchecked_checkpoint: Path | None = None
        self.metrics = None  # opened by resume(), once a checkpoint asked for has loaded
        self.trackers = TrackerState()  # the experiment trackers' run ids (saved with each checkpoint)
        self.tensor_layout = tensor_layout(engine, self.cfg.parallel.tensor)
        self.state = run_state(
            plan, self.progress, self.gate, self.trackers, None, "", self.tensor_layout
        )  # set by resume()
        self.flops_per_token = flops_per_token(plan.model_config, plan.seq_length)
        self.peak = peak_tflops(self.device)
        self.window = StepWindow()  # the steps since the last train record
        self.clock: tuple[float, int] | None = None  # (time, step) when this process took its first step
        # The last step's figures: set by train_step, read by the reporting methods after it.
        self.loss, self.lr, self.step_time = float("nan"), cfg.optimizer.lr, 0.0
        self.step_metrics: dict[str, float] = {}
        self.step_norms: dict[str, float] = {}
        # This rank's micro-batches of the last step (sample positions) and their losses.
        self.step_batches: list[list[int]] = []
        self.step_losses: list = []
        self.data = data  # how the task's data starts, continues, is recorded and quarantined

    def log(self, message: str, always: bool = False) -> None:
        log0(message, self.rank, False if always else self.options.quiet)

    def _elapsed_and_eta(self, step: int, total: int) -> tuple[float, float | None]:
        """Seconds since this process's first step, and the rest at this process's mean pace (None before
        a second step gives one)."""
        now = time.monotonic()
        began, first = self.clock or (now, step)
        elapsed = now - began
        done = step - first
        return elapsed, (elapsed / done * (total - step) if done > 0 else None)

    def _parameters(self) -> str:
        """What the run trains: every parameter, or with LoRA the adapters of all (peft's counts)."""
        if self.cfg.lora is None:
            return f"{self.plan.model_config.num_parameters():,} parameters"
        trainable, total = trainable_parameters(self.engine.module)
        share = f"trainable% {100 * trainable / max(total, 1):.4f}"
        return f"{trainable:,} of {total:,} parameters ({share}: LoRA adapters, the base frozen)"

    def _norm_of_deepspeed(self) -> float | None:
        value = getattr(self.engine.optimizer, "_global_grad_norm", None)
        if value is None or self.engine.optimizer is self.engine.basic_optimizer:
            return None
        return float(value)

    def prepare_task(self) -> None:
        """The task's work before the first step, with the starting weights (before a checkpoint loads)."""
        run = RunContext(
            run_dir=self.run_dir,
            rank=self.rank,
            world_size=self.world,
            device=self.device,
            micro_batch_size=self.cfg.training.micro_batch_size,
            log=self.log,
            quiet=self.options.quiet,
        )
        self.plan.task.prepare(self.engine, run)

    # -- checkpoints -------------------------------------------------------------------------------
    def resume(
        self,
        chosen: checkpointing.Accepted | None,
        request: ResumeRequest | None,
        resolved: dict,
        review: checkpointing.ReviewOptions,
    ) -> None:
        """Load the checkpoint :func:`checkpointing.choose` picked (falling back to an older one when it
        fails to load, with ``--resume auto``), apply and announce the config changes the resume policy
        accepted, and continue its step count and data."""
        plan, options = self.plan, self.options
        self.resolved = resolved
        accepted, client_state = checkpointing.resume(
            self.manager, self.engine, chosen, request, resolved, review
        )
        if accepted is not None and self.rank == 0:  # accepted and loaded: the run folder now says so
            for kept in write_resolved(plan, self.run_dir, resumed_step=accepted.step):
                self.log(f"the previous config is kept as {kept}")
        where = accepted.path if accepted is not None else ""
        self.state = run_state(
            plan, self.progress, self.gate, self.trackers, resolved, where, self.tensor_layout
        )
        if accepted is not None:
            # Every part takes its state back (the tracker runs continue those the checkpoint names).
            self.state.load_state_dict(client_state)
            self.unchecked_checkpoint = accepted.path
        # Only now: a --resume that fails leaves no metrics.jsonl, so the folder does not look like a run.
        reporters = self.cfg.logging.reporters()
        trackers = self._open_trackers(reporters)
        if trackers and accepted is not None:
            backfill(trackers, self.run_dir / "metrics.jsonl", self.progress.step)
        mark_superseded(trackers, self.progress.step)
        self.metrics = build_metrics_logger(
            self.run_dir,
            self.rank,
            tensorboard=options.tensorboard or "tensorboard" in reporters,
            trackers=trackers,
            from_step=accepted.step if accepted is not None else -1,  # the history as the run now stands
        )
        if accepted is None:
            self.data.start()
            event(
                self.metrics,
                0,
                "start",
                f"{self._parameters()}, {self.world} rank(s), "
                f"ZeRO-{plan.zero_stage}, {self.cfg.training.precision}",
            )
            return
        consumed = self.progress.consumed_samples
        if options.reset_data:
            # from here on the position in the new data (the sampler's and the ledger's), from 0
            self.progress.consumed_samples = 0
            self.log(
                f"--reset-data: step {self.progress.step} and the schedule continue; "
                "the data starts from its beginning"
            )
        path, step = accepted.path, self.progress.step
        self.log(f"resumed from {path} at step {step} ({consumed} samples consumed)")
        if step >= plan.steps:  # a requeue after the end (a changed train_steps is refused before this)
            self.log(
                f"nothing to train: step {step} is the last of this config's {plan.steps} steps", always=True
            )
        event(self.metrics, step, "resume", f"resumed from {path}")
        notes = policy.apply(self.engine, accepted.changes, self.cfg)
        for change in accepted.changes:
            self.log(f"resume: {change.describe()}", always=True)
            event(self.metrics, step, "config_change", change.describe(), key=change.key, old=change.old,
                   new=change.new)  # fmt: skip
        for note in notes:
            self.log(f"resume: {note}", always=True)
        decided = self.data.resume(Path(path))
        if decided is not None:
            for line in decided.lines:
                self.log(line, always=decided.event is not None)
            if decided.event is not None:
                event(self.metrics, step, "data", "; ".join(decided.lines), **decided.event)

    def _open_trackers(self, reporters: list[str]) -> list:
        """Rank 0's W&B and MLflow runs (continued from the ids in ``self.trackers``)."""
        if self.rank != 0 or not any(name in reporters for name in ("wandb", "mlflow")):
            return []
        logging = self.cfg.logging
        return open_trackers(
            reporters,
            self.run_dir,
            logging.project,
            self.run_dir.resolve().name,
            self.trackers,
            self.resolved,
            lambda message: self.log(message, always=True),
            tracking_uri=logging.tracking_uri,
        )

    def _finish_trackers(self) -> None:
        """The end of a run, for the trackers: the curves picture and the final checkpoint's path and hash
        (the sha256 of its meta.json, which lists every file's sha256)."""
        if self.rank != 0 or not self.metrics.trackers:
            return
        summary = {}
        if self.last_saved is not None and (self.last_saved / "meta.json").is_file():
            summary["checkpoint/path"] = str(self.last_saved.resolve())
            summary["checkpoint/sha256"] = sha256_file(self.last_saved / "meta.json")
        self.metrics.finish(summary, self._curves_picture())

    def _curves_picture(self) -> Path | None:
        """RUN/curves.png drawn from metrics.jsonl (``llm-log plot``); None without matplotlib."""
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            return None
        picture = self.run_dir / "curves.png"
        try:
            runs, _ = collect_curves([str(self.run_dir / "metrics.jsonl")], names=[self.run_dir.name])
            plot_runs(runs, PlotConfig(output=picture, force=True))
        except (InputError, OSError) as error:
            self.log(f"warning: no curves picture for the trackers: {error}", always=True)
            return None
        return picture

    def save(self, blocking: bool | None = None) -> Path:
        """Save this step (in the background with ``checkpoint.async`` unless ``blocking``)."""

        self.finish_background_save()  # at most one in flight: the previous one commits first
        step = self.progress.step
        self.last_saved = checkpointing.save(self.manager, self.engine, step, self.state, blocking=blocking)
        self.save_clock.restart()
        self.unchecked_checkpoint = self.last_saved
        if self.manager.in_flight == self.last_saved:
            self.log(f"checkpoint {self.last_saved}: writing in the background")
        else:
            self._committed(self.last_saved)
        return self.last_saved

    def poll_background_save(self) -> None:
        """Commit the background save once every rank has written it (one tiny all-reduce per step)."""
        if self.manager.in_flight is not None and (done := self.manager.poll()) is not None:
            self._committed(done)

    def finish_background_save(self) -> None:
        if self.manager.in_flight is not None:
            self._committed(self.manager.wait())

    def _committed(self, folder: Path) -> None:
        event(self.metrics, layout.parse_step(folder.name), "checkpoint", str(folder))
        self.log(f"checkpoint {folder}")

    def _checkpoint_due(self) -> bool:
        step, c = self.progress.step, self.cfg.checkpoint
        by_steps = bool(c.save_every and step % c.save_every == 0)
        # the clock last: its answer is rank 0's on every rank (a collective when the others are not due)
        return by_steps or (step == self.plan.steps and c.save_final) or self.save_clock.due()

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> RunResult:
        plan, cfg = self.plan, self.cfg
        micro, gbs = cfg.training.micro_batch_size, cfg.training.global_batch_size
        sampler = MicroBatchSampler(
            plan.steps * gbs,
            micro,
            gbs,
            *self.data_rank(),
            consumed_samples=self.progress.consumed_samples,
        )
        batches = self._recorded(iter(sampler))
        self.log(
            f"training {self._parameters()} for {plan.steps} steps "
            f"({plan.tokens_per_step:,} tokens/step, {self.world} rank(s) x {plan.grad_accumulation} "
            f"micro-batch(es) of {micro}, ZeRO-{plan.zero_stage}, {cfg.training.precision}) -> {self.run_dir}"
        )
        result = RunResult(
            run_dir=self.run_dir, steps=self.progress.step, final_loss=None, first_loss=None, checkpoint=None
        )
        self.engine.train()
        # SIGTERM/SIGINT (a scheduler's preemption, Ctrl-C) finish the current step, save, and return.
        stop = StopRequested(announce=self.rank == 0).install()
        self.save_clock.restart()  # minutes of training: from the first step on
        try:
            for step in range(self.progress.step + 1, plan.steps + 1):
                loss, grad_norm = self.train_step(batches)
                result.steps = step
                result.losses.append(loss)
                if result.first_loss is None:
                    result.first_loss = loss
                result.final_loss = loss
                if self.options.on_step is not None:
                    self.options.on_step(step, loss)
                self._report_health(grad_norm)
                self._note_good_state()
                # An fp16 overflow is the loss scaler's routine, not the data's fault: nothing to quarantine.
                if self.gate.reason not in (None, "overflow"):
                    self._stop_unless_the_data_is_the_cause()
                    self._quarantine()
                self._log_window(grad_norm)
                self._stop_if_unhealthy()
                if (
                    plan.valid_data is not None
                    and cfg.eval.every
                    and (step % cfg.eval.every == 0 or step == plan.steps)
                ):
                    result.eval_loss = self.evaluate()
                if self._checkpoint_due():
                    self.save()
                else:
                    self.poll_background_save()
                # Every rank must agree to stop (one all-reduce): a rank whose peer is gone fails here,
                # before any collective save is attempted, and is reported as a lost peer.
                if stop.should_stop():
                    result.stop_hint = self._stop_on_signal(stop, resume_command())
                    result.stopped = stop.signal_name
                    break
        except Exception:
            self._abandon_background_save()
            raise
        finally:
            stop.restore()
        self.finish_background_save()
        result.checkpoint = self.last_saved
        self._finish_trackers()
        self.metrics.close()
        return result

    def data_rank(self) -> tuple[int, int]:
        """(data-parallel rank, replicas): the ranks of a sequence- or tensor-parallel group (consecutive
        ranks, as DeepSpeed groups them) read the same samples."""
        n = self.cfg.model_parallel
        return self.rank // n, self.world // n

    def _recorded(self, batches):
        """The sampler's micro-batches, the current step's kept (what a quarantine names)."""
        for micro in batches:
            self.step_batches.append(micro)
            yield micro

    def train_step(self, batches) -> tuple[float, float | None]:
        """One optimizer step; the step's loss (the global batch's) and grad norm."""
        import torch

        plan, engine, gate = self.plan, self.engine, self.gate
        started = time.perf_counter()
        gate.reset()
        self.step_batches = []
        self.lr = engine.get_lr()[0] if engine.get_lr() else self.cfg.optimizer.lr
        if self.norms is not None and self._measures_norms(self.progress.step + 1):
            self.norms.begin()
        try:
            with self.kernels():
                losses, metrics = accumulate_and_update(
                    engine, plan, batches, gate, self.coalesce, self.own_norm, self.router
                )
        except Exception as error:
            self._stop_if_scale_collapsed(error)
            raise
        self.step_losses = losses
        loss, self.step_metrics = step_means(losses, metrics, plan.task.metric_names, engine.device)
        self.step_norms = (self.norms.finish(engine.device) or {}) if self.norms is not None else {}
        if "update_ratio" in self.step_norms:
            gate.check_update(self.step_norms["update_ratio"], self.lr)
        self.progress.step += 1
        self.progress.consumed_samples += self.cfg.training.global_batch_size
        self.progress.consumed_tokens += plan.tokens_per_step
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        self.step_time = time.perf_counter() - started
        self.loss = loss
        return loss, gate.norm

    def kernels(self):
        """The device's attention kernels and autocast (:mod:`~llmtools.train.device`) around a pass."""
        return kernel_context(self.choices, self.device, warn=lambda m: self.log(m, always=True))

    def _measures_norms(self, step: int) -> bool:
        """Norms on log steps; on every step when the update ratio is a health signal."""
        log_every = self.cfg.logging.log_every
        return bool(self.cfg.health.update_spike_factor) or (
            self.cfg.logging.norms and (step % log_every == 0 or step == self.plan.steps)
        )

    def _log_window(self, grad_norm: float | None) -> None:
        """Add the step to the window; every ``log_every`` steps (and on the last or an unhealthy one), a
        train record in metrics.jsonl and a line on stderr."""
        step, plan = self.progress.step, self.plan
        self.window.add(
            self.loss,
            self.step_time,
            plan.tokens_per_step,
            self.gate.skip,
            self.step_metrics,
            overflow=self.gate.reason == "overflow",
        )
        if self.clock is None:  # this process's first step: its own time counts
            self.clock = (time.monotonic() - self.step_time, step - 1)
        if step % self.cfg.logging.log_every and step != plan.steps and not self.gate.reason:
            return
        record = self.window.record(
            step,
            consumed_samples=self.progress.consumed_samples,
            consumed_tokens=self.progress.consumed_tokens,
            grad_norm=grad_norm,
            lr=self.lr,
            device=self.device,
            flops_per_token=self.flops_per_token,
            peak_tflops=self.peak,
            world=self.world,
        )
        collapse = None
        if self.router is not None:
            record.update(self.router.meter.record(self.device))  # every rank: one all-reduce
            collapse = routing_collapse(record["moe_layers"], self.cfg.health)
        record.update(self.step_norms)  # params_norm, update_norm, update_ratio (measured steps)
        if self.fp16:
            record["loss_scale"] = self.loss_scale()
        record.update(self.data.record(self.progress.consumed_samples))
        self.metrics.log(record, step)
        times = self._elapsed_and_eta(step, plan.steps)
        self.log(step_line(record, plan.steps, *times, plan.task.line_metrics))
        self.window = StepWindow()
        if collapse is not None:
            self._report_collapse(collapse)

    def evaluate(self) -> float:
        """Evaluate on the valid split; an eval record and a stderr line. Returns the eval loss."""
        plan, step = self.plan, self.progress.step
        rank, replicas = self.data_rank()
        with self.kernels():
            # the ranks that score distinct tokens: a tensor-parallel group scores its rows once
            scorers = self.world // self.cfg.parallel.tensor
            eval_loss, task_metrics = evaluate_valid(self.engine, plan, rank, replicas, ranks=scorers)
            if plan.config.eval.per_source:
                task_metrics.update(evaluate_sources(self.engine, plan, rank, replicas))
            if plan.eval_tasks:
                self.engine.eval()
                task_metrics.update(
                    evaluate_tasks(
                        self.engine, plan.eval_tasks, self.engine.device, rank, replicas,
                        self.cfg.training.micro_batch_size,
                    )
                )  # fmt: skip
                self.engine.train()
        ppl = math.exp(min(eval_loss, 700.0))
        record = {
            "kind": "eval",
            "step": step,
            "time": time.time(),
            "consumed_tokens": self.progress.consumed_tokens,
            "eval_loss": eval_loss,
            "eval_ppl": ppl,
            **task_metrics,
        }
        self.metrics.log(record, step)
        extra = "".join(
            f" | {label} {record[key]:.4f}"
            for key, label in (("eval_accuracy", "accuracy"), ("eval_bpb", "bits/byte"))
            if key in record
        )
        extra += "".join(
            f" | {task.name} {name} {record[f'{task.name}/{name}']:.4f}"
            for task in plan.eval_tasks
            for name in (("acc", "acc_norm") if task.kind == "multiple_choice" else ("loss", "bpb"))
        )
        self.log(f"step {step:>6}/{plan.steps} | eval loss {eval_loss:.4f} | eval ppl {ppl:.2f}{extra}")
        return eval_loss

    def _stop_on_signal(self, stop, command: str) -> str:
        """A signal asked to stop: the one ending of a stop (:meth:`_settle_saves`) with this step saved;
        returns how to resume (the command prints it last)."""
        step = self.progress.step
        saved, _ = self._settle_saves(save=True)
        event(self.metrics, step, "stop", f"stopped by {stop.signal_name} at step {step}; checkpoint {saved}")
        return stop.resume_hint(command, str(saved))

    def _abandon_background_save(self) -> None:
        """An error ends the run: the background save in flight is left uncommitted (committing is
        collective, and a peer may be gone); this rank's write is waited for, and rank 0 removes its
        folder, so no half-written checkpoint stays behind."""
        folder = self.manager.abandon()
        if folder is not None:
            self.log(f"warning: the checkpoint {folder.name}, still being written, was abandoned", always=True)
