"""The training loop: a DeepSpeed engine over the LLaMA model, fed and scored by the run's task.

``train(config, ds_config, run_dir)`` is the library entry point (``llm-train`` is a thin adapter):

1. plan (before any compute, :mod:`~llmtools.train.plan`): model shape, the task's data, lengths,
   DeepSpeed config -> errors name file and key; the run folder (:mod:`~llmtools.train.rundir`);
   ``--resume`` parsed once (:class:`~llmtools.ckpt.request.ResumeRequest`), the resume policy's verdict
   and how the data continues (:mod:`~llmtools.train.data_part`), all before torch;
2. process group (one process, or a launcher's), model (seeded), AdamW with no decay on norms/biases,
   the LR schedule, ``deepspeed.initialize`` (:mod:`~llmtools.train.engine`);
3. the run (:class:`~llmtools.train.trainer._Trainer`), per step (:mod:`~llmtools.train.step`):
   ``grad_accumulation`` micro-batches per rank, then the update; health checks gate the update
   (:mod:`~llmtools.train.health`, :mod:`~llmtools.train.health_actions`); a metrics record and a stderr
   line every ``log_every`` steps (:mod:`~llmtools.train.metrics`); eval every ``eval.every``; a
   checkpoint of the run's parts (:mod:`~llmtools.train.state`) every ``save_every``.

Only rank 0 writes the run folder's logs.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from llmtools.ckpt.request import ResumeRequest
from llmtools.logs.trackers import check_available
from llmtools.thirdparty import import_deepspeed
from llmtools.train import checkpointing
from llmtools.train.config import TrainConfig
from llmtools.train.data_part import PlainData, data_part
from llmtools.train.deepspeed_config import prefer_torch_adam
from llmtools.train.distributed import detect_environment, init_distributed, log0
from llmtools.train.engine import check_fp16_support, release_engine
from llmtools.train.peers import PeerWatch
from llmtools.train.plan import TrainPlan, make_plan
from llmtools.train.rundir import (
    clear_run_dir,
    locked_run_dir,
    prepare_run_dir,
    resolved_config,
    write_resolved,
)


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
    claim: Callable[[], None] | None = None
    """The command's check that it may write the run folder's entries (llm-train's: cli/claim.py), made
    first of the checks before compute."""


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
    """The signal that stopped the run before its end (its state saved), e.g. "SIGTERM"."""
    stop_hint: str | None = None
    """How to resume a stopped run (rank 0), printed last by the command."""


@dataclass
class Checked:
    """What the checks before compute decided (:func:`check_before_compute`)."""

    plan: TrainPlan
    request: ResumeRequest | None
    data: PlainData
    review: checkpointing.ReviewOptions


class _Checking:
    """What the checks before compute share as they go, in the order of :data:`CHECKS`."""

    def __init__(self, config: TrainConfig, ds_raw: dict, options: RunOptions, cpu: bool) -> None:
        self.config, self.ds_raw, self.options, self.cpu = config, ds_raw, options, cpu
        self.where = config.source or "<train config>"
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        # --resume, parsed once (any value parses; what it names is checked below): every check takes it.
        self.request = ResumeRequest.parse(options.resume, rollback=options.rollback, reshard=options.reshard)
        self.plan: TrainPlan | None = None
        self.data: PlainData | None = None
        self.review: checkpointing.ReviewOptions | None = None


def _check_outputs(c: _Checking) -> None:
    if c.options.claim is not None:
        c.options.claim()


def _check_plan(c: _Checking) -> None:
    # a resumed run's data length is checked once it is known where its data continues (_check_data)
    c.plan = make_plan(
        c.config, c.ds_raw, world_size=c.world, cpu=c.cpu, ds_source=c.options.ds_source,
        check_length=c.request is None,
    )  # fmt: skip


def _check_trackers(c: _Checking) -> None:
    check_available(c.config.logging.reporters(), f"{c.where}: logging.report_to")


def _check_fp16_device(c: _Checking) -> None:
    if c.config.training.precision == "fp16":
        check_fp16_support(c.where)


def _check_run_folder(c: _Checking) -> None:
    prepare_run_dir(c.options.run_dir, c.request, c.options.force, c.rank)


def _check_resume_policy(c: _Checking) -> None:
    # the resume policy's verdict, before torch loads: a refused config change exits in about a second
    c.data = data_part(c.plan, c.options.run_dir, c.options.reset_data)
    c.review = _review_options(c.plan, c.options, c.data)
    checkpointing.precheck(c.options.run_dir, c.request, resolved_config(c.plan), c.review)


def _check_data(c: _Checking) -> None:
    c.data.precheck(c.request, c.options.force)  # how the data continues (the task's data ledger)


CHECKS: tuple[tuple[str, Callable[[_Checking], None]], ...] = (
    ("outputs", _check_outputs),
    ("plan", _check_plan),  # model, data, lengths, DeepSpeed config (llmtools.train.plan)
    ("trackers", _check_trackers),  # a tracker whose library is missing
    ("fp16 device", _check_fp16_device),  # a device without fp16 arithmetic
    ("run folder", _check_run_folder),
    ("resume policy", _check_resume_policy),
    ("data continuation", _check_data),
)
"""Every check a run makes before compute, in order: the run and ``llm-train --dry-run`` both make exactly
these (:func:`check_before_compute`). They only read: a refusal leaves every file as it was."""


def check_before_compute(
    config: TrainConfig, ds_raw: dict, options: RunOptions, *, cpu: bool = False
) -> Checked:
    """Make every check of :data:`CHECKS`; the first refusal raises (InputError/UsageError, one line).
    ``cpu``: resolve the DeepSpeed config for the CPU (what ``--dry-run`` prints)."""
    checking = _Checking(config, ds_raw, options, cpu)
    for _name, check in CHECKS:
        check(checking)
    return Checked(checking.plan, checking.request, checking.data, checking.review)


def train(config: TrainConfig, ds_raw: dict, options: RunOptions) -> RunResult:
    """Run training as the library entry point (call on every rank)."""
    detect_environment()
    # Every check before any compute, before torch is even imported (a bad config fails in about a second)
    # and before the process group exists (so it fails on every rank alike); --dry-run makes the same ones.
    checked = check_before_compute(config, ds_raw, options)
    plan, request, data, review = checked.plan, checked.request, checked.data, checked.review
    import torch

    if not torch.cuda.is_available():
        prefer_torch_adam(plan.ds_config)
    # The process group outlives the run (DeepSpeed keeps its own handle on it); the CLI tears it down.
    watch = PeerWatch(config.distributed.timeout_s)
    with watch:  # a rank that is gone is reported as such (one line, exit 1), never as an internal error
        dist_info = init_distributed(config.distributed.timeout_s)
        watch.gather()
        # One writer per run folder: rank 0 holds RUN/run.lock from before anything is written until the end.
        with locked_run_dir(options.run_dir, dist_info.rank):
            return _train(plan, options, request, data, review, dist_info, watch)


def _review_options(plan: TrainPlan, options: RunOptions, data: PlainData) -> checkpointing.ReviewOptions:
    """What the resume policy needs to know besides the two configs and the request."""
    return checkpointing.ReviewOptions(
        reset_data=options.reset_data,
        own_scheduler="scheduler" in plan.ds_config,
        data_ledger=data.keeps_ledger,
    )


def _quiet_deepspeed() -> None:
    import logging
    import warnings

    # DeepSpeed's ZeRO calls torch.distributed APIs that torch 2.13 deprecates, once per bucket per step.
    warnings.filterwarnings("ignore", category=FutureWarning, message=r".*torch\.distributed\.")

    level = logging.INFO if os.environ.get("LLMTOOLS_DEBUG") else logging.WARNING
    try:
        import_deepspeed()
        from deepspeed.utils import logger

        logger.setLevel(level)
        # DeepSpeed logs to stdout; stdout is for results (paths, JSON), so its messages go to stderr.
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and getattr(handler, "stream", None) is sys.stdout:
                handler.setStream(sys.stderr)
    except ImportError:
        pass


def _nothing_to_train(
    plan: TrainPlan, options: RunOptions, chosen: checkpointing.Accepted, rank: int
) -> RunResult:
    """A resume whose checkpoint is at (or past) the config's last step: said before any work, and the
    run folder is left as it was (no engine, no resharding, no config.N.yaml, no event, no tracker run);
    a changed ``training.train_steps`` below the checkpoint's step is refused by the resume policy."""
    log0(
        f"nothing to train: {chosen.path} is at step {chosen.step}, the last of this config's {plan.steps} "
        "steps (raise training.train_steps to train on)",
        rank,
    )
    return RunResult(
        run_dir=options.run_dir, steps=chosen.step, final_loss=None, first_loss=None, checkpoint=chosen.path
    )


def _train(
    plan: TrainPlan,
    options: RunOptions,
    request: ResumeRequest | None,
    data: PlainData,
    review: checkpointing.ReviewOptions,
    dist_info,
    watch,
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
    resolved = resolved_config(plan)
    chosen = checkpointing.choose(manager, request, resolved, review)
    if chosen is not None and chosen.step >= plan.steps:
        return _nothing_to_train(plan, options, chosen, dist_info.rank)
    if chosen is None and dist_info.rank == 0:
        write_resolved(plan, options.run_dir)
    from llmtools.train.trainer import _Trainer  # it imports this module (RunOptions, RunResult)

    trainer = _Trainer(plan, options, dist_info, data)
    try:
        trainer.prepare_task()
        trainer.resume(chosen, request, resolved, review)
        watch.progress = trainer.progress  # from here on, a lost peer is reported at the step in progress
        result = trainer.run()
    except BaseException:
        with contextlib.suppress(Exception):  # the failure that ended the run is the one to report
            release_engine(trainer.engine)
        raise
    release_engine(trainer.engine)
    return result
