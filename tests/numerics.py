"""Tolerances derived from what is compared, so that a test passes on every CPU, not only the one it was
tuned on: kernels differ per CPU (ATen's scalar / AVX2 / AVX-512 paths, oneDNN's ISA, bf16 instructions),
and with them the order in which a reduction adds and where bf16 rounds. None of these functions knows
a machine; each is the rounding model of one kind of comparison (docs/cpu-kernels.md lists the levels).

Terms: ``u`` is the unit roundoff of a dtype (half its machine epsilon: 2^-24 for fp32, 2^-8 for bf16).
Two correct implementations of one computation differ by rounding errors that behave as independent
zero-mean draws (Higham & Mary, "A New Approach to Probabilistic Rounding Error Analysis", 2019): a sum
or dot product of ``n`` terms carries ``lambda * sqrt(n) * u`` of the sum of the terms' magnitudes, with
``lambda`` a confidence multiple (``LAMBDA`` = 4: a miss has probability < 7e-4 per compared value).
The worst-case bound, ``n * u``, is not used: at these sizes it allows differences a real bug makes.

A bitwise comparison (``atol=0``) belongs only where the code promises the same bits on every CPU: the
same process repeating the same kernels (exact resume on one machine), a pure permutation or copy of
values (no arithmetic), or integer/exactly-representable results. Each such test says which.
"""

from __future__ import annotations

import math

# Confidence multiple of the probabilistic bounds (P(miss) <= 2 exp(-LAMBDA^2 / 2) ~ 7e-4 per value).
LAMBDA = 4.0

_EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}


def unit_roundoff(dtype="float32") -> float:
    """Half the machine epsilon of ``dtype`` (a torch dtype or its name): the largest relative error of
    one rounding to nearest."""
    name = str(dtype).removeprefix("torch.")
    return _EPS[name] / 2


def sum_rel(n: int, dtype="float32", pairwise: bool = False) -> float:
    """Relative error (of the sum of magnitudes) between two orders of summing ``n`` terms. A term passes
    through ~n additions in a running sum (a matmul's inner loop: ``sqrt(n) u`` of independent rounding)
    or ~log2(n) in a cascade (ATen's sum, mean and loss reductions, ``pairwise=True``); two orders
    differ by at most twice that."""
    steps = math.log2(max(n, 2)) if pairwise else max(n, 1)
    return 2 * LAMBDA * math.sqrt(steps) * unit_roundoff(dtype)


def chain_rel(depth: int, width: int, dtype="float32") -> float:
    """Relative error between two kernel choices for ``depth`` dependent reductions of ``width`` terms
    each (a network's matmuls, softmax and norms in sequence): the per-reduction errors are independent,
    so they add in quadrature; each is ``sum_rel(width)``."""
    return math.sqrt(max(depth, 1)) * sum_rel(width, dtype)


def fp32_forward_atol(scale: float, depth: int, width: int) -> float:
    """Absolute tolerance on fp32 outputs of size ~``scale`` (logits, activations, losses) after ``depth``
    dependent reductions of ``width`` terms, computed by two implementations or two kernel choices."""
    return scale * chain_rel(depth, width, "float32")


def logits_atol(expected, config) -> float:
    """fp32 logits of one decoder computed twice in another op order (ours against transformers', a
    merged adapter against an unmerged one, a model before and after a checkpoint conversion): each
    layer is ~8 dependent reductions (norm, q/k/v, scores, softmax, the attention sum, o_proj, the MLP's
    two products), plus the final norm and the head, each over at most the widest of hidden size,
    MLP width and sequence; relative to the largest logit. ``config`` is ours or transformers'."""
    widths = [
        getattr(config, k, 0) or 0 for k in ("hidden_size", "intermediate_size", "moe_intermediate_size")
    ]
    width = max(*widths, expected.shape[-2])
    return fp32_forward_atol(float(expected.abs().max()), 8 * config.num_hidden_layers + 2, width)


def mean_loss_atol(loss, tokens: int) -> float:
    """A token-mean cross-entropy (terms of one sign) from two implementations: their logits' last-bit
    differences are independent per token and average out; the mean itself, a cascade sum in ATen's
    loss kernels, in another order carries ``sum_rel(tokens, pairwise=True)`` of the loss."""
    return abs(float(loss)) * sum_rel(tokens, pairwise=True)


def bf16_update_loss_atol(movement: float, matrix_elements: int, ns_steps: int) -> float:
    """Losses of two trainings whose Muon updates come from bf16 Newton-Schulz iterations on fp32 inputs
    that differ in their last bits (two ranks reducing a gradient vs one accumulating it; another CPU's
    kernels). A last-bit change of the input moves a bf16 rounding, so every element of the
    orthogonalized update may differ by ``u_bf16`` relative, once per rounding: ~3 matmul results per
    iteration, ``3 * ns_steps`` in all, independent, so ``sqrt(3 * ns_steps) * u_bf16`` per element.
    A step lowers the loss by <g, dW> (gradient and update aligned, every element pulling one way); the
    rounding moves it by <g, delta dW>, ``matrix_elements`` independent signs (all Muon matrices: each
    holds its share of the loss change and of the elements), so 1/sqrt(matrix_elements) of the loss
    change times the per-element error. Summed over the steps (``movement``, see :func:`movement`:
    linear, because the weights keep every step's difference). The fp32 roundings beside it (gradient
    reduction order, the loss's mean) are ~2^16 times smaller per element and left out."""
    per_element = math.sqrt(3 * ns_steps) * unit_roundoff("bfloat16")
    return LAMBDA * movement * per_element / math.sqrt(matrix_elements)


def movement(losses) -> float:
    """Sum of the absolute step-to-step changes of a loss curve: how far training moved the loss."""
    losses = list(losses)
    return sum(abs(b - a) for a, b in zip(losses, losses[1:], strict=False))
