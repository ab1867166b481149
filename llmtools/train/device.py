"""What a device gets: process-group backend, fused AdamW, autocast, the attention kernels.

One code path trains on CPU and GPU; the few choices that differ are made here, by :func:`choose`, from a
plain description of the device and the run (no tensor, no GPU needed), so they are tested on any
machine by asking what a ``"cuda"`` device would get. :func:`kernel_context` turns the choices into the
context the loop runs its forward and backward passes in.

Attention on CUDA is restricted to the flash and memory-efficient SDPA kernels where the shapes allow
(torch would otherwise fall back to the math kernel silently, which materialises the t x t scores):

* flash: bf16/fp16, head_dim a multiple of 8 and at most 256, no explicit mask (``is_causal`` only);
* memory-efficient: also fp32 and an explicit (document) mask, head_dim a multiple of 8 (fp16/bf16) or
  4 (fp32), at most 256 here, but no grouped key/value heads (``enable_gqa`` reaches the flash and math
  kernels only: torch 2.11's ``can_use_efficient_attention`` said so on an H200, for every dtype and mask);
* otherwise the math kernel, with one warning naming why.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

FLASH, EFFICIENT, MATH = "flash", "efficient", "math"


@dataclass(frozen=True)
class DeviceChoices:
    backend: str
    """torch.distributed backend: nccl on CUDA, gloo on CPU."""
    fused_adamw: bool
    """torch.optim.AdamW(fused=True): one kernel over all parameters (CUDA); foreach=False on CPU."""
    autocast: str | None
    """"bfloat16": forward passes run under torch.autocast; None where the engine already casts the model
    (DeepSpeed's bf16 holds bf16 weights) or the run asked for fp32."""
    attention: tuple[str, ...] | None
    """SDPA kernels allowed (flash, efficient, math); None: torch's own choice (CPU)."""
    fallback: str | None = None
    """Why attention falls back to the math kernel, when it does (warned once)."""


def attention_kernels(
    dtype: str, head_dim: int, masked: bool, gqa: bool
) -> tuple[tuple[str, ...], str | None]:
    """The SDPA kernels a CUDA device may use for these shapes, and why math when it must be math."""
    half = dtype in ("bf16", "fp16")
    allowed = []
    if half and head_dim % 8 == 0 and head_dim <= 256 and not masked:
        allowed.append(FLASH)
    if head_dim % (8 if half else 4) == 0 and head_dim <= 256 and not gqa:
        allowed.append(EFFICIENT)
    if allowed:
        return tuple(allowed), None
    why = []
    if head_dim > 256 or head_dim % (8 if half else 4):
        why.append(
            f"head_dim {head_dim} (flash/efficient need a multiple of {8 if half else 4}, at most 256)"
        )
    if gqa and (masked or not half):
        why.append(
            "grouped key/value heads with "
            + ("a document mask" if masked else "fp32")
            + " (flash takes neither a mask nor fp32, the efficient kernel has no enable_gqa)"
        )
    return (MATH,), "; ".join(why) or "no flash/efficient kernel for these shapes"


def process_group_backend(device: str) -> str:
    """nccl between CUDA devices, gloo between CPU processes."""
    return "nccl" if device.startswith("cuda") else "gloo"


def choose(
    device: str, *, precision: str, engine_casts: bool, head_dim: int, masked: bool = False, gqa: bool = False
) -> DeviceChoices:
    """The choices for ``device`` ("cpu", "cuda", "cuda:N"). ``engine_casts``: the engine holds the model
    in ``precision`` already (DeepSpeed bf16/fp16), so autocast would add nothing."""
    if not device.startswith("cuda"):
        return DeviceChoices(
            backend=process_group_backend(device), fused_adamw=False, autocast=None, attention=None
        )
    autocast = "bfloat16" if precision == "bf16" and not engine_casts else None
    dtype = precision if engine_casts or autocast is None else "bf16"
    kernels, why = attention_kernels(dtype, head_dim, masked, gqa)
    return DeviceChoices(
        backend=process_group_backend(device),
        fused_adamw=True,
        autocast=autocast,
        attention=kernels,
        fallback=why,
    )


_warned: set[str] = set()


def kernel_context(choices: DeviceChoices, device: str, warn=None):
    """The context forward and backward run in: SDPA restricted to ``choices.attention`` and autocast
    when chosen. ``warn(message)`` is called once per process for a math-kernel fallback."""
    stack = contextlib.ExitStack()
    if choices.attention is not None:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if choices.fallback and warn is not None and choices.fallback not in _warned:
            _warned.add(choices.fallback)
            warn(f"warning: attention falls back to the math kernel: {choices.fallback}")
        names = {
            FLASH: SDPBackend.FLASH_ATTENTION,
            EFFICIENT: SDPBackend.EFFICIENT_ATTENTION,
            MATH: SDPBackend.MATH,
        }
        stack.enter_context(sdpa_kernel([names[k] for k in choices.attention]))
    if choices.autocast is not None:
        import torch

        stack.enter_context(torch.autocast(device.split(":")[0], dtype=getattr(torch, choices.autocast)))
    return stack


__all__ = ["DeviceChoices", "attention_kernels", "choose", "kernel_context", "process_group_backend"]
