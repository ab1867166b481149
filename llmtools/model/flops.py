"""Training FLOPs per token, the numerator of MFU.

The formula (Kaplan et al. 2020, PaLM appendix B, Megatron-LM's ``num_floating_point_operations``)::

    flops_per_token = 6 * N + 12 * L * H * Q * T

* ``N``: weights that take part in a matrix multiply *for one token* — every projection of every layer
  (q, k, v, o, gate, up, down) plus the output projection ``lm_head`` (counted even when tied to the
  embedding, because the multiply happens). Not counted: the embedding lookup and norm weights.
  In a MoE layer a token meets the router (``E * h``), its ``k = num_experts_per_tok`` experts
  (``k * 3 * h * moe_intermediate_size``) and the shared expert with its gate when there is one
  (``3 * h * shared_expert_intermediate_size + h``): only these *active* weights count, not the other
  ``E - k`` experts (the convention of Megatron-LM's MoE FLOPs and of MoE model cards' "active
  parameters"). Tokens dropped by a capacity factor are still counted (MFU is model FLOPs).
* ``6 = 2 (multiply + add) * 3 (forward + two backward matmuls)``.
* ``12 * L * H * Q * T``: attention scores ``Q K^T`` and the weighted sum ``A V``; per token and
  layer each is ``2 * H * Q * T`` FLOPs forward (H query heads of width Q over T positions), times 3
  for forward + backward. T is the full sequence length: the causal mask is not discounted (the
  PaLM/Megatron convention, so MFU figures are comparable with theirs).

Element-wise work (norms, SiLU, RoPE, softmax, the loss) is left out, as in those references.
Activation recomputation is not counted either: MFU measures useful model FLOPs, not hardware FLOPs.
"""

from __future__ import annotations

from llmtools.model.config import ModelConfig


def matmul_parameters(config: ModelConfig) -> int:
    """N of the formula: weights one token multiplies by (layers' active weights + lm_head, no embedding
    lookup, no norms)."""
    h, d = config.hidden_size, config.head_dim
    q, kv = config.num_attention_heads, config.num_key_value_heads
    attention = h * q * d + 2 * h * kv * d + q * d * h
    total = config.vocab_size * h
    for index in range(config.num_hidden_layers):
        total += attention
        if config.is_moe_layer(index):
            total += (
                config.num_experts * h + config.num_experts_per_tok * 3 * h * config.moe_intermediate_size
            )
            if config.shared_expert_intermediate_size:
                total += 3 * h * config.shared_expert_intermediate_size + h
        else:
            total += 3 * h * config.intermediate_size
    return total


def flops_per_token(config: ModelConfig, seq_length: int) -> float:
    """Training (forward + backward) FLOPs per token: ``6 N + 12 L H Q T`` (see the module docstring)."""
    attention = 12 * config.num_hidden_layers * config.num_attention_heads * config.head_dim * seq_length
    return float(6 * matmul_parameters(config) + attention)


def forward_flops_per_token(config: ModelConfig, seq_length: int) -> float:
    """Forward-only FLOPs per token (evaluation): a third of :func:`flops_per_token`."""
    return flops_per_token(config, seq_length) / 3


def mfu(tokens_per_s: float, config: ModelConfig, seq_length: int, peak_flops: float) -> float:
    """Model FLOPs utilisation: achieved training FLOP/s over the hardware's peak (all devices)."""
    return tokens_per_s * flops_per_token(config, seq_length) / peak_flops


__all__ = ["flops_per_token", "forward_flops_per_token", "matmul_parameters", "mfu"]
