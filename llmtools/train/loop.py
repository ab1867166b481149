"""The training loop: a DeepSpeed engine over the LLaMA model, fed and scored by the run's task.

``train(config, ds_config, run_dir)`` is the library entry point (``llm-train`` is a thin adapter):

1. plan (before any compute, :mod:`~llmtools.train.plan`): model shape, the task's data, lengths,
   DeepSpeed config -> errors name file and key; the run folder (:mod:`~llmtools.train.rundir`);
2. process group (one process, or a launcher's), model (seeded), AdamW with no decay on norms/biases,
   the LR schedule, ``deepspeed.initialize`` (:mod:`~llmtools.train.engine`);
3. per step (:func:`accumulate_and_update`): ``grad_accumulation`` micro-batches per rank (forward and
   the task's loss, :mod:`~llmtools.train.tasks`; backward), then the update; health checks gate the
   update (:mod:`~llmtools.train.health`); a metrics record and a stderr line every ``log_every`` steps
   (:mod:`~llmtools.train.metrics`); eval every ``eval.every``; a checkpoint every ``save_every``.

A task whose data keeps a ledger (pretraining: one cursor per source, :mod:`llmtools.data.ledger`) gets
it recorded in every checkpoint and its tokens per source in every train record; on resume the task
picks its data up from the checkpoint's ledger (continuing a changed mix, or refusing one it cannot
continue, before any compute); and when the health gate trips, the offending samples are appended to
``RUN/quarantine.jsonl``, and the run passes over their documents from there on (as a resume would).

Only rank 0 writes the run folder's logs. The loss reported for a step is the mean of the micro-batch
losses over all ranks, i.e. the loss of the global batch.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from llmtools.ckpt import layout
from llmtools.ckpt.request import ResumeRequest
from llmtools.errors import InputError, RuntimeFailure
from llmtools.train import checkpointing
from llmtools.train.config import TrainConfig
from llmtools.train.deepspeed_config import prefer_torch_adam
from llmtools.train.distributed import all_mean, any_rank, log0
from llmtools.train.health import HealthGate, routing_collapse, wrap_step
from llmtools.train.plan import TrainPlan, check_data_length, make_plan
from llmtools.train.rundir import (
    clear_run_dir,
    locked_run_dir,
    prepare_run_dir,
    resolved_config,
    write_resolved,
)
from llmtools.train.state import Progress, data_fingerprint, run_state


@dataclass
class RunOptions:
    run_dir: Path
    ds_source: str = "<deepspeed config>"
    tensorboard: bool = False
    resume: str | None = None
    force: bool = False
    quiet: bool = False
    on_step: Callable[[int, float], None] | None = None
    """Called on every rank after each step with (step, loss); for benchmarks and embedding programs."""
    reset_data: bool = False
    """Resume on changed data: keep the step count and schedule, start the data from its beginning."""
    reshard: bool = False
    """With --resume: allow another ZeRO stage (1 <-> 2) through a DeepSpeed universal checkpoint."""
    rollback: bool = False
    """Resume from a checkpoint older than the run's newest: move the newer ones aside first."""


@dataclass
class RunResult:
    run_dir: Path
    steps: int
    final_loss: float | None
    first_loss: float | None
    checkpoint: Path | None
    losses: list[float] = field(default_factory=list)
    eval_loss: float | None = None
    stopped: str | None = None


def _resume_data(plan: TrainPlan, options: RunOptions, path: Path, meta: dict):
    """The task's decision on continuing its data from checkpoint ``path`` (whose meta.json is ``meta``)."""
    from llmtools.formats.quarantine import quarantine_path, read_records

    data = meta.get("data") if isinstance(meta.get("data"), dict) else {}
    saved = data.get("ledger")
    consumed = meta.get("consumed_samples") or 0
    if not isinstance(consumed, int) or consumed < 0:
        raise InputError(f"{path}/meta.json[consumed_samples]: expected an integer >= 0")
    run = saved.get("run") if isinstance(saved, dict) and isinstance(saved.get("run"), str) else None
    records = read_records(quarantine_path(options.run_dir), run, whose=f"the checkpoint {path.name}")
    if saved is None and not options.reset_data:
        # Saved before checkpoints kept a ledger: no cursors, so only the same data can continue.
        current, before = data_fingerprint(plan), data.get("fingerprint")
        if before is not None and before != current:
            raise InputError(
                f"{path}/meta.json[data]: the checkpoint was trained on data {before}, the config "
                f"now has {current}, and it keeps no per-source cursors (it was saved by an older "
                "llmtools); pass --reset-data to continue the step count and schedule on the new data "
                "from its beginning"
            )
    return plan.task.resume_data(
        saved,
        consumed,
        reset=options.reset_data,
        quarantine=records,
        where=f"{path}/meta.json[data.ledger]",
    )


