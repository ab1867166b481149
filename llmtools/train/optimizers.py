"""The table of optimizers: what the config, the plan and the resume policy know of each, without torch.

A new optimizer is its class (or builder) in :mod:`llmtools.train.optim` and one row of :data:`OPTIMIZERS`;
``optimizer.name`` accepts the table's names, in its order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llmtools.errors import InputError


@dataclass(frozen=True)
class OptimizerKind:
    build: str
    """The function of :mod:`llmtools.train.optim` that builds it: ``(section, groups, device_kwargs)``."""
    default_betas: tuple[float, float]
    """Its usual betas when the config gives none."""
    usual_lr: str
    """Its usual learning rates, named when optimizer.lr is out of range."""
    reshardable: bool = False
    """DeepSpeed's universal checkpoint, which reshards the optimizer state, carries its state (Adam's
    moments are all it carries)."""
    deepspeed_tested: bool = False
    """On DeepSpeed ZeRO's list of tested optimizers (any other needs ``zero_allow_untested_optimizer``)."""
    check: Callable[..., None] | None = None
    """What it cannot do with a run, refused before compute: ``(config, ds_config, zero_stage, where,
    ds_source)``."""


def check_muon(config, ds_config: dict, zero_stage: int, where: str, ds_source: str) -> None:
    if zero_stage == 3:
        raise InputError(
            f"{where}: optimizer.name=muon: not with ZeRO stage 3 ({ds_source}): stage 3 partitions every "
            "matrix on its own and steps sub-groups of them, and Muon orthogonalizes whole matrices; use "
            "ZeRO stage 1 or 2 (the optimizer state is still partitioned)"
        )
    if config.lora is not None:
        raise InputError(
            f"{where}: optimizer.name=muon: not with lora (the adapters are low-rank factors, not the hidden "
            "matrices Muon orthogonalizes); use adamw or lion"
        )
    offload = (ds_config.get("zero_optimization") or {}).get("offload_optimizer") or {}
    if isinstance(offload, dict) and offload.get("device") not in (None, "none"):
        raise InputError(
            f"{ds_source}[zero_optimization.offload_optimizer]: optimizer.name=muon runs on the device that "
            "holds the gradients; remove the optimizer offload"
        )


# Betas: AdamW's (and Muon's AdamW part) from the LLaMA recipe; Lion's from its paper (beta1 mixes the
# gradient into the update, beta2 into the momentum).
OPTIMIZERS: dict[str, OptimizerKind] = {
    "adamw": OptimizerKind(
        "build_adamw", (0.9, 0.95), "usually 1e-5 .. 1e-2", reshardable=True, deepspeed_tested=True
    ),
    "adafactor": OptimizerKind("build_adafactor", (0.9, 0.95), "usually 1e-4 .. 1e-2"),
    "lion": OptimizerKind("build_lion", (0.9, 0.99), "usually 1e-5 .. 1e-3, 3-10x below AdamW's"),
    "muon": OptimizerKind(
        "build_muon",
        (0.9, 0.95),
        "usually 1e-4 .. 1e-2 with muon_adjust_lr=match_rms_adamw, ~0.02 with original",
        check=check_muon,
    ),
}


def check_optimizer(config, ds_config: dict, zero_stage: int, where: str, ds_source: str) -> None:
    """What the optimizer cannot do with this run, as one line naming the keys (no torch here)."""
    check = OPTIMIZERS[config.optimizer.name].check
    if check is not None:
        check(config, ds_config, zero_stage, where, ds_source)
