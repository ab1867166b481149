"""Weights alone into a DeepSpeed engine: a resume that keeps the model and starts its optimizer afresh."""

from __future__ import annotations

from pathlib import Path

from llmtools.ckpt import dist, safeload
from llmtools.errors import InputError


def load_weights_only(engine, model_states: Path) -> None:
    """Copy a full state dict into the engine's (possibly ZeRO-3-partitioned) parameters, then refresh
    the optimizer's fp32 master copy from them (every ZeRO optimizer keeps one of its own)."""
    from llmtools.thirdparty import import_deepspeed

    deepspeed = import_deepspeed()
    import torch

    blob = safeload.load(model_states, mmap=True)
    state = blob.get("module") if isinstance(blob, dict) else None
    if not isinstance(state, dict):
        raise InputError(f"{model_states}[module]: missing (not a DeepSpeed model-states file)")
    params = dict(engine.module.named_parameters())
    missing = sorted(set(params) - set(state))
    if missing:
        raise InputError(f"{model_states}[{missing[0]}]: missing ({len(missing)} parameters missing in all)")
    stage3 = engine.zero_optimization_stage() == 3
    with deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=0, enabled=stage3):
        if not stage3 or dist.rank() == 0:
            with torch.no_grad():
                for name, param in params.items():
                    if tuple(state[name].shape) != tuple(param.shape):
                        raise InputError(
                            f"{model_states}[{name}]: shape {tuple(state[name].shape)}, the model has "
                            f"{tuple(param.shape)}"
                        )
                    param.copy_(state[name])
    refresh = getattr(engine.optimizer, "_restore_from_bit16_weights", None)
    if refresh is not None:
        refresh()