def _steps_done(options: RunOptions, meta: dict) -> int | None:
    """With --reset-data, the steps the checkpoint trained (the data restarts for the steps left)."""
    step = meta.get("step")
    if not options.reset_data or not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return None
    return step


def precheck_data(plan: TrainPlan, options: RunOptions, request: ResumeRequest | None) -> None:
    """Before torch: how a resumed run's data continues (a mix it cannot continue, a quarantine file of
    another run, data too short for the steps: exit 2 in about a second), and the data's length."""
    from llmtools.ckpt.verify import read_meta
    from llmtools.formats.quarantine import quarantine_path, read_records

    ledger = plan.task.ledger()
    ckpt_dir = layout.checkpoints_dir(options.run_dir)
    path = request.likely_checkpoint(ckpt_dir) if request is not None else None
    meta = None
    if path is not None:
        try:
            meta = read_meta(path)
        except InputError:
            meta = None  # the manager names what is wrong with it when it resolves --resume
    if meta is None or meta.get("init_only"):
        if ledger is not None and not options.force:  # --force: rank 0 has removed (or removes) the file
            where = quarantine_path(options.run_dir)
            if read_records(where, None):
                raise InputError(
                    f"{where}: holds quarantine records, but this run starts afresh: a quarantine file "
                    "of another run (--force starts over and removes it)"
                )
        if request is not None:
            check_data_length(plan.config, plan.train_data, plan.steps)
        return
    if ledger is not None:
        decided = _resume_data(plan, options, path, meta)
        plan.data_resume = (Path(path), decided)
        plan.train_data = decided.data
    check_data_length(plan.config, plan.train_data, plan.steps, done=_steps_done(options, meta))


def train(config: TrainConfig, ds_raw: dict, options: RunOptions) -> RunResult:
    """Run training as the library entry point (call on every rank)."""
    from llmtools.train.distributed import detect_environment, init_distributed

    detect_environment()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    # --resume, parsed once: every step below takes this request.
    request = ResumeRequest.parse(options.resume, rollback=options.rollback, reshard=options.reshard)
    # Every check before any compute, before torch is even imported (a bad config fails in about a second)
    # and before the process group exists (so it fails on every rank alike).
    plan = make_plan(
        config,
        ds_raw,
        world_size=world,
        cpu=False,
        ds_source=options.ds_source,
        check_length=request is None,
    )
    from llmtools.logs.trackers import check_available

    # A tracker whose library is missing: refused before anything is written.
    check_available(config.logging.reporters(), f"{config.source or '<train config>'}: logging.report_to")
    # A device without fp16 arithmetic: refused before anything is written.
    if config.training.precision == "fp16":
        from llmtools.train.engine import check_fp16_support

        check_fp16_support(config.source or "<train config>")
    prepare_run_dir(options.run_dir, request, options.force, rank)
    # The resume policy's verdict, before torch loads: a refused config change exits in about a second.
    checkpointing.precheck(options.run_dir, request, resolved_config(plan), _review_options(plan, options))
    # How the data continues (the task's data ledger), also before torch.
    precheck_data(plan, options, request)
    import torch

    if not torch.cuda.is_available():
        prefer_torch_adam(plan.ds_config)
    # The process group outlives the run (DeepSpeed keeps its own handle on it); the CLI tears it down.
    from llmtools.train.peers import PeerWatch

    watch = PeerWatch(config.distributed.timeout_s)
    with watch:  # a rank that is gone is reported as such (one line, exit 1), never as an internal error
        dist_info = init_distributed(config.distributed.timeout_s)
        watch.gather()
        # One writer per run folder: rank 0 holds RUN/run.lock from before anything is written until the end.
        with locked_run_dir(options.run_dir, dist_info.rank):
            return _train(plan, options, request, dist_info, watch)


