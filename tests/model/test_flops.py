"""flops_per_token = 6N + 12 L H Q T, checked against a hand count and against torch's FLOP counter."""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from llmtools.model.config import ModelConfig
from llmtools.model.flops import flops_per_token, forward_flops_per_token, matmul_parameters, mfu
from llmtools.model.llama import LlamaForCausalLM
from llmtools.model.presets import load_model_config


def hand_count_forward(c: ModelConfig, seq: int) -> int:
    """Forward FLOPs of one token, multiply by multiply: 2 * in * out per projection."""
    h, d, nq, nkv, f = (
        c.hidden_size,
        c.head_dim,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.intermediate_size,
    )
    q = 2 * h * nq * d
    k = v = 2 * h * nkv * d
    o = 2 * nq * d * h
    scores = 2 * nq * d * seq  # q . k for every one of the seq keys (causal mask not discounted)
    weighted = 2 * nq * d * seq  # probabilities times values
    mlp = 3 * 2 * h * f
    head = 2 * h * c.vocab_size
    return c.num_hidden_layers * (q + k + v + o + scores + weighted + mlp) + head


def test_formula_equals_hand_count_for_presets():
    for name, seq in [("tiny", 256), ("llama3-8b", 8192), ("qwen3-0.6b", 4096), ("1b", 2048)]:
        config = load_model_config(name)
        assert flops_per_token(config, seq) == 3 * hand_count_forward(config, seq)
        assert forward_flops_per_token(config, seq) == hand_count_forward(config, seq)


def test_llama3_8b_n_is_parameters_minus_embedding():
    config = load_model_config("llama3-8b")
    # Untied: lm_head is a matmul, the embedding lookup is not.
    assert (
        matmul_parameters(config)
        == config.num_parameters()
        - config.vocab_size * config.hidden_size
        - (config.num_hidden_layers * 2 + 1) * config.hidden_size
    )
    # 6 * 7.50e9 (weights) + 12 * 32 * 32 * 128 * 8192 (attention, 1.29e10) = 5.79e10 at 8k context.
    assert matmul_parameters(config) == 7_504_658_432
    assert flops_per_token(config, 8192) == 6 * 7_504_658_432 + 12 * 32 * 32 * 128 * 8192


def test_torch_flop_counter_agrees_on_a_training_step():
    config = load_model_config("tiny")
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    batch, seq = 2, 64
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    counter = FlopCounterMode(display=False)
    # The math backend runs attention as batched matmuls, which the counter can see.
    with counter, sdpa_kernel(SDPBackend.MATH):
        model.loss(ids, ids).backward()
    assert counter.get_total_flops() == flops_per_token(config, seq) * batch * seq


def test_mfu():
    config = load_model_config("tiny")
    per_token = flops_per_token(config, 128)
    assert mfu(1000.0, config, 128, peak_flops=per_token * 2000.0) == 0.5


def hand_count_moe_forward(c: ModelConfig, seq: int) -> int:
    """A MoE token's forward FLOPs: attention as above, then per MoE layer the router (2 h E) and its k
    experts' three projections (k * 3 * 2 h I); never the E - k experts it does not visit."""
    h, d, nq, nkv = c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads
    attention = 2 * h * nq * d + 2 * 2 * h * nkv * d + 2 * nq * d * h + 2 * 2 * nq * d * seq
    router = 2 * h * c.num_experts
    experts = c.num_experts_per_tok * 3 * 2 * h * c.moe_intermediate_size
    dense_mlp = 3 * 2 * h * c.intermediate_size
    layers = sum(
        attention + (router + experts if c.is_moe_layer(i) else dense_mlp) for i in range(c.num_hidden_layers)
    )
    return layers + 2 * h * c.vocab_size


def test_moe_flops_count_active_parameters_only():
    for name, seq in [("tiny-moe", 256), ("qwen3-30b-a3b", 4096), ("mixtral-8x7b", 4096)]:
        config = load_model_config(name)
        assert flops_per_token(config, seq) == 3 * hand_count_moe_forward(config, seq)
    # Qwen3-30B-A3B: N is the 3.35B active parameters less the embedding lookup and the norm weights.
    config = load_model_config("qwen3-30b-a3b")
    norms = (2 * config.hidden_size + 2 * config.head_dim) * config.num_hidden_layers + config.hidden_size
    assert (
        matmul_parameters(config) == config.num_active_parameters() - 151936 * 2048 - norms == 3_041_656_832
    )
    # A layer with mlp_only_layers keeps its dense MLP in the count.
    mixed = ModelConfig(**{**config.to_dict(), "mlp_only_layers": [0]})
    assert matmul_parameters(mixed) - matmul_parameters(config) == 3 * 2048 * 6144 - (
        128 * 2048 + 8 * 3 * 2048 * 768
    )


def test_torch_flop_counter_agrees_on_a_moe_training_step():
    config = ModelConfig(
        **{**load_model_config("tiny-moe").to_dict(), "num_hidden_layers": 2, "mlp_only_layers": [1]}
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    batch, seq = 2, 32
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    counter = FlopCounterMode(display=False)
    with counter, sdpa_kernel(SDPBackend.MATH):
        model.loss(ids, ids).backward()
    # dropless: every token runs exactly k experts, so the measured matmuls are the active-parameter count
    assert counter.get_total_flops() == flops_per_token(config, seq) * batch * seq
