"""Training FLOPs per token, the numerator of MFU.

The formula (Kaplan et al. 2020, PaLM appendix B, Megatron-LM's ``num_floating_point_operations``)::

    flops_per_token = 6 * N + 12 * L * H * Q * T

* ``N``: weights that take part in a matrix multiply — every projection of every layer
  (q, k, v, o, gate, up, down) plus the output projection ``lm_head`` (counted even when tied to the
  embedding, because the multiply happens). Not counted: the embedding lookup and norm weights.
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
    """N of the formula: weights used in matrix multiplies (layers + lm_head, no embedding lookup)."""
    h, d = config.hidden_size, config.head_dim
    q, kv = config.num_attention_heads, config.num_key_value_heads
    per_layer = h * q * d + 2 * h * kv * d + q * d * h + 3 * h * config.intermediate_size
    return config.num_hidden_layers * per_layer + config.vocab_size * h


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