def _review_options(plan: TrainPlan, options: RunOptions) -> checkpointing.ReviewOptions:
    """What the resume policy needs to know besides the two configs and the request."""
    return checkpointing.ReviewOptions(
        reset_data=options.reset_data,
        own_scheduler="scheduler" in plan.ds_config,
        data_ledger=plan.task.ledger() is not None,
    )


def _quiet_deepspeed() -> None:
    import logging
    import warnings

    # DeepSpeed's ZeRO calls torch.distributed APIs that torch 2.13 deprecates, once per bucket per step.
    warnings.filterwarnings("ignore", category=FutureWarning, message=r".*torch\.distributed\.")

    level = logging.INFO if os.environ.get("LLMTOOLS_DEBUG") else logging.WARNING
    try:
        from llmtools.thirdparty import import_deepspeed

        import_deepspeed()
        from deepspeed.utils import logger

        logger.setLevel(level)
        # DeepSpeed logs to stdout; stdout is for results (paths, JSON), so its messages go to stderr.
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and getattr(handler, "stream", None) is sys.stdout:
                handler.setStream(sys.stderr)
    except ImportError:
        pass


def _event(metrics, step: int, event: str, message: str, **extra) -> None:
    metrics.log(
        {"kind": "event", "step": step, "time": time.time(), "event": event, "message": message, **extra},
        step,
    )


def accumulate_and_update(
    engine, plan: TrainPlan, batches, gate: HealthGate, coalesce: bool, own_norm: bool, router=None
):
    """One optimizer step: every micro-batch's forward and backward, the health checks, the update.

    ``router`` (a MoE model's :class:`~llmtools.train.moe.RouterLoss`) is the model the task calls: the
    router's auxiliary loss of that forward joins the micro-batch's loss before backward (the task's
    loss alone is what is reported). Returns the micro-batch losses and the task's metrics per
    micro-batch (detached)."""
    import torch

    gas = plan.grad_accumulation
    model = engine if router is None else router
    losses, metrics = [], []
    if coalesce:  # DeepSpeed's documented manual boundary: not one until all micro-batches are in
        engine.set_gradient_accumulation_boundary(False)
    with engine.coalesce_grad_reduction() if coalesce else contextlib.nullcontext():
        for m in range(gas):
            indices = next(batches)
            batch = plan.train_data.batch(indices)
            if hasattr(plan.train_data, "check_ids"):
                plan.train_data.check_ids(batch, indices)
            out = plan.task.loss(model, batch, engine.device)
            losses.append(out.loss.detach())
            metrics.append({name: value.detach() for name, value in out.metrics.items()})
            aux = router.take_aux() if router is not None else None
            engine.backward(out.loss if aux is None else out.loss + aux)
            if m < gas - 1 and not coalesce:
                engine.step()  # DeepSpeed counts micro-steps; the update waits for the boundary
    # the accumulation boundary: health checks, then the update
    local = torch.stack(losses).float()
    gate.loss_bad = any_rank(not bool(torch.isfinite(local).all()), engine.device)
    if gate.health.loss_spike_factor > 0 and not gate.loss_bad:
        from llmtools.train.distributed import mean_over_ranks

        gate.loss = mean_over_ranks(float(local.mean()), engine.device)  # one verdict on every rank
    if own_norm:
        from llmtools.train.engine import grad_norm_of

        gate.precomputed_norm = grad_norm_of(engine.module)
    if coalesce:
        engine.set_gradient_accumulation_boundary(True)
    engine.step()
    if not gate.decided:  # the optimizer was not reached (DeepSpeed skipped an overflowing step itself)
        gate.overflowed()
    return losses, metrics


def step_means(
    losses: list, metrics: list[dict], names: tuple[str, ...], device
) -> tuple[float, dict[str, float]]:
    """The step's loss and task metrics: means over the micro-batches, then over all ranks (one reduction)."""
    import torch

    local = [float(torch.stack(losses).float().mean())]
    local += [float(torch.stack([m[name] for m in metrics]).float().mean()) for name in names]
    means = all_mean(local, device)
    return means[0], dict(zip(names, means[1:], strict=True))


