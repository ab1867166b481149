"""Checkpoints of expert-parallel runs (``model.expert_parallel``): DeepSpeed's AutoEP layout, read back
under the model's own (Hugging Face) names.

In such a run DeepSpeed replaced each MoE block by its expert-parallel layer, so the checkpoint knows the
block's parameters by that layer's names, and each rank saved only its own experts (per-expert files, the
expert groups' ZeRO partitions). DeepSpeed's own ``ds_to_universal`` gathers them into one fp32 tensor per
parameter, every expert in place; this module renames those back:

=====================================  =========================================================
DeepSpeed (AutoEP)                     ours (transformers 5 in memory)
=====================================  =========================================================
``mlp.router.gate.weight``             ``mlp.gate.weight``
``mlp.gate.gate.weight``               (an alias DeepSpeed keeps of the same router: dropped)
``mlp.experts.w1`` / ``w3`` (E, I, H)  ``mlp.experts.gate_up_proj`` (E, 2I, H): w1 rows, then w3
``mlp.experts.w2`` (E, H, I)           ``mlp.experts.down_proj``
``mlp.shared_experts.*``               ``mlp.shared_expert.*``
``mlp.shared_experts_gate.weight``     ``mlp.shared_expert_gate.weight``
=====================================  =========================================================
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from llmtools.errors import InputError

_ROUTER = re.compile(r"^(model\.layers\.\d+\.mlp)\.router\.gate\.weight$")
_ALIAS = re.compile(r"^model\.layers\.\d+\.mlp\.gate\.gate\.weight$")
_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp)\.experts\.w([123])$")
_SHARED = re.compile(r"^(model\.layers\.\d+\.mlp)\.shared_experts(_gate)?\.(.+)$")


def is_expert_parallel(meta: dict[str, Any] | None) -> bool:
    return bool((meta or {}).get("expert_parallel"))


class UniversalTensor:
    """One parameter of a universal checkpoint folder (``zero/NAME/fp32.pt``): shape and dtype from the
    pickle alone, the bytes read only by ``load()``."""

    def __init__(self, path: Path) -> None:
        from llmtools.ckpt.torchfile import LazyTensor, load_lazy

        self.path = path
        data = load_lazy(path)
        self.tensor = data.get("param") if isinstance(data, dict) else data
        if not isinstance(self.tensor, LazyTensor):
            raise InputError(f"{path}: no 'param' tensor (not a universal checkpoint parameter)")
        self.shape, self.dtype = tuple(self.tensor.shape), self.tensor.dtype

    def load(self):
        return self.tensor.load()


class _Concat:
    """gate_up_proj from DeepSpeed's w1 (gate) and w3 (up): concatenated along the rows of each expert."""

    def __init__(self, gate: UniversalTensor, up: UniversalTensor) -> None:
        if gate.shape != up.shape:
            raise InputError(f"{up.path}: shape {up.shape}, its gate has {gate.shape}")
        self.parts = (gate, up)
        self.shape = (gate.shape[0], 2 * gate.shape[1], *gate.shape[2:])
        self.dtype = gate.dtype

    def load(self):
        import torch

        return torch.cat([part.load() for part in self.parts], dim=1)


def universal_sources(universal: Path) -> dict[str, UniversalTensor]:
    """Every parameter of a universal checkpoint folder under DeepSpeed's names."""
    zero = universal / "zero"
    if not zero.is_dir():
        raise InputError(f"{universal}: no zero/ folder (not a DeepSpeed universal checkpoint)")
    out = {}
    for folder in sorted(zero.iterdir()):
        fp32 = folder / "fp32.pt"
        if folder.is_dir() and fp32.is_file():
            out[folder.name] = UniversalTensor(fp32)
    return out


def to_model_names(sources: dict[str, Any], where: str) -> dict[str, Any]:
    """DeepSpeed's expert-parallel names -> ours (see the module docstring)."""
    out: dict[str, Any] = {}
    experts: dict[str, dict[str, Any]] = {}
    for name, source in sources.items():
        if _ALIAS.match(name):
            continue
        if match := _ROUTER.match(name):
            out[f"{match.group(1)}.gate.weight"] = source
        elif match := _EXPERT.match(name):
            experts.setdefault(match.group(1), {})[match.group(2)] = source
        elif match := _SHARED.match(name):
            block, gate, rest = match.groups()
            out[f"{block}.shared_expert{'_gate' if gate else ''}.{rest}"] = source
        else:
            out[name] = source
    for block, parts in experts.items():
        missing = [f"w{i}" for i in "123" if i not in parts]
        if missing:
            raise InputError(f"{where}[{block}.experts.{missing[0]}]: missing")
        out[f"{block}.experts.gate_up_proj"] = _Concat(parts["1"], parts["3"])
        out[f"{block}.experts.down_proj"] = parts["2"]
    return out


__all__ = ["is_expert_parallel", "universal_sources", "to_model_names", "UniversalTensor"]
