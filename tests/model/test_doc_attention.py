"""Document-aware attention: Megatron's masks and positions, and packed rows equal their documents alone."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from llmtools.data.doc_mask import dense_mask, document_masks
from llmtools.model.config import ModelConfig
from llmtools.model.doc_attention import DocumentSpans, document_attention, pick_kernel
from llmtools.model.llama import LlamaForCausalLM, segment_causal_mask

EOD = 0
FLAGS = list(itertools.product([False, True], repeat=3))


def _samples() -> np.ndarray:
    """Rows with an EOD first, last, twice in a row, none at all, and at random places."""
    rng = np.random.default_rng(0)
    rows = rng.integers(1, 50, size=(6, 24))
    rows[0, [0, 5, 6, 23]] = EOD
    rows[1, [3, 11, 17]] = EOD
    rows[3, [23]] = EOD
    rows[4, rng.choice(24, 7, replace=False)] = EOD
    rows[5, :] = EOD
    return rows  # row 2 has no EOD


@pytest.mark.parametrize("reset_position_ids,reset_attention_mask,eod_mask_loss", FLAGS)
def test_masks_and_positions_equal_megatron_core(reset_position_ids, reset_attention_mask, eod_mask_loss):
    gpt_dataset = pytest.importorskip(
        "megatron.core.datasets.gpt_dataset", reason="megatron-core is in the test extra"
    )
    samples = _samples()
    ours = document_masks(
        samples,
        EOD,
        reset_position_ids=reset_position_ids,
        reset_attention_mask=reset_attention_mask,
        eod_mask_loss=eod_mask_loss,
    )
    for row, sample in enumerate(samples):
        attention, loss_mask, positions = gpt_dataset._get_ltor_masks_and_position_ids(
            torch.from_numpy(sample),
            EOD,
            reset_position_ids,
            reset_attention_mask,
            eod_mask_loss,
            create_attention_mask=True,
        )
        assert np.array_equal(ours["loss_mask"][row], loss_mask.numpy())
        assert np.array_equal(ours["position_ids"][row], positions.numpy())
        segments = ours["segment_ids"]
        if segments is None:  # no reset: one document, plain causal attention
            segments = np.ones_like(samples)
        assert np.array_equal(dense_mask(segments[row : row + 1]), attention.numpy()), row


def _model(**fields) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=fields.pop("num_key_value_heads", 2),
        max_position_embeddings=128,
        **fields,
    )
    return LlamaForCausalLM(config)


def _per_token(model, tokens, labels, **kwargs):
    logits = model(tokens, **kwargs).float()
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(labels.shape)


def _grads(model) -> dict[str, torch.Tensor]:
    out = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("shape", ["gqa", "qwen3", "moe"])
def test_packed_row_equals_its_documents_one_by_one(shape):
    fields = {
        "gqa": {},
        "qwen3": {"qk_norm": True, "head_dim": 16},
        "moe": {"num_experts": 4, "num_experts_per_tok": 2},  # dropless: routing is per token
    }[shape]
    model = _model(**fields)
    rng = np.random.default_rng(1)
    # two rows of 40 inputs (41 tokens): documents end with EOD; the rows' boundaries differ
    lengths = [[7, 13, 1, 19, 1], [25, 16]]
    rows = []
    for doc_lengths in lengths:
        docs = [np.append(rng.integers(1, 64, size=n - 1), EOD) for n in doc_lengths]
        rows.append(np.concatenate(docs))
    samples = np.stack(rows)
    tokens, labels = samples[:, :-1], samples[:, 1:]
    masks = document_masks(
        tokens, EOD, reset_position_ids=True, reset_attention_mask=True, eod_mask_loss=True
    )
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).long()  # noqa: E731
    packed = _per_token(
        model,
        t(tokens),
        t(labels),
        position_ids=t(masks["position_ids"]),
        segment_ids=t(masks["segment_ids"]),
    )
    mask = torch.from_numpy(masks["loss_mask"])
    (packed * mask).sum().backward()
    packed_grads = _grads(model)

    alone = torch.zeros_like(packed)
    total = 0.0
    for row, doc_lengths in enumerate(lengths):
        start = 0
        for n in doc_lengths:
            end = min(start + n, tokens.shape[1])  # the last document's EOD is a label, not an input
            losses = _per_token(
                model, t(tokens[row : row + 1, start:end]), t(labels[row : row + 1, start:end])
            )
            alone[row, start:end] = losses[0].detach()
            total = total + (losses[0] * mask[row, start:end]).sum()
            start = end
    total.backward()
    alone_grads = _grads(model)
    # fp32 throughout: each token's loss is the same computation over the same document, only the
    # order of the attention's sums differs (a few ulps of values ~4): 1e-5 absolute
    torch.testing.assert_close(packed.detach(), alone, rtol=0, atol=1e-5)
    for name, grad in packed_grads.items():
        # gradients sum ~80 token contributions per parameter; fp32 reordering: 1e-5 relative to the largest
        scale = float(alone_grads[name].abs().max()) or 1.0
        # fp32 reordering of ~80 summed contributions: 1e-5 of the largest gradient
        torch.testing.assert_close(grad, alone_grads[name], rtol=0, atol=1e-5 * max(scale, 1.0), msg=name)


def test_document_attention_equals_the_dense_mask_with_padding_and_shared_rows():
    torch.manual_seed(0)
    b, h, t, d = 3, 4, 33, 8
    q, k, v = (torch.randn(b, h, t, d, requires_grad=True) for _ in range(3))
    segments = torch.tensor([[1] * 10 + [2] * 20 + [0] * 3, [1] * 33, [1] * 10 + [2] * 20 + [0] * 3])
    spans = DocumentSpans(segments)
    assert spans.rows == [(0, 10, 30, 33), (0, 33), (0, 10, 30, 33)]
    ours = document_attention(q, k, v, spans)
    dense = F.scaled_dot_product_attention(q, k, v, attn_mask=segment_causal_mask(segments))
    # fp32, the same softmax over the same keys; only the kernels' summation order differs
    torch.testing.assert_close(ours, dense, rtol=0, atol=1e-5)
    g = torch.randn_like(ours)
    a = torch.autograd.grad(ours, (q, k, v), g)
    c = torch.autograd.grad(dense, (q, k, v), g)
    for x, y in zip(a, c, strict=True):
        # the same fp32 softmax backward over the same keys: only the summation order differs
        torch.testing.assert_close(x, y, rtol=0, atol=1e-5)


def test_cpu_picks_per_document_spans_and_unknown_kernels_are_refused():
    q = torch.zeros(1, 1, 4, 2)
    assert pick_kernel(q) == "spans"
    with pytest.raises(ValueError, match="unknown document-attention kernel"):
        document_attention(q, q, q, DocumentSpans(torch.tensor([[1, 1, 2, 2]])), kernel="dense")


def test_varlen_kernel_feeds_the_flattened_documents_with_their_cumulative_lengths(monkeypatch):
    """The CUDA kernel's inputs, checked on CPU: a stand-in for torch's varlen_attn (the reference
    causal attention over each [cu[i], cu[i+1]) of the flattened stream) gives the dense mask's result."""
    import torch.nn.attention.varlen as varlen

    def reference(q, k, v, cu_q, cu_k, max_q, max_k, *, window_size=(-1, -1), enable_gqa=False, **_):
        assert torch.equal(cu_q, cu_k) and window_size == (-1, 0) and cu_q.dtype == torch.int32
        cu = cu_q.tolist()
        assert max_q == max(b - a for a, b in zip(cu[:-1], cu[1:], strict=True))
        pieces = []
        for a, b in zip(cu[:-1], cu[1:], strict=True):
            qs, ks, vs = (x[a:b].transpose(0, 1) for x in (q, k, v))
            pieces.append(
                F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=enable_gqa).transpose(
                    0, 1
                )
            )
        return torch.cat(pieces)

    monkeypatch.setattr(varlen, "varlen_attn", reference)
    torch.manual_seed(0)
    q = torch.randn(2, 4, 12, 8)
    k, v = torch.randn(2, 2, 12, 8), torch.randn(2, 2, 12, 8)
    segments = torch.tensor([[1] * 5 + [2] * 7, [1] * 3 + [2] * 3 + [3] * 6])
    ours = document_attention(q, k, v, DocumentSpans(segments), enable_gqa=True, kernel="varlen")
    dense = F.scaled_dot_product_attention(q, k, v, attn_mask=segment_causal_mask(segments), enable_gqa=True)
    torch.testing.assert_close(ours, dense, rtol=0, atol=1e-5)  # fp32, summation order only
