"""The run folder: one writer at a time, no training over an existing run, the fully resolved configs.

``RUN/run.lock`` (:mod:`llmtools.locks`) is held by rank 0 for the whole run, so a second ``llm-train`` on
the same folder (a requeued job racing the old one) exits 2 naming the holder before it writes anything.
``config.yaml`` and ``ds_config.json`` are written when a fresh run starts, or once a resume has been
accepted (:mod:`llmtools.train.resume`); a previous version that differs is kept as ``config.<step>.yaml``
(``ds_config.<step>.json``), the step being the one the run resumed from.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from llmtools.ckpt.manager import CheckpointManager
from llmtools.ckpt.request import ResumeRequest
from llmtools.errors import UsageError
from llmtools.formats import jsonfile
from llmtools.formats.output_marks import RUN_CONFIG_HEADER, run_folder_entries
from llmtools.fsutil import write_text_atomic
from llmtools.train.plan import TrainPlan


def prepare_run_dir(run_dir: Path, request: ResumeRequest | None, force: bool, rank: int = 0) -> None:
    """Refuse to train over an existing run unless resuming or --force (which starts over: see
    :func:`clear_run_dir`); refuse a ``--resume`` naming no checkpoint of this run (a ``latest`` pointing
    out of it), or an older checkpoint than its newest without ``rollback``. Reads only; every rank
    checks, so a refusal stops every rank alike."""
    del rank  # every rank decides alike
    if request is not None:
        CheckpointManager(run_dir).check_rollback(request)
    existing = [
        run_dir / name for name in ("metrics.jsonl", "checkpoints", "reference") if (run_dir / name).exists()
    ]
    if existing and request is None and not force:
        raise UsageError(
            f"{run_dir}: already holds a run ({existing[0].name}); --resume auto continues it, "
            "--force starts over, -o picks another folder"
        )


def clear_run_dir(run_dir: Path) -> None:
    """--force without --resume: remove the earlier run's files (rank 0, with the run folder locked)."""
    import shutil

    for path in run_folder_entries(run_dir):  # what the CLI checked --force may replace (cli/claim.py)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


@contextlib.contextmanager
def locked_run_dir(run_dir: Path, rank: int) -> Iterator[None]:
    """Hold ``RUN/run.lock`` on rank 0 for the block; every rank raises alike when another run holds it.

    Call with the process group up (rank 0's outcome is broadcast), before anything is written.
    """
    from llmtools.ckpt import dist
    from llmtools.locks import LockHeld, acquire, run_lock_path

    lock, refusal = None, None
    if rank == 0:
        try:
            lock = acquire(run_lock_path(run_dir), run_dir)
        except LockHeld as held:
            refusal = str(held)
    refusal = dist.broadcast(refusal)
    if refusal is not None:
        raise UsageError(refusal)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def resolved_config(plan: TrainPlan) -> dict:
    """The fully resolved train config (what RUN/config.yaml holds, and each checkpoint's meta.json)."""
    resolved = plan.config.to_dict()
    resolved["model"] = {
        "preset": plan.config.model.preset,
        "init_from": plan.config.model.init_from,
        **(
            {"expert_parallel": plan.config.model.expert_parallel}
            if plan.config.model.expert_parallel
            else {}
        ),
        **plan.model_config.to_dict(),
    }
    resolved["data"]["seq_length"] = plan.seq_length
    resolved["training"]["train_steps"] = plan.steps
    resolved["schedule"]["total_steps"] = plan.total_steps
    resolved["resolved"] = {
        "world_size": plan.world_size,
        "grad_accumulation": plan.grad_accumulation,
        "zero_stage": plan.zero_stage,
        "tokens_per_step": plan.tokens_per_step,
        "num_parameters": plan.model_config.num_parameters(),
        "tokenizer": plan.tokenizer,
        "config_hash": plan.config.fingerprint(),
        # The sample plan's identity (a mix's hash and split): a resume on another plan is refused.
        "data_plan": getattr(plan.train_data, "fingerprint", None) or None,
    }
    return resolved


def write_resolved(plan: TrainPlan, run_dir: Path, resumed_step: int | None = None) -> list[Path]:
    """RUN/config.yaml and RUN/ds_config.json; returns the earlier versions kept (config.<step>.yaml ...)."""
    import yaml

    body = yaml.safe_dump(resolved_config(plan), sort_keys=False)
    header = f"{RUN_CONFIG_HEADER} from {plan.config.source}; every default filled in\n"
    kept = []
    for name, text, strip in (
        ("config.yaml", header + body, True),
        ("ds_config.json", jsonfile.dumps(plan.ds_config, indent=2) + "\n", False),
    ):
        path = run_dir / name
        if resumed_step is not None:
            previous = _keep_previous(path, text, resumed_step, strip)
            if previous is not None:
                kept.append(previous)
        write_text_atomic(path, text)
    return kept


def _keep_previous(path: Path, text: str, step: int, strip_header: bool) -> Path | None:
    """Copy ``path`` to ``NAME.<step>.EXT`` when what replaces it differs (the header aside)."""
    try:
        old = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None

    def content(value: str) -> str:
        if strip_header:
            value = "\n".join(line for line in value.splitlines() if not line.startswith("#"))
        return value.strip()

    if content(old) == content(text):
        return None
    stem, ext = os.path.splitext(path.name)
    target = path.with_name(f"{stem}.{step}{ext}")
    n = 2
    while target.exists():  # resumed from the same step before: keep every version
        target = path.with_name(f"{stem}.{step}-{n}{ext}")
        n += 1
    write_text_atomic(target, old)
    return target
