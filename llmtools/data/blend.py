"""Blending several datasets by weight, exactly as Megatron-LM (core_v0.16, 2025-02 and later) does.

- :func:`normalize_weights`: ``w / sum(w)`` in float64 (numpy), after checking every weight.
- :func:`samples_per_dataset`: each dataset's target ``ceil(size * w_i)`` and the number of samples
  its GPT index is built with, ``ceil(ceil(size * w_i) * (1 + surplus))`` (surplus 0.005). The blend's
  length is the sum of the targets, which may exceed ``size`` by up to one sample per dataset.
  (Before 2025-02 Megatron used ``ceil(size * w_i * 1.005)`` and a blend of exactly ``size``.)
- :func:`build_blending_indices`: the greedy: sample ``t`` comes from the dataset ``i`` maximising
  ``w_i * max(t, 1) - c_i`` (ties to the lowest index), where ``c_i`` counts what ``i`` already gave.
  Compiled (ctypes) when possible, else a Python loop with identical results.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from llmtools import _native
from llmtools.errors import InputError
from llmtools.numeric import finite_sum

DEFAULT_SURPLUS = 0.005
MAX_DATASETS = 32767  # dataset_index is int16


def check_weights(weights: Sequence[float], what: str = "--weights") -> list[float]:
    """Every weight a finite number >= 0, not all zero; else :class:`InputError` naming the weight."""
    out = []
    for i, raw in enumerate(weights):
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise InputError(f"{what}: weight {i + 1} ({raw!r}) is not a number") from None
        if math.isnan(value) or math.isinf(value):
            raise InputError(f"{what}: weight {i + 1} is {value}; weights must be finite numbers")
        if value < 0:
            raise InputError(f"{what}: weight {i + 1} is negative ({raw}); weights must be >= 0")
        out.append(value)
    if not out:
        raise InputError(f"{what}: no weights given")
    if not any(out):
        raise InputError(f"{what}: all weights are zero; at least one must be positive")
    if len(out) > MAX_DATASETS:
        raise InputError(f"{what}: {len(out)} datasets; at most {MAX_DATASETS} can be blended")
    finite_sum(out, what)  # 1e308 + 1e308 is infinite: every weight over it would be 0 or NaN
    return out


def normalize_weights(weights: Sequence[float]) -> list[float]:
    """Megatron's ``normalize``: float64 ``w / sum(w)`` with numpy's summation, as Python floats."""
    w = np.array(weights, dtype=np.float64)
    return (w / np.sum(w)).tolist()


def samples_per_dataset(
    normalized_weights: Sequence[float], size: int, surplus: float = DEFAULT_SURPLUS
) -> tuple[list[int], list[int]]:
    """(targets, built): ``ceil(size*w)`` drawn per dataset, ``ceil(ceil(size*w)*(1+surplus))`` indexed."""
    targets = [int(math.ceil(size * w)) for w in normalized_weights]
    built = [int(math.ceil(math.ceil(size * w) * (1 + surplus))) for w in normalized_weights]
    return targets, built


def build_blending_indices(
    weights: Sequence[float],
    size: int,
    parts: Sequence[int] | None = None,
    offsets: Sequence[int] | None = None,
    with_counts: bool = False,
):
    """(dataset_index int16, dataset_sample_index int64) of length ``size``, Megatron's greedy.

    ``weights`` are used as given (Megatron's BlendedDataset normalises them once more before the
    call; :func:`blend_weights` reproduces that).

    A blend that continues earlier draws passes ``parts`` (what ``dataset_index`` holds for each
    dataset, instead of its position in ``weights``) and ``offsets`` (added to each dataset's sample
    counts): the choices are the same greedy's, only the numbers written differ. This costs nothing
    over a fresh blend (the compiled loop writes the final values directly). ``with_counts`` adds a
    third array: the samples drawn from each dataset.
    """
    w = np.ascontiguousarray(weights, dtype=np.float64)
    n = int(w.size)
    if n == 0 or n > MAX_DATASETS:
        raise ValueError(f"can blend 1..{MAX_DATASETS} datasets, not {n}")
    continued = parts is not None or offsets is not None
    if continued:
        part_of = np.ascontiguousarray(range(n) if parts is None else parts, dtype=np.int16)
        shift = np.ascontiguousarray(np.zeros(n) if offsets is None else offsets, dtype=np.int64)
        if part_of.shape != (n,) or shift.shape != (n,):
            raise ValueError(f"parts and offsets need one entry per dataset ({n})")
    size = int(size)
    dataset_index = np.empty(size, dtype=np.int16)  # every element is written below
    dataset_sample_index = np.empty(size, dtype=np.int64)
    counts = np.zeros(n, dtype=np.int64)
    lib = _native.load()
    if lib is not None:
        if continued:
            lib.llm_blend_indices_continued(
                _native.ptr(w, _native._f64p),
                n,
                size,
                _native.ptr(part_of, _native._i16p),
                _native.ptr(shift, _native._i64p),
                _native.ptr(dataset_index, _native._i16p),
                _native.ptr(dataset_sample_index, _native._i64p),
                _native.ptr(counts, _native._i64p),
            )
        else:
            lib.llm_blend_indices(
                _native.ptr(w, _native._f64p),
                n,
                size,
                _native.ptr(dataset_index, _native._i16p),
                _native.ptr(dataset_sample_index, _native._i64p),
                _native.ptr(counts, _native._i64p),
            )
        return (
            (dataset_index, dataset_sample_index, counts)
            if with_counts
            else (dataset_index, dataset_sample_index)
        )
    _native.warn_fallback("blending")
    _blend_python(w.tolist(), size, dataset_index, dataset_sample_index)
    if with_counts:
        counts[:] = np.bincount(dataset_index, minlength=n)
    if continued:
        dataset_sample_index += shift[dataset_index]
        dataset_index[:] = part_of[dataset_index]
    return (
        (dataset_index, dataset_sample_index, counts)
        if with_counts
        else (dataset_index, dataset_sample_index)
    )


def _blend_python(
    w: list[float], size: int, dataset_index: np.ndarray, dataset_sample_index: np.ndarray
) -> None:
    # Python floats are IEEE doubles and `w * x - c` is evaluated without fusion: identical to the C code.
    counts = [0] * len(w)
    di = [0] * size
    dsi = [0] * size
    n = len(w)
    for t in range(size):
        x = float(t) if t > 1 else 1.0
        best = 0
        best_error = w[0] * x - counts[0]
        for i in range(1, n):
            error = w[i] * x - counts[i]
            if error > best_error:
                best_error = error
                best = i
        di[t] = best
        dsi[t] = counts[best]
        counts[best] += 1
    dataset_index[:] = di
    dataset_sample_index[:] = dsi


def blend_weights(weights: Sequence[float]) -> list[float]:
    """The weights Megatron hands to its greedy: the builder normalises, then BlendedDataset again."""
    return normalize_weights(normalize_weights(weights))
