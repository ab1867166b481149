"""Megatron's document masking of GPT samples: loss mask, position ids and document (segment) ids.

A GPT sample runs across document boundaries (the EOD token ends each document). Megatron-LM's three
flags, with its meaning (megatron-core's ``_get_ltor_masks_and_position_ids``, applied to the input
tokens ``sample[:-1]``):

- ``eod_mask_loss``: no loss where the *input* token is EOD (the prediction of the next document's
  first token from the previous document's end).
- ``reset_position_ids``: positions restart at 0 on the token after each EOD.
- ``reset_attention_mask``: a token never attends to a token at or before an earlier EOD; the EOD
  itself still belongs to the document it ends.

Instead of Megatron's dense (t, t) mask this returns segment ids — 1 + the number of EOD tokens before
each position — from which the model's document attention takes the boundaries
(:mod:`llmtools.model.doc_attention`): ``q`` may attend ``k`` iff ``k <= q`` and their segment ids
are equal, which is exactly Megatron's mask. No torch here.
"""

from __future__ import annotations

import numpy as np


def document_masks(
    tokens: np.ndarray,
    eod_id: int,
    *,
    reset_position_ids: bool,
    reset_attention_mask: bool,
    eod_mask_loss: bool,
) -> dict[str, np.ndarray | None]:
    """For input tokens (n, t): ``loss_mask`` (n, t) float32, ``position_ids`` (n, t) int64 and
    ``segment_ids`` (n, t) int64 (None unless ``reset_attention_mask``)."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be (n, t), got shape {tokens.shape}")
    n, t = tokens.shape
    is_eod = tokens == eod_id
    loss_mask = np.ones((n, t), dtype=np.float32)
    if eod_mask_loss:
        loss_mask[is_eod] = 0.0
    arange = np.broadcast_to(np.arange(t, dtype=np.int64), (n, t))
    position_ids = arange.copy()
    if reset_position_ids and t:
        # the index of the last EOD strictly before each position (-1 when none): a document's start - 1
        last_eod = np.maximum.accumulate(np.where(is_eod, arange, -1), axis=1)
        start = np.zeros((n, t), dtype=np.int64)
        start[:, 1:] = last_eod[:, :-1] + 1
        position_ids = arange - start
    segment_ids = None
    if reset_attention_mask:
        segment_ids = np.ones((n, t), dtype=np.int64)
        segment_ids[:, 1:] += np.cumsum(is_eod[:, :-1], axis=1)
    return {"loss_mask": loss_mask, "position_ids": position_ids, "segment_ids": segment_ids}


def dense_mask(segment_ids: np.ndarray) -> np.ndarray:
    """The (n, t, t) bool mask the segment ids stand for, True = masked out (Megatron's convention):
    a reference for tests, t x t memory."""
    t = segment_ids.shape[-1]
    causal = np.tril(np.ones((t, t), dtype=bool))
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return ~(causal & same)


__all__ = ["document_masks", "dense_mask"]
