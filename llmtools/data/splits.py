"""Train/valid/test splits of one dataset, as Megatron-LM computes them from ``--split 969,30,1``.

The split string is parsed like Megatron's (every run of digits and dots is a number, missing ones
are 0), normalised in float64, turned into book-ends by a running sum, and each split of a dataset
with N sequences is the sequence range ``[round(lo*N), round(hi*N))``. A split whose weight is 0 has
no range at all (None), and Megatron then builds no dataset for it.
"""

from __future__ import annotations

import re

import numpy as np

from llmtools.errors import InputError

SPLITS = ("train", "valid", "test")
DEFAULT_SPLIT = "969,30,1"


def parse_split(text: str, what: str = "--split") -> list[float]:
    """``"969,30,1"`` -> ``[0.969, 0.03, 0.001]`` (Megatron's parse_and_normalize_split)."""
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"{what}: empty split; give up to three weights like 969,30,1")
    # Reject what Megatron's permissive regex would silently misread (a minus sign, letters).
    if not re.fullmatch(r"\s*[0-9.]+(\s*[,/ ]\s*[0-9.]+)*\s*", text):
        raise InputError(f"{what}: {text!r} is not a list of up to three non-negative numbers like 969,30,1")
    try:
        values = [float(part) for part in re.findall(r"[.0-9]+", text)]
    except ValueError:
        raise InputError(f"{what}: {text!r} has a part that is not a number") from None
    if len(values) > len(SPLITS):
        raise InputError(f"{what}: {text!r} has {len(values)} parts; at most 3 (train, valid, test)")
    values += [0.0] * (len(SPLITS) - len(values))
    if sum(values) <= 0:
        raise InputError(f"{what}: {text!r} sums to zero; at least one split must be positive")
    w = np.array(values, dtype=np.float64)
    return (w / np.sum(w)).tolist()


def split_matrix(vector: list[float]) -> list[tuple[float, float] | None]:
    """Book-ends ``[(0, .969), (.969, .999), (.999, 1.0)]``; None for an empty split."""
    bounds = [0]
    for value in vector:
        bounds.append(bounds[-1] + value)  # the same running float sum as Megatron's reduce
    matrix: list[tuple[float, float] | None] = []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        matrix.append(None if hi <= lo else (lo, hi))
    return matrix


def split_range(num_elements: int, bookend: tuple[float, float]) -> tuple[int, int]:
    """The sequence range ``[round(lo*N), round(hi*N))`` of one split."""
    lo, hi = bookend
    return int(round(lo * float(num_elements))), int(round(hi * float(num_elements)))
