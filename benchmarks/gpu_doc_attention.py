#!/usr/bin/env python3
"""Document attention's kernels on a GPU: do ``varlen`` and ``spans`` agree with a dense fp32 reference, and
what does each cost? (llmtools/model/doc_attention.py)

The CPU suite checks ``spans`` against the dense mask and feeds ``varlen`` through a stand-in; only a CUDA
device runs PyTorch's real variable-length flash kernel. For random packed layouts (documents of 64 to
2048 tokens, the GPU check's ``docmask`` rows; with and without grouped-query attention) each kernel runs
forward and backward in bf16, and its output and its q/k/v gradients are compared with the same inputs
upcast to fp32 through the dense-mask SDPA.

Bounds, from bf16's unit roundoff u = 2^-8 (the compared tensors are O(1): inputs ~ N(0, 1)):
- output: a flash kernel keeps scores and the running softmax in fp32 and rounds the probabilities (once,
  before P·V) and the output (once) to bf16: |error| <= u·Σp|v| + u·|o| <= 2u·max|v|. Asserted with a
  factor 2 of headroom: 4u·max|v|.
- gradients: backward chains several bf16-rounded products (dS = P∘(dP - D), then dS·K, dSᵀ·Q, Pᵀ·dO) whose
  error has no bound this simple; each kernel's gradient error is compared with the dense-mask bf16 SDPA's
  own (whichever kernel torch picks for a dense mask: a trusted implementation of the same arithmetic): at most 4x it plus
  4u·max|grad| (a wrong boundary gives errors of the gradient's own size, ~100x more).
Timing: forward + backward, the median of 10 after 3 warm-ups, each kernel on the same inputs.

    python benchmarks/gpu_doc_attention.py --out OUT          # CUDA: varlen, spans, dense-mask; exit 1 if off
    python benchmarks/gpu_doc_attention.py --cpu --out /tmp/x  # the script end to end on CPU (spans only, fp32)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from llmtools.model.doc_attention import DocumentSpans, _document_attention, pick_kernel  # noqa: E402
from llmtools.model.llama import segment_causal_mask  # noqa: E402

U_BF16 = 2.0**-8


def layout(rng: np.random.Generator, batch: int, seq: int, low: int, high: int) -> torch.Tensor:
    """(batch, seq) segment ids: documents of random lengths in [low, high], cut at the row's end."""
    rows = []
    for _ in range(batch):
        ids, doc = [], 1
        while len(ids) < seq:
            ids += [doc] * int(rng.integers(low, high + 1))
            doc += 1
        rows.append(ids[:seq])
    return torch.tensor(rows)


def run_kernel(kernel, q, k, v, spans, segments, gqa, grad_out):
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    if kernel == "dense-mask":
        mask = segment_causal_mask(segments.to(q.device))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    else:
        out = _document_attention(q, k, v, spans, enable_gqa=gqa, kernel=kernel)
    out.backward(grad_out)
    return out.detach(), q.grad, k.grad, v.grad


def timed(fn, device, repeats: int = 10, warmup: int = 3) -> float:
    times = []
    for i in range(warmup + repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def check_case(
    name, device, dtype, kernels, batch, seq, heads, kv_heads, dim, seed, lengths=(64, 2048)
) -> dict:
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    segments = layout(rng, batch, seq, *lengths)
    spans = DocumentSpans(segments.to(device))
    q = torch.randn(batch, heads, seq, dim, generator=gen).to(device, dtype)
    k = torch.randn(batch, kv_heads, seq, dim, generator=gen).to(device, dtype)
    v = torch.randn(batch, kv_heads, seq, dim, generator=gen).to(device, dtype)
    grad_out = torch.randn(batch, heads, seq, dim, generator=gen).to(device, dtype)
    gqa = kv_heads != heads
    # the reference: the same (rounded) inputs in fp32 through the dense mask
    ref = run_kernel("dense-mask", *(x.float() for x in (q, k, v)), spans, segments, gqa, grad_out.float())
    case = {
        "name": name,
        "batch": batch,
        "seq": seq,
        "heads": heads,
        "kv_heads": kv_heads,
        "dim": dim,
        "documents": sum(len(r) - 1 for r in spans.rows),
        "kernels": {},
    }
    errors = {}
    for kernel in kernels:
        got = run_kernel(kernel, q, k, v, spans, segments, gqa, grad_out)
        errors[kernel] = [float((g.float() - r).abs().max()) for g, r in zip(got, ref, strict=True)]
        ms = 1e3 * timed(
            lambda kernel=kernel: run_kernel(kernel, q, k, v, spans, segments, gqa, grad_out), device
        )
        case["kernels"][kernel] = {
            "max_abs_error": dict(zip(("out", "dq", "dk", "dv"), errors[kernel], strict=True)),
            "fwd_bwd_ms": round(ms, 3),
        }
    scale = [float(r.abs().max()) for r in ref]
    failures = []
    for kernel in kernels:
        if kernel == "dense-mask":
            continue
        out_bound = 4 * U_BF16 * float(v.float().abs().max())
        if errors[kernel][0] > out_bound:
            failures.append(f"{kernel} output off by {errors[kernel][0]:.3g} > {out_bound:.3g}")
        if "dense-mask" in errors:
            for i, grad in enumerate(("dq", "dk", "dv"), start=1):
                bound = 4 * errors["dense-mask"][i] + 4 * U_BF16 * scale[i]
                if errors[kernel][i] > bound:
                    failures.append(f"{kernel} {grad} off by {errors[kernel][i]:.3g} > {bound:.3g}")
    case["failures"] = failures
    return case


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cpu", action="store_true", help="CPU, fp32, small shapes: the script end to end")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.cpu:
        device, dtype, kernels = torch.device("cpu"), torch.float32, ["spans", "dense-mask"]
        shapes = [("mha", 2, 512, 4, 4, 32), ("gqa", 2, 512, 4, 2, 32)]
        lengths = (16, 256)
    else:
        device, dtype = torch.device("cuda"), torch.bfloat16
        picked = pick_kernel(torch.empty(1, device=device, dtype=dtype))
        kernels = (["varlen"] if picked == "varlen" else []) + ["spans", "dense-mask"]
        shapes = [
            ("1b-mha", 8, 2048, 16, 16, 128),
            ("1b-gqa", 8, 2048, 16, 4, 128),
            ("long", 1, 16384, 16, 4, 128),
        ]
        lengths = (64, 2048)
    result = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "dtype": str(dtype),
        "picked_kernel": pick_kernel(torch.empty(1, device=device, dtype=dtype)),
        "cases": [
            check_case(n, device, dtype, kernels, *shape, seed=i, lengths=lengths)
            for i, (n, *shape) in enumerate(shapes)
        ],
    }
    (args.out / "gpu_doc_attention.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 1 if any(c["failures"] for c in result["cases"]) else 0


if __name__ == "__main__":
    sys.exit(main())
