"""LoRA: low-rank adapters on the attention/MLP projections, base weights frozen.

Why our own small module rather than ``peft``: ``peft`` wraps the model (``base_model.model.``) and moves
each target's weight to ``<target>.base_layer.weight``, so every parameter name changes. Our checkpoints,
``llm-ckpt`` conversion, ``init_from`` loading and ZeRO-3's per-module gathering all rely on the Hugging
Face names, and the wrapper's extra forward indirection buys nothing here. :class:`LoraLinear` instead
keeps ``<target>.weight`` where it was and adds two parameters beside it, ``lora_A`` (r, in) and
``lora_B`` (out, r): the names and shapes ``peft`` saves (``<target>.lora_A.weight``), so the adapter
export (:func:`llmtools.ckpt.lora.write_adapter`) is a renaming, and ``peft`` loads it (tested). Under ZeRO 0-3 the frozen
base is just a parameter with ``requires_grad=False`` (no optimizer state, no gradient); the adapter
parameters are ordinary trainable ones.

Maths as ``peft``'s: ``y = x W^T + dropout(x) A^T B^T * alpha / r``; A ~ kaiming-uniform(a=sqrt(5)),
B = 0, so step 0 is exactly the base model; merging is ``W + (alpha / r) B A``.

This module does not import torch at import time (the train config imports :class:`LoraSection`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from llmtools.errors import InputError, UsageError

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoraSection:
    """``lora:`` in the train config: adapters on ``target_modules``; everything else frozen."""

    r: int = 8
    """Rank of the adapters."""
    alpha: float = 16.0
    """Scale numerator: the update is (alpha / r) B A."""
    dropout: float = 0.0
    """Dropout on the adapter's input (training only)."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Projections that get adapters: q_proj k_proj v_proj o_proj gate_proj up_proj down_proj."""

    def __post_init__(self) -> None:
        if self.r < 1:
            raise InputError(f"lora.r: must be >= 1, got {self.r}")
        if not self.alpha > 0:
            raise InputError(f"lora.alpha: must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise InputError(f"lora.dropout: must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise InputError("lora.target_modules: give at least one of " + ", ".join(TARGETS))
        for i, name in enumerate(self.target_modules):
            if name not in TARGETS:
                close = difflib.get_close_matches(name, TARGETS, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise InputError(
                    f"lora.target_modules[{i}]: {name!r} is not one of {', '.join(TARGETS)}{hint}"
                )
        if len(set(self.target_modules)) != len(self.target_modules):
            raise InputError(f"lora.target_modules: repeated names in {self.target_modules}")

    @property
    def scaling(self) -> float:
        return self.alpha / self.r

    def to_dict(self) -> dict[str, Any]:
        return {
            "r": self.r,
            "alpha": self.alpha,
            "dropout": self.dropout,
            "target_modules": list(self.target_modules),
        }


def _lora_linear_class():
    import math

    import torch
    import torch.nn.functional as F
    from torch import nn

    class LoraLinear(nn.Module):
        """A bias-free linear layer with a frozen ``weight`` and a trainable low-rank update."""

        def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float) -> None:
            super().__init__()
            if base.bias is not None:
                raise UsageError("LoRA: biased projections are not supported (the LLaMA family has none)")
            self.in_features, self.out_features = base.in_features, base.out_features
            self.weight = base.weight  # the same Parameter: its name and storage are unchanged
            self.weight.requires_grad_(False)
            device, dtype = base.weight.device, base.weight.dtype
            self.lora_A = nn.Parameter(torch.empty(r, self.in_features, device=device, dtype=dtype))
            self.lora_B = nn.Parameter(torch.zeros(self.out_features, r, device=device, dtype=dtype))
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # peft's default init
            self.scaling = alpha / r
            self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
            self.adapter_enabled = True  # off: exactly the frozen base layer (see adapters_disabled)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if not self.adapter_enabled:
                return F.linear(x, self.weight)
            update = F.linear(F.linear(self.dropout(x), self.lora_A), self.lora_B)
            return F.linear(x, self.weight) + update * self.scaling

        def extra_repr(self) -> str:
            return f"in={self.in_features}, out={self.out_features}, r={self.lora_A.shape[0]}, scaling={self.scaling}"

    return LoraLinear


def expected_adapter_parameters(model_config, section: LoraSection) -> int:
    """How many parameters the adapters add: r x (in + out) per targeted projection per layer."""
    c = model_config
    h, i = c.hidden_size, c.intermediate_size
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    shapes = {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }
    return c.num_hidden_layers * sum(section.r * sum(shapes[t]) for t in section.target_modules)


def apply_lora(model, section: LoraSection) -> dict[str, int]:
    """Freeze every parameter of ``model`` and put adapters on the targeted projections (in place).

    Returns ``{"trainable": n, "frozen": m}`` (parameter counts). Deterministic under ``torch.manual_seed``.
    """
    from torch import nn

    lora_linear = _lora_linear_class()
    for param in model.parameters():
        param.requires_grad_(False)
    targets = set(section.target_modules)
    replaced = 0
    for name, module in list(model.named_modules()):
        leaf = name.rsplit(".", 1)[-1]
        if leaf in targets and isinstance(module, nn.Linear):
            parent = model.get_submodule(name.rsplit(".", 1)[0])
            setattr(parent, leaf, lora_linear(module, section.r, section.alpha, section.dropout))
            replaced += 1
    if not replaced:
        raise InputError(f"lora.target_modules: none of {section.target_modules} found in the model")
    trainable, total = trainable_parameters(model)
    return {"trainable": trainable, "frozen": total - trainable, "modules": replaced}


def trainable_parameters(model) -> tuple[int, int]:
    """(trainable, all) parameters of ``model``, counted as peft's ``get_nb_trainable_parameters`` counts
    them (each shared parameter once); ZeRO-3's partitioned parameters by their full size."""
    trainable = total = 0
    for param in model.parameters():
        n = getattr(param, "ds_numel", None) or param.numel()
        total += n
        trainable += n if param.requires_grad else 0
    return trainable, total


@contextmanager
def adapters_disabled(model) -> Iterator[int]:
    """Inside the block, every LoRA layer of ``model`` computes its frozen base alone (``peft``'s
    ``disable_adapter``): the model is the base model it started from. Yields the number of layers switched
    off (0 for a model without LoRA)."""
    layers = [m for m in model.modules() if hasattr(m, "adapter_enabled")]
    before = [m.adapter_enabled for m in layers]
    for layer in layers:
        layer.adapter_enabled = False
    try:
        yield len(layers)
    finally:
        for layer, state in zip(layers, before, strict=True):
            layer.adapter_enabled = state


# -- merging ----------------------------------------------------------------------------------------
def is_adapter_name(name: str) -> bool:
    return name.endswith((".lora_A", ".lora_B"))


def merge_state(state: dict, section: LoraSection) -> dict:
    """HF-named state dict with every ``W + (alpha / r) B A`` merged (in fp32) and the adapters dropped."""
    import torch

    merged = {k: v for k, v in state.items() if not is_adapter_name(k)}
    for name in [k for k in state if k.endswith(".lora_A")]:
        base = name.removesuffix(".lora_A")
        a, b = state[name].to(torch.float32), state[base + ".lora_B"].to(torch.float32)
        weight = state[base + ".weight"]
        merged[base + ".weight"] = (weight.to(torch.float32) + section.scaling * (b @ a)).to(weight.dtype)
    return merged