class _Trainer:
    """One run: the engine and everything around it, with one method per job of the loop."""

    def __init__(self, plan: TrainPlan, options: RunOptions, dist_info) -> None:
        from llmtools.model.flops import flops_per_token
        from llmtools.train.engine import build_engine, build_model, coalesce_reductions, device_choices
        from llmtools.train.metrics import StepWindow, peak_tflops

        cfg = self.cfg = plan.config
        self.plan, self.options = plan, options
        self.rank, self.world, self.device = dist_info.rank, dist_info.world_size, dist_info.device
        self.run_dir = options.run_dir
        self.engine = engine = build_engine(plan, build_model(plan), self.device)
        self.choices = device_choices(plan, self.device)

        self.fp16 = cfg.training.precision == "fp16"
        self.gate = HealthGate(cfg.health, self._norm_of_deepspeed, loss_scaling=self.fp16)
        # The parameter norm and the update's size, measured inside the optimizer step (train/norms.py).
        self.norms = None
        if cfg.logging.norms or cfg.health.update_spike_factor:
            from llmtools.train.norms import NormMonitor

            self.norms = NormMonitor(engine.basic_optimizer, engine.module)
        wrap_step(engine.basic_optimizer, self.gate, self.norms)
        self.own_norm = engine.optimizer is engine.basic_optimizer  # ZeRO-0 fp32: DeepSpeed keeps no norm
        self.coalesce = coalesce_reductions(engine, plan.grad_accumulation, self.world)
        # MoE: the tasks call the model through RouterLoss (the router's auxiliary loss joins each
        # micro-batch's loss); its meter sums the router's statistics into the train records.
        self.router = None
        if plan.model_config.is_moe:
            from llmtools.train.moe import RouterLoss, RouterMeter

            self.router = RouterLoss(engine, RouterMeter(plan.model_config))

        self.manager = checkpointing.make_manager(
            self.run_dir,
            cfg.checkpoint.keep_last,
            cfg.checkpoint.keep_every,
            async_save=cfg.checkpoint.async_,
        )
        self.resolved: dict | None = None  # the resolved config, recorded in every checkpoint (resume())
        self.progress = Progress()
        self.last_saved: Path | None = None
        self.metrics = None  # opened by resume(), once a checkpoint asked for has loaded
        from llmtools.logs.trackers import TrackerState

        self.trackers = TrackerState()  # the experiment trackers' run ids (saved with each checkpoint)
        self.state = run_state(plan, self.progress, self.gate, self.trackers, None)  # set by resume()
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
        # This run's quarantine records (those of the checkpoint resumed from, and every one since).
        self.quarantine_records: list[dict] = []

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

    def _norm_of_deepspeed(self) -> float | None:
        value = getattr(self.engine.optimizer, "_global_grad_norm", None)
        if value is None or self.engine.optimizer is self.engine.basic_optimizer:
            return None
        return float(value)

    def prepare_task(self) -> None:
        """The task's work before the first step, with the starting weights (before a checkpoint loads)."""
        from llmtools.train.tasks import RunContext

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
        from llmtools.train import resume as policy
        from llmtools.train.metrics import build_metrics_logger

        plan, options = self.plan, self.options
        self.resolved = resolved
        accepted, client_state = checkpointing.resume(
            self.manager, self.engine, chosen, request, resolved, review
        )
        if accepted is not None and self.rank == 0:  # accepted and loaded: the run folder now says so
            for kept in write_resolved(plan, self.run_dir, resumed_step=accepted.step):
                self.log(f"the previous config is kept as {kept}")
        where = accepted.path if accepted is not None else ""
        self.state = run_state(plan, self.progress, self.gate, self.trackers, resolved, where)
        if accepted is not None:
            # Every part takes its state back (the tracker runs continue those the checkpoint names).
            self.state.load_state_dict(client_state)
        # Only now: a --resume that fails leaves no metrics.jsonl, so the folder does not look like a run.
        reporters = self.cfg.logging.reporters()
        trackers = self._open_trackers(reporters)
        if trackers and accepted is not None:
            from llmtools.logs.trackers import backfill

            backfill(trackers, self.run_dir / "metrics.jsonl", self.progress.step)
        self.metrics = build_metrics_logger(
            self.run_dir,
            self.rank,
            tensorboard=options.tensorboard or "tensorboard" in reporters,
            trackers=trackers,
        )
        ledger = plan.task.ledger()
        if accepted is None:
            if ledger is not None:
                self._name_run(ledger)
            _event(
                self.metrics,
                0,
                "start",
                f"{plan.model_config.num_parameters():,} parameters, {self.world} rank(s), "
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
        _event(self.metrics, step, "resume", f"resumed from {path}")
        notes = policy.apply(self.engine, accepted.changes, self.cfg)
        for change in accepted.changes:
            self.log(f"resume: {change.describe()}", always=True)
            _event(self.metrics, step, "config_change", change.describe(), key=change.key, old=change.old,
                   new=change.new)  # fmt: skip
        for note in notes:
            self.log(f"resume: {note}", always=True)
        if ledger is not None:
            self._continue_data(Path(path))

    def _open_trackers(self, reporters: list[str]) -> list:
        """Rank 0's W&B and MLflow runs (continued from the ids in ``self.trackers``)."""
        if self.rank != 0 or not any(name in reporters for name in ("wandb", "mlflow")):
            return []
        from llmtools.logs.trackers import open_trackers

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
        from llmtools.ckpt.verify import sha256_file

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
        from llmtools.logs.plot import PlotConfig, plot_runs
        from llmtools.logs.runs import collect_curves

        picture = self.run_dir / "curves.png"
        try:
            runs, _ = collect_curves([str(self.run_dir / "metrics.jsonl")], names=[self.run_dir.name])
            plot_runs(runs, PlotConfig(output=picture, force=True))
        except (InputError, OSError) as error:
            self.log(f"warning: no curves picture for the trackers: {error}", always=True)
            return None
        return picture

    def _name_run(self, ledger) -> None:
        """A run's id, the same on every rank (kept in its data ledger and its quarantine records)."""
        import uuid

        from llmtools.ckpt import dist

        if ledger.run is None:
            ledger.run = dist.broadcast(uuid.uuid4().hex if self.rank == 0 else None)

    def _continue_data(self, path: Path) -> None:
        """The task's data from the checkpoint's ledger (decided before compute when it is the checkpoint
        the precheck read), announced on stderr and as a ``data`` event."""
        from llmtools.ckpt.verify import read_meta
        from llmtools.formats.quarantine import quarantine_path, read_records

        plan = self.plan
        if plan.data_resume is not None and plan.data_resume[0] == path:
            decided = plan.data_resume[1]
        else:
            meta = read_meta(path)
            decided = _resume_data(plan, self.options, path, meta)
            check_data_length(self.cfg, decided.data, plan.steps, done=_steps_done(self.options, meta))
        plan.train_data = decided.data
        self._name_run(decided.data)
        self.quarantine_records = read_records(quarantine_path(self.run_dir), decided.data.run)
        for line in decided.lines:
            self.log(line, always=decided.event is not None)
        if decided.event is not None:
            _event(self.metrics, self.progress.step, "data", "; ".join(decided.lines), **decided.event)

    def save(self, blocking: bool | None = None) -> Path:
        """Save this step (in the background with ``checkpoint.async`` unless ``blocking``)."""

        self.finish_background_save()  # at most one in flight: the previous one commits first
        step = self.progress.step
        self.last_saved = checkpointing.save(self.manager, self.engine, step, self.state, blocking=blocking)
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
        from llmtools.ckpt import layout

        _event(self.metrics, layout.parse_step(folder.name), "checkpoint", str(folder))
        self.log(f"checkpoint {folder}")

    def _checkpoint_due(self) -> bool:
        step, c = self.progress.step, self.cfg.checkpoint
        return bool(c.save_every and step % c.save_every == 0) or (step == self.plan.steps and c.save_final)

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> RunResult:
        from llmtools.ckpt.signals import StopRequested, resume_command
        from llmtools.data.dataset import MicroBatchSampler

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
            f"training {plan.model_config.num_parameters():,} parameters for {plan.steps} steps "
            f"({plan.tokens_per_step:,} tokens/step, {self.world} rank(s) x {plan.grad_accumulation} "
            f"micro-batch(es) of {micro}, ZeRO-{plan.zero_stage}, {cfg.training.precision}) -> {self.run_dir}"
        )
        result = RunResult(
            run_dir=self.run_dir, steps=self.progress.step, final_loss=None, first_loss=None, checkpoint=None
        )
        self.engine.train()
        # SIGTERM/SIGINT (a scheduler's preemption, Ctrl-C) finish the current step, save, and return.
        stop = StopRequested(announce=self.rank == 0).install()
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
                    self._stop_on_signal(stop, resume_command())
                    result.stopped = stop.signal_name
                    break
        finally:
            stop.restore()
        self.finish_background_save()
        result.checkpoint = self.last_saved
        self._finish_trackers()
        self.metrics.close()
        return result

    def data_rank(self) -> tuple[int, int]:
        """(data-parallel rank, replicas): the ranks of a sequence-parallel group read the same samples."""
        n = self.cfg.parallel.sequence
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
        from llmtools.train.device import kernel_context

        return kernel_context(self.choices, self.device, warn=lambda m: self.log(m, always=True))

    def _measures_norms(self, step: int) -> bool:
        """Norms on log steps; on every step when the update ratio is a health signal."""
        log_every = self.cfg.logging.log_every
        return bool(self.cfg.health.update_spike_factor) or (
            self.cfg.logging.norms and (step % log_every == 0 or step == self.plan.steps)
        )

    def loss_scale(self) -> float | None:
        """fp16: the loss scale DeepSpeed's scaler uses now."""
        scale = getattr(self.engine.optimizer, "loss_scale", None) if self.fp16 else None
        return None if scale is None else float(scale)

    def _stop_if_scale_collapsed(self, error: Exception) -> None:
        """DeepSpeed raises when gradients overflow at the minimum loss scale: stop with the last good state
        (that step was not applied) and say what to change. Any other failure is left to propagate."""
        scale, floor = self.loss_scale(), self.cfg.fp16.min_loss_scale
        if scale is None or scale > floor or self.cfg.fp16.loss_scale or "scale" not in str(error).lower():
            return
        step = self.progress.step
        saved = self.save()
        reason = (
            f"the fp16 loss scale fell to its minimum {scale:g} (fp16.min_loss_scale) and the gradients of step "
            f"{step + 1} still overflow"
        )
        _event(self.metrics, step, "stop", f"stopped at step {step}: {reason}; checkpoint {saved}")
        self.metrics.close()
        raise RuntimeFailure(
            f"stopped at step {step}: {reason}; the last good state is saved in {saved}; values exceed "
            "fp16's range: train in bf16 (training.precision=bf16) or fp32, or lower optimizer.lr, then "
            f"continue with --resume {saved}"
        ) from None

    def _report_health(self, grad_norm: float | None) -> None:
        """An event and a stderr line for a NaN/inf, a spike or an fp16 overflow, and the count of
        consecutive skips (fp16 overflows are the loss scaler's business and do not count)."""
        gate, health, step = self.gate, self.cfg.health, self.progress.step
        if gate.update_spike is not None:
            action = "stopping" if health.update_spike_action == "stop" else "continuing"
            _event(self.metrics, step, "spike", f"{gate.update_spike}; {action}")
            self.log(f"step {step}: {gate.update_spike}; {action}", always=True)
        if gate.reason == "overflow":
            message = f"fp16 gradients overflowed: update skipped; loss scale now {self.loss_scale():g}"
            _event(self.metrics, step, "overflow", message)
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
        _event(self.metrics, step, gate.reason, f"{what}; {action}")
        self.log(f"step {step}: {what}; {action}", always=True)

    def _log_window(self, grad_norm: float | None) -> None:
        """Add the step to the window; every ``log_every`` steps (and on the last or an unhealthy one), a
        train record in metrics.jsonl and a line on stderr."""
        from llmtools.train.metrics import StepWindow, step_line

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
        ledger = plan.task.ledger()
        if ledger is not None:
            record["source_tokens"] = ledger.consumed_tokens(self.progress.consumed_samples)
        self.metrics.log(record, step)
        self.log(step_line(record, plan.steps, *self._elapsed_and_eta(step, plan.steps)))
        self.window = StepWindow()
        if collapse is not None:
            self._report_collapse(collapse)

    def _report_collapse(self, collapse: str) -> None:
        """A ``moe_collapse`` event and a stderr line; with ``health.moe_collapse_action: stop``, a
        checkpoint of this state (the routing, not a single update, is what went wrong) and a stop."""
        step = self.progress.step
        stop = self.cfg.health.moe_collapse_action == "stop"
        _event(self.metrics, step, "moe_collapse", f"{collapse}; {'stopping' if stop else 'continuing'}")
        self.log(f"step {step}: {collapse}; {'stopping' if stop else 'continuing'}", always=True)
        if not stop:
            return
        saved = self.save(blocking=True)
        _event(self.metrics, step, "stop", f"stopped at step {step}: health.moe_collapse_action=stop")
        self.metrics.close()
        raise RuntimeFailure(
            f"stopped at step {step}: health.moe_collapse_action=stop ({collapse}); the state is saved in "
            f"{saved}; raise model.router_aux_loss_coef or model.moe_capacity_factor, then resume with "
            f"--resume {saved}"
        )

    def _other_data_loss(self) -> float | None:
        """The loss the current weights give on other data: the next step's first micro-batch of this rank
        (a function of the position alone, so a resumed run decides as the uninterrupted one), without
        gradients, in eval mode (no dropout: nothing drawn from the RNG). The mean over ranks
        (collective); None at the data's last step."""
        import torch

        from llmtools.train.distributed import mean_over_ranks

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
        step, before = self.progress.step, self.last_saved
        what = {"nan": "a NaN/inf loss or grad norm", "loss_spike": "a loss spike"}.get(
            gate.reason, "a grad-norm spike"
        )
        message = (
            f"stopped at step {step}: {what}, and the same weights give a loss of {loss:.4g} on other data: the "
            "cause is the config or the state (optimizer.lr, model.initializer_range, model.rope_theta, the "
            "task's settings), not the data; nothing was quarantined and this state was not saved"
        )
        _event(self.metrics, step, "stop", message, cause="config")
        self.metrics.close()
        self.finish_background_save()
        advice = (
            f"; the newest checkpoint, {before}, may already hold the update that diverged: fix the config, "
            "then resume from a checkpoint before it (--resume STEP --rollback) or start over (--force)"
            if before is not None
            else "; fix the config and start over (--force)"
        )
        raise RuntimeFailure(message + advice)

    def _quarantine(self) -> None:
        """The health gate tripped: append the offending samples of this step to RUN/quarantine.jsonl.

        For a NaN/inf, each rank scores its samples one by one (every rank runs the same forwards, which
        ZeRO-3 needs) and names those whose own loss is not finite; when no sample is (a non-finite
        gradient of finite losses), or for a grad-norm spike, the whole batch is named. Collective."""
        import torch

        from llmtools.formats.quarantine import append_records, make_record, quarantine_path
        from llmtools.train.distributed import gather_objects

        ledger, task, gate = self.plan.task.ledger(), self.plan.task, self.gate
        if ledger is None:
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
        samples = ledger.describe(sorted(losses))
        for sample in samples:
            sample["loss"] = losses[sample["position"]]
        gathered = gather_objects(samples)
        step = self.progress.step
        records = [
            make_record(ledger.run, step, rank, gate.reason, found, note)
            for rank, found in enumerate(gathered)
            if found
        ]
        where = quarantine_path(self.run_dir)
        if self.rank == 0:
            append_records(where, records)
            self._announce_quarantine(where, records)
        self._pass_over(records)

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
        _event(self.metrics, step, "quarantine", message, samples=len(named), documents=len(documents))
        self.log(f"step {step}: {message}", always=True)

    def _pass_over(self, records: list[dict]) -> None:
        """The quarantine takes effect at once, on every rank, exactly as a resume from this step would
        apply it (the same ledger, the same records): an interrupted run and an uninterrupted one read
        the same samples."""
        from llmtools.data.stages import ExhaustedSource
        from llmtools.formats.quarantine import quarantine_path

        self.quarantine_records.extend(records)
        ledger, step, position = self.plan.task.ledger(), self.progress.step, self.progress.consumed_samples
        try:
            decided = self.plan.task.resume_data(
                ledger.state(position, step),
                position,
                reset=False,
                quarantine=self.quarantine_records,
                where=f"{quarantine_path(self.run_dir)} (step {step})",
            )
        except ExhaustedSource as exhausted:
            # nothing left to train on from that source: stop with this state (its update was skipped)
            saved = self.save(blocking=True)
            _event(self.metrics, step, "stop", f"stopped at step {step}: {exhausted}; checkpoint {saved}")
            self.metrics.close()
            raise InputError(
                f"{exhausted} (stopped at step {step}; the last good state is {saved})"
            ) from None
        self.plan.train_data = decided.data
        for line in decided.lines:
            self.log(line, always=decided.event is not None)
        if decided.event is not None:
            _event(self.metrics, step, "data", "; ".join(decided.lines), **decided.event)

    def _stop_if_unhealthy(self) -> None:
        """Save the last good state and raise when health says stop, or after too many skipped updates."""
        gate, step = self.gate, self.progress.step
        if gate.update_spike is not None and self.cfg.health.update_spike_action == "stop":
            before = self.last_saved
            saved = self.save()
            _event(self.metrics, step, "stop", f"stopped at step {step}: health.update_spike_action=stop")
            self.metrics.close()
            raise RuntimeFailure(
                f"stopped at step {step}: health.update_spike_action=stop ({gate.update_spike}); that update "
                f"was applied: {saved} holds the state after it"
                + (f"; {before} holds the last state saved before it" if before is not None else "")
            )
        if not (gate.stop or gate.consecutive_skips >= self.cfg.health.max_skips):
            return
        if gate.stop:
            reason = "health.nan_action=stop" if gate.reason == "nan" else "health.spike_action=stop"
            if gate.reason == "loss_spike":
                reason += " (a loss spike)"
        else:
            reason = f"{gate.consecutive_skips} consecutive skipped steps (health.max_skips)"
        saved = self.save(blocking=True)
        _event(self.metrics, step, "stop", f"stopped at step {step}: {reason}; checkpoint {saved}")
        self.metrics.close()
        raise RuntimeFailure(
            f"stopped at step {step}: {reason} (the update was not applied); the last good state is "
            f"saved in {saved}; fix the cause and continue with --resume {saved}"
        )

    def evaluate(self) -> float:
        """Evaluate on the valid split; an eval record and a stderr line. Returns the eval loss."""
        from llmtools.train.evaluate import evaluate

        plan, step = self.plan, self.progress.step
        rank, replicas = self.data_rank()
        with self.kernels():
            eval_loss, task_metrics = evaluate(self.engine, plan, rank, replicas, ranks=self.world)
            if plan.config.eval.per_source:
                from llmtools.train.evaluate import evaluate_sources

                task_metrics.update(evaluate_sources(self.engine, plan, rank, replicas))
            if plan.eval_tasks:
                from llmtools.train.downstream import evaluate_tasks

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

    def _stop_on_signal(self, stop, command: str) -> None:
        """A signal asked to stop: make sure this step is saved, say how to resume."""
        step = self.progress.step
        self.finish_background_save()  # the write in flight first
        if self.last_saved is None or self.last_saved.name != f"step_{step:08d}":
            self.save(blocking=True)
        _event(
            self.metrics,
            step,
            "stop",
            f"stopped by {stop.signal_name} at step {step}; checkpoint {self.last_saved}",
        )
        self.log(stop.resume_hint(command, str(self.last_saved)), always=True)


def _train(
    plan: TrainPlan, options: RunOptions, request: ResumeRequest | None, dist_info, watch
) -> RunResult:
    _quiet_deepspeed()
    if dist_info.rank == 0:
        options.run_dir.mkdir(parents=True, exist_ok=True)
        if options.force and request is None:
            clear_run_dir(options.run_dir)  # --force starts over: only now, with the folder locked
        for warning in plan.warnings:
            log0(f"warning: {warning}", dist_info.rank)
    # The checkpoint to resume from and the resume policy's verdict, before the engine costs anything:
    # a refused change exits without writing (config.yaml included; it is written once a resume loads).
    manager = checkpointing.make_manager(
        options.run_dir, plan.config.checkpoint.keep_last, plan.config.checkpoint.keep_every
    )
    resolved, review = resolved_config(plan), _review_options(plan, options)
    chosen = checkpointing.choose(manager, request, resolved, review)
    if chosen is None and dist_info.rank == 0:
        write_resolved(plan, options.run_dir)
    trainer = _Trainer(plan, options, dist_info)
    trainer.prepare_task()
    trainer.resume(chosen, request, resolved, review)
    watch.progress = trainer.progress  # from here on, a lost peer is reported at the step in progress
    return trainer.run()
