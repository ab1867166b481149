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
    rollback: bool = False,
):
    """Load the checkpoint ``spec`` names (auto|latest|STEP|PATH) into ``engine``.

    Returns ``(path, client_state)``, or ``(None, None)`` when there is nothing to resume (``auto`` on a
    fresh run folder). A checkpoint whose model shape or tokenizer differ from this run is refused; one
    older than the run's newest complete checkpoint needs ``rollback`` (the newer ones are moved aside).
    """
    if spec is None:
        return None, None
    path = manager.resolve(spec, rollback=rollback)
    if path is None:
        if spec == "auto":
            return None, None
        raise InputError(f"--resume {spec}: no such checkpoint in {manager.ckpt_dir}")
    manager.check_compatible(path, model, tokenizer)
    client_state = manager.load(engine, path)
    return path, client_state
