"""The seam between the loop and checkpoints: save every N steps, resume from a spec.

Everything goes through :class:`llmtools.ckpt.manager.CheckpointManager` (crash-safe folders, meta.json
written last, verification, pruning, RNG states). The loop only calls the three functions below.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmtools.errors import InputError


def make_manager(run_dir, keep_last: int | None = None, keep_every: int | None = None):
    from llmtools.ckpt.manager import CheckpointManager

    return CheckpointManager(run_dir, keep_last=keep_last, keep_every=keep_every)


def save(manager, engine, step: int, client_state: dict[str, Any]) -> Path:
    """Save on ALL ranks; returns the committed checkpoint folder."""
    return manager.save(engine, step, client_state)


def resume(
    manager,
    engine,
    spec: str | None,
    *,
    model: dict | None = None,
    tokenizer: dict | None = None,
    expert_parallel: int | None = None,
    rollback: bool = False,
):
    """Load the checkpoint ``spec`` names (auto|latest|STEP|PATH) into ``engine``.

    Returns ``(path, client_state)``, or ``(None, None)`` when there is nothing to resume (``auto`` on a
    fresh run folder). A checkpoint whose model shape or tokenizer differ from this run is refused, and so
    is one whose expert layout differs (DeepSpeed's expert-parallel layer or not; the group size may
    change: the universal conversion re-spreads the experts). One older than the run's newest complete
    checkpoint needs ``rollback`` (the newer ones are moved aside).
    """
    if spec is None:
        return None, None
    path = manager.resolve(spec, rollback=rollback)
    if path is None:
        if spec == "auto":
            return None, None
        raise InputError(f"--resume {spec}: no such checkpoint in {manager.ckpt_dir}")
    meta = manager.check_compatible(path, model, tokenizer)
    saved_ep = meta.get("expert_parallel")
    if (saved_ep is None) != (expert_parallel is None):
        if saved_ep is None:
            raise InputError(
                f"{path}: saved without expert parallelism, and this run sets model.expert_parallel="
                f"{expert_parallel}; resume it without (or start from its weights: model.init_from {path})"
            )
        raise InputError(
            f"{path}: saved with model.expert_parallel={saved_ep} (DeepSpeed's expert-parallel layout); set "
            "model.expert_parallel to resume it (any value dividing the world size), or start from its "
            f"weights: llm-ckpt convert {path} --to hf, then model.init_from"
        )
    client_state = manager.load(engine, path)
    return path, client_state
