"""Our decoder against transformers' LlamaForCausalLM / Qwen3ForCausalLM: same weights, same numbers."""

from __future__ import annotations

import pytest
import torch

from llmtools.model.config import ModelConfig
from llmtools.model.llama import LlamaForCausalLM, rope_inv_freq
from llmtools.model.presets import load_model_config
from tests.numerics import logits_atol, mean_loss_atol

transformers = pytest.importorskip("transformers")

VOCAB = 320
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}

SHAPES = {
    # grouped-query attention: 4 query heads share 2 key/value heads; untied head
    "gqa": dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False),
    # tied embeddings, plain multi-head attention
    "tied": dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True),
    # Llama-3.1-style RoPE scaling (sequence longer than the "original" context) with GQA 4/1
    "llama3-rope": dict(
        num_attention_heads=4, num_key_value_heads=1, rope_scaling=LLAMA3_SCALING, rope_theta=500000.0
    ),
    # Qwen3: QK-norm, head_dim larger than hidden/heads, tied
    "qwen3": dict(
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        qk_norm=True,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
    ),
}


def make_pair(shape: str, seed: int = 0):
    """A transformers model with its own random init, and ours holding the very same weights."""
    fields = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=3,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
    )
    fields.update(SHAPES[shape])
    ours_config = ModelConfig(**fields)
    hf_fields = {k: v for k, v in fields.items() if k != "qk_norm"}
    torch.manual_seed(seed)
    if ours_config.qk_norm:
        hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**hf_fields))
    else:
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**hf_fields))
    hf.eval()
    # Give the norms non-trivial weights so a mix-up between them would show.
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    ours = LlamaForCausalLM(ours_config)
    result = ours.load_state_dict(hf.state_dict(), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    ours.eval()
    return ours, hf


@pytest.mark.numerics
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_logits_equal_transformers(shape):
    ours, hf = make_pair(shape)
    ids = torch.randint(0, VOCAB, (2, 80), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(input_ids=ids).logits
        got = ours(ids)
    assert got.shape == (2, 80, VOCAB)
    # fp32 decoder twice, in another op order: logits_atol's rounding model (tests/numerics.py)
    torch.testing.assert_close(got, expected, atol=logits_atol(expected, hf.config), rtol=0)


@pytest.mark.numerics
@pytest.mark.parametrize("shape", ["gqa", "qwen3"])
def test_loss_and_gradients_equal_transformers(shape):
    ours, hf = make_pair(shape)
    ids = torch.randint(0, VOCAB, (2, 48), generator=torch.Generator().manual_seed(2))
    # HF shifts inside; ours takes shifted labels (Megatron's convention) and ignores -100.
    labels = torch.cat([ids[:, 1:], torch.full((2, 1), -100)], dim=1)
    hf_loss = hf(input_ids=ids, labels=ids).loss
    our_loss = ours.loss(ids, labels)
    # fp32 token-mean loss from two implementations: mean_loss_atol (tests/numerics.py)
    torch.testing.assert_close(
        our_loss, hf_loss, atol=mean_loss_atol(hf_loss, int((labels != -100).sum())), rtol=0
    )
    hf_loss.backward()
    our_loss.backward()
    theirs = dict(hf.named_parameters())
    for name, param in ours.named_parameters():
        # fp32 gradients through the same decoder: the forward's ~4e-6 relative per layer, back again: rtol 1e-4 covers it, atol for entries near 0
        torch.testing.assert_close(param.grad, theirs[name].grad, atol=1e-6, rtol=1e-4, msg=name)


def test_parameter_names_are_huggingface_names():
    for shape in SHAPES:
        ours, hf = make_pair(shape)
        assert list(ours.state_dict()) == list(hf.state_dict())
        assert {n: p.shape for n, p in ours.state_dict().items()} == {
            n: p.shape for n, p in hf.state_dict().items()
        }


def test_tied_embeddings_share_one_tensor():
    model = LlamaForCausalLM(
        ModelConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            tie_word_embeddings=True,
        )
    )
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.num_parameters() == model.config.num_parameters()


@pytest.mark.numerics
def test_loss_mask_weights_positions():
    torch.manual_seed(0)
    model = LlamaForCausalLM(load_model_config("tiny"))
    ids = torch.randint(0, 4096, (2, 16))
    labels = torch.randint(0, 4096, (2, 16))
    mask = torch.zeros(2, 16)
    mask[0, :5] = 1
    mask[1, 10:] = 1
    with torch.no_grad():
        logits = model(ids).float()
        ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none")
        expected = (ce * mask.flatten()).sum() / mask.sum()
        # the same fp32 cross-entropy summed by another reduction (masked sum / count vs mean): default fp32 tolerance (rtol 1.3e-6, ~11 ulps)
        torch.testing.assert_close(model.loss(ids, labels, mask), expected)
        # the same fp32 cross-entropy, mean vs masked sum / count: default fp32 tolerance
        torch.testing.assert_close(model.loss(ids, labels), ce.mean())


@pytest.mark.numerics
def test_explicit_positions_equal_default():
    torch.manual_seed(0)
    model = LlamaForCausalLM(load_model_config("tiny")).eval()
    ids = torch.randint(0, 4096, (2, 24))
    positions = torch.arange(24).expand(2, 24)
    with torch.no_grad():
        # fp32: explicit positions take another gather/cast path to the same RoPE angles: a few ulps of O(1) activations, 1e-6
        torch.testing.assert_close(model(ids, positions), model(ids), atol=1e-6, rtol=0)


@pytest.mark.numerics
def test_causal_future_tokens_do_not_change_the_past():
    torch.manual_seed(0)
    model = LlamaForCausalLM(load_model_config("tiny")).eval()
    ids = torch.randint(0, 4096, (1, 32))
    changed = ids.clone()
    changed[0, 20:] = (changed[0, 20:] + 7) % 4096
    with torch.no_grad():
        a, b = model(ids), model(changed)
    # fp32: the same causal attention over a longer context; the masked keys add exact zeros, so only summation order moves: 1e-6
    torch.testing.assert_close(a[:, :20], b[:, :20], atol=1e-6, rtol=0)
    # the opposite claim: a changed future token moves these logits by far more than allclose's defaults
    assert not torch.allclose(a[:, 20:], b[:, 20:])


@pytest.mark.numerics
def test_gradient_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    model = LlamaForCausalLM(load_model_config("tiny"))
    ids = torch.randint(0, 4096, (2, 32))
    model.loss(ids, ids).backward()
    plain = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.gradient_checkpointing = True
    model.loss(ids, ids).backward()
    for name, param in model.named_parameters():
        # fp32: recomputed activations are the same kernels on the same inputs; gradients accumulate in another order: 1e-7 on entries ~1e-2
        torch.testing.assert_close(param.grad, plain[name], atol=1e-7, rtol=0, msg=name)


def test_init_is_seeded_normal_and_norms_are_one():
    config = load_model_config("tiny")
    torch.manual_seed(3)
    a = LlamaForCausalLM(config)
    torch.manual_seed(3)
    b = LlamaForCausalLM(config)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
        if "norm" in name:
            assert torch.all(pa == 1), name
        else:
            # a sample of >=12k N(0, 0.02) draws (k/v_proj 64x192): mean within 4 std errors (4 x 0.02/sqrt(12k) ~ 7e-4) < 2e-3
            assert abs(pa.mean().item()) < 2e-3, name
            # the sample std of the same draws: 4 std errors are 4/sqrt(2n) ~ 2.6% of it at n >= 12k, < 5%
            assert pa.std().item() == pytest.approx(config.initializer_range, rel=0.05), name


@pytest.mark.numerics
def test_bf16_forward_is_close_to_fp32_and_rope_stays_fp32():
    torch.manual_seed(0)
    model = LlamaForCausalLM(load_model_config("tiny")).eval()
    ids = torch.randint(0, 4096, (1, 64))
    with torch.no_grad():
        full = model(ids)
        model.to(torch.bfloat16)
        half = model(ids)
    assert half.dtype == torch.bfloat16
    # bf16 weights and activations: u = 2^-8 per rounding, through 4 layers of O(1) logits: a few 1e-2 at most
    assert (half.float() - full).abs().max().item() < 0.05
    # The frequencies are not a buffer, so casting the model cannot round them.
    assert not list(model.buffers())
    assert rope_inv_freq(model.config).dtype == torch.float32


@pytest.mark.numerics
def test_llama3_rope_scaling_matches_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_config = transformers.LlamaConfig(
        hidden_size=256,
        num_attention_heads=2,
        rope_theta=500000.0,
        rope_scaling=dict(LLAMA3_SCALING),
        max_position_embeddings=1024,
    )
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_config, "cpu")
    ours = ModelConfig(
        hidden_size=256,
        num_attention_heads=2,
        rope_theta=500000.0,
        rope_scaling=LLAMA3_SCALING,
        max_position_embeddings=1024,
    )
    # bitwise: both compute the frequencies with the same float64/fp32 formula and cast once
    torch.testing.assert_close(rope_inv_freq(ours), expected.float(), atol=0, rtol=0)


def test_meta_device_build_allocates_nothing():
    with torch.device("meta"):
        model = LlamaForCausalLM(load_model_config("llama3-8b"))
    assert all(p.is_meta for p in model.parameters())
    assert model.num_parameters() == 8_030_261_248


@pytest.mark.numerics
@pytest.mark.parametrize("shape", ["gqa", "qwen3"])
def test_bf16_logits_track_transformers_bf16(shape):
    """In bf16 both cast at the same places (RMSNorm in fp32, RoPE tables in fp32): a few bf16 ulps."""
    ours, hf = make_pair(shape)
    ours.to(torch.bfloat16)
    hf.to(torch.bfloat16)
    ids = torch.randint(0, VOCAB, (2, 64), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        got, expected = ours(ids).float(), hf(input_ids=ids).logits.float()
    # bf16 in both implementations, rounded in other places: a few bf16 ulps (2^-7 ~ 8e-3) of O(1) logits
    assert (got - expected).abs().max().item() < 0.02
