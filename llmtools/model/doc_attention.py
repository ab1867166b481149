"""Causal attention that stays inside documents, without a dense t x t mask.

A packed row holds several documents back to back; ``segment_ids`` (b, t) numbers them (1, 2, ...; 0 is
padding, which then forms a document of its own). Query ``q`` may attend key ``k`` when ``k <= q`` and
both lie in the same run of equal segment ids — Megatron's ``reset_attention_mask`` once the segment
ids count the EOD tokens before each position (:func:`llmtools.data.doc_mask.document_masks`).

:class:`DocumentSpans` turns the ids into document boundaries once per forward (every layer reuses
them); :func:`document_attention` then runs one of two kernels, picked by what the device offers, both
exact (no approximation, so their results differ only by floating-point summation order):

- ``varlen``: PyTorch's variable-length flash attention (``torch.nn.attention.varlen``) over the
  documents flattened into one stream with their cumulative lengths — CUDA, fp16/bf16.
- ``spans``: ``scaled_dot_product_attention(is_causal=True)`` on each document's slice (the fused flash
  kernel on CPU, flash / memory-efficient on CUDA): memory linear in the sequence, and each document
  computed exactly as if it ran alone. Rows whose documents share their boundaries go in one call.

FlexAttention block masks were considered and left out: on CPU (torch 2.13) eager ``flex_attention``
runs its unfused reference, which materialises the t x t scores, and the compiled one took ~2 minutes
to compile a single 256-token shape on this project's CI-sized machine (then it agrees to 1e-6); the
two kernels above need no compile and take the boundaries as they are.
"""

from __future__ import annotations

import inspect

import numpy as np
import torch
import torch.nn.functional as F

KERNELS = ("varlen", "spans")


class DocumentSpans:
    """Document boundaries of a (b, t) batch of segment ids, computed once on the host."""

    def __init__(self, segment_ids: torch.Tensor) -> None:
        ids = segment_ids.detach().to("cpu", torch.int64).numpy()
        b, t = ids.shape
        change = np.ones((b, t), dtype=bool)
        change[:, 1:] = ids[:, 1:] != ids[:, :-1]
        self.shape = (b, t)
        self.device = segment_ids.device
        # starts of every document of each row, and t as the closing bound
        self.rows: list[tuple[int, ...]] = [tuple(np.flatnonzero(c).tolist()) + (t,) for c in change]
        lengths = np.diff(np.concatenate([np.asarray(r) + i * t for i, r in enumerate(self.rows)]))
        lengths = lengths[lengths > 0]
        self.max_length = int(lengths.max()) if lengths.size else 0
        self._cu: torch.Tensor | None = None

    @property
    def single(self) -> bool:
        """Every row is one document: plain causal attention gives the same result."""
        return all(len(r) == 2 for r in self.rows)

    def cu_seqlens(self) -> torch.Tensor:
        """(documents + 1,) int32 cumulative lengths over the flattened batch (the varlen kernel's input)."""
        if self._cu is None:
            t = self.shape[1]
            starts = [s + i * t for i, r in enumerate(self.rows) for s in r[:-1]]
            self._cu = torch.tensor(starts + [self.shape[0] * t], dtype=torch.int32, device=self.device)
        return self._cu


def pick_kernel(q: torch.Tensor) -> str:
    """``varlen`` on CUDA in half precision when this torch has it, else ``spans``."""
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        try:
            from torch.nn.attention.varlen import varlen_attn  # noqa: F401
        except ImportError:
            return "spans"
        return "varlen"
    return "spans"


# Each batch has its own document boundaries, which the kernels slice by: traced inside a compiled
# layer (training.compile), every new layout would recompile the layer. It runs eager, the rest of the
# layer stays compiled, and its output is always contiguous (the kernels' layouts differ, and the
# compiled code after it is specialised on strides).
@torch.compiler.disable
def document_attention(*args, **kwargs) -> torch.Tensor:
    """:func:`_document_attention`, outside any compiled graph, as one contiguous (b, h, t, d) tensor."""
    return _document_attention(*args, **kwargs).contiguous()


def _document_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spans: DocumentSpans,
    enable_gqa: bool = False,
    kernel: str | None = None,
) -> torch.Tensor:
    """Causal attention within documents. q (b, h, t, d), k/v (b, h_kv, t, d) -> (b, h, t, d)."""
    kernel = kernel or pick_kernel(q)
    if kernel not in KERNELS:
        raise ValueError(f"unknown document-attention kernel {kernel!r} (one of {', '.join(KERNELS)})")
    if spans.single:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=enable_gqa)
    if kernel == "varlen":
        return _varlen(q, k, v, spans, enable_gqa)
    return _spans(q, k, v, spans, enable_gqa)


def _spans(q, k, v, spans: DocumentSpans, gqa: bool) -> torch.Tensor:
    groups: dict[tuple[int, ...], list[int]] = {}
    for row, bounds in enumerate(spans.rows):
        groups.setdefault(bounds, []).append(row)
    outs: list[torch.Tensor | None] = [None] * len(spans.rows)
    for bounds, rows in groups.items():
        index = torch.tensor(rows, device=q.device) if len(rows) < len(spans.rows) else None
        qs, ks, vs = (x if index is None else x.index_select(0, index) for x in (q, k, v))
        pieces = [
            F.scaled_dot_product_attention(
                qs[:, :, s:e], ks[:, :, s:e], vs[:, :, s:e], is_causal=True, enable_gqa=gqa
            )
            for s, e in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        out = torch.cat(pieces, dim=2)
        if index is None:
            return out
        for j, row in enumerate(rows):
            outs[row] = out[j]
    return torch.stack(outs)


def _varlen(q, k, v, spans: DocumentSpans, gqa: bool) -> torch.Tensor:
    from torch.nn.attention.varlen import varlen_attn

    b, h, t, d = q.shape
    cu = spans.cu_seqlens()

    def flat(x):  # (b, h, t, d) -> (b*t, h, d)
        return x.transpose(1, 2).reshape(b * t, x.shape[1], d)

    params = inspect.signature(varlen_attn).parameters
    # torch 2.10/2.11 name causality is_causal; later versions a (left, right) window, (-1, 0) = causal
    causal = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    if gqa and "enable_gqa" not in params:  # share each key/value head across its query group by copy
        k, v = (x.repeat_interleave(h // x.shape[1], dim=1) for x in (k, v))
    elif gqa:
        causal["enable_gqa"] = True
    out = varlen_attn(flat(q), flat(k), flat(v), cu, cu, spans.max_length, spans.max_length, **causal)
    return out.view(b, t, h, d).transpose(1, 2)


__all__ = ["DocumentSpans", "document_attention", "pick_kernel", "KERNELS"]
