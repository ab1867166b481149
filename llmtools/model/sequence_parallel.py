"""DeepSpeed-Ulysses on our decoder: each attention layer exchanges heads for sequence with all-to-all.

Every rank of a sequence-parallel group of N holds t/N consecutive tokens of each sequence. The
projections, RoPE (with the rank's own position ids), the MLP and the norms work token by token, so
only attention needs the whole sequence: DeepSpeed's ``DistributedAttention`` turns q/k/v from
(b, t/N, h, d) into (b, t, h/N, d) with one all-to-all each, the local attention runs over the full
sequence for h/N heads (causal, or within documents: the document boundaries are those of the full
row), and one all-to-all brings the output back to (b, t/N, h, d). Query and key/value heads must both
divide by N (each rank then holds whole query groups with their shared key/value head).

The layers keep their parameters and names: the exchange is attached to each :class:`Attention`
outside the module tree (no new parameters, buffers or state-dict keys).
"""

from __future__ import annotations

import torch.nn.functional as F

from llmtools.model.doc_attention import document_attention


def _local_attention(q, k, v, spans, gqa: bool):
    """(b, t, h/N, d) q/k/v of the full sequence -> (b, t, h/N, d): causal, or within documents."""
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    if spans is None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    else:
        out = document_attention(q, k, v, spans, enable_gqa=gqa)
    return out.transpose(1, 2)


def enable_sequence_parallel(model, group, size: int) -> int:
    """Give every attention layer of ``model`` DeepSpeed's head exchange over ``group``; the number of
    layers changed."""
    from deepspeed.sequence.layer import DistributedAttention

    from llmtools.model.llama import Attention

    changed = 0
    for module in model.modules():
        if isinstance(module, Attention):
            if module.num_heads % size or module.num_kv_heads % size:
                raise ValueError(
                    f"{module.num_heads} query / {module.num_kv_heads} key-value heads do not divide by {size}"
                )
            exchange = DistributedAttention(_local_attention, group, scatter_idx=2, gather_idx=1)
            object.__setattr__(module, "sequence_exchange", exchange)  # not a submodule: no new state keys
            changed += 1
    return changed


__all__ = ["enable_sequence_parallel"]
