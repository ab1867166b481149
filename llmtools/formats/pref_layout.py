"""The file layout of preference pairs: what ``llm-prep pref`` writes and training reads, defined here so
that neither side imports the other.

``llm-prep pref -o PREFIX`` writes one SFT layout (:mod:`llmtools.formats.sft_layout`) per side of
:data:`SIDES`, under :func:`side_prefix`: the datasets ``PREFIX_{key}_document`` of :data:`KEYS`. Sidecar
block ``pref`` (:data:`PREF_FORMAT`).
"""

from __future__ import annotations

PREF_FORMAT = "llmtools.pref"
SIDES = ("chosen", "rejected")
KEYS = ("chosen_input_ids", "chosen_loss_mask", "rejected_input_ids", "rejected_loss_mask")


def side_prefix(prefix: str, side: str) -> str:
    """``PREFIX_chosen`` / ``PREFIX_rejected``: each an llm-prep sft prefix (``_input_ids``, ``_loss_mask``)."""
    return f"{prefix}_{side}"
