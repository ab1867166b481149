"""The file layout of SFT data: what ``llm-prep sft`` writes and training reads, defined here so that
neither side imports the other.

``llm-prep sft -o PREFIX`` writes aligned indexed datasets ``PREFIX_{key}_document`` for each key of
:data:`KEYS` (``segment_ids`` only when packed), one value per token; a packed sequence trains with
position ids that restart at every segment (:func:`position_ids_from_segments`) and attention that never
crosses one (:func:`segment_attention_mask`). Sidecar block ``sft`` (:data:`SFT_FORMAT`). A preference
dataset is two of these side by side (:mod:`llmtools.formats.pref_layout`).
"""

from __future__ import annotations

import numpy as np

SFT_FORMAT = "llmtools.sft"
KEYS = ("input_ids", "loss_mask", "segment_ids")


def position_ids_from_segments(segment_ids: np.ndarray) -> np.ndarray:
    """Position ids that restart at 0 at every new segment (what a packed sequence is trained with)."""
    segment_ids = np.asarray(segment_ids)
    n = segment_ids.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(np.concatenate([[True], segment_ids[1:] != segment_ids[:-1]]))
    base = np.zeros(n, dtype=np.int64)
    base[starts] = starts
    return np.arange(n, dtype=np.int64) - np.maximum.accumulate(base)


def segment_attention_mask(segment_ids: np.ndarray) -> np.ndarray:
    """``allowed[q, k]``: causal attention that never crosses a segment (sample) boundary."""
    segment_ids = np.asarray(segment_ids)
    n = segment_ids.size
    same = segment_ids[:, None] == segment_ids[None, :]
    return same & np.tri(n, dtype=bool)
