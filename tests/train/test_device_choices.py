"""The device-dependent choices, asked for a "cuda" device on a machine without one."""

from __future__ import annotations

import pytest

from llmtools.train.device import EFFICIENT, FLASH, MATH, attention_kernels, choose, kernel_context


def test_cpu_keeps_torch_defaults():
    c = choose("cpu", precision="bf16", engine_casts=True, head_dim=64, gqa=True)
    assert (c.backend, c.fused_adamw, c.autocast, c.attention, c.fallback) == (
        "gloo",
        False,
        None,
        None,
        None,
    )


def test_cuda_gets_nccl_fused_adamw_and_flash():
    c = choose("cuda:0", precision="bf16", engine_casts=True, head_dim=64, gqa=True)
    assert (c.backend, c.fused_adamw, c.autocast) == ("nccl", True, None)  # DeepSpeed bf16 casts already
    assert c.attention == (FLASH,) and c.fallback is None  # grouped heads: flash only


def test_autocast_only_where_the_engine_does_not_cast():
    assert choose("cuda", precision="bf16", engine_casts=False, head_dim=64).autocast == "bfloat16"
    assert choose("cuda", precision="fp32", engine_casts=False, head_dim=64).autocast is None


@pytest.mark.parametrize(
    ("dtype", "head_dim", "masked", "gqa", "kernels"),
    [
        # what torch 2.11's can_use_flash/efficient_attention answered on an H200 (benchmarks/gpu_check.py)
        ("bf16", 128, False, False, (FLASH, EFFICIENT)),
        ("bf16", 64, False, True, (FLASH,)),  # grouped heads: the efficient kernel has no enable_gqa
        ("bf16", 64, True, False, (EFFICIENT,)),  # a document mask: flash takes is_causal only
        ("fp32", 64, True, False, (EFFICIENT,)),  # flash is half precision only
        ("fp32", 64, False, True, (MATH,)),
        ("bf16", 64, True, True, (MATH,)),  # a mask and grouped heads: no fused kernel takes both
        ("bf16", 320, False, False, (MATH,)),  # past both kernels' head size
        ("fp32", 6, False, False, (MATH,)),
    ],
)
def test_attention_kernels_by_shape(dtype, head_dim, masked, gqa, kernels):
    got, why = attention_kernels(dtype, head_dim, masked, gqa)
    assert got == kernels
    assert (why is None) == (MATH not in kernels)


def test_math_fallback_warns_once_and_runs():
    import torch
    import torch.nn.functional as F

    c = choose("cuda", precision="bf16", engine_casts=True, head_dim=320)
    assert c.attention == (MATH,) and "head_dim 320" in c.fallback
    said = []
    for _ in range(2):  # the math kernel exists on CPU too: the restriction itself is exercised here
        with kernel_context(c, "cpu", warn=said.append):
            q = torch.randn(1, 2, 8, 16)
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert len(said) == 1 and "math kernel" in said[0]
