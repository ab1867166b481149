"""Reading what ``llm-prep sft`` wrote: aligned token / loss-mask (/ segment) datasets as training batches.

``SftDataset(prefix)`` opens ``PREFIX_input_ids_document``, ``PREFIX_loss_mask_document`` and, when the
data was packed, ``PREFIX_segment_ids_document`` (zero-copy memory maps) and checks that they are
aligned document for document. ``ds.batch(indices, seq_length)`` gives fixed-shape numpy arrays, the
inputs of a masked next-token loss::

    tokens        (n, seq_length)  ids[:-1], right-padded with pad_id
    labels        (n, seq_length)  ids[1:]
    loss_mask     (n, seq_length)  mask[1:]; 0 on padding and on a label that starts a new segment
    position_ids  (n, seq_length)  restart at 0 at every segment (sample) start
    segment_ids   (n, seq_length)  1, 2, ... per sample inside a sequence; 0 on padding

The loss is ``sum(ce * loss_mask) / sum(loss_mask)``; attention must stay inside a segment
(``segment_ids[q] == segment_ids[k]``, causal). Documents longer than ``seq_length + 1`` are cut.
No torch here: the trainer converts the arrays.
"""

from __future__ import annotations

import os

import numpy as np

from llmtools.errors import InputError
from llmtools.formats.indexed import IndexedDatasetReader, exists
from llmtools.formats.sft_layout import KEYS, position_ids_from_segments


class SftDataset:
    """Aligned SFT datasets under one prefix (the ``-o`` given to ``llm-prep sft``)."""

    def __init__(self, prefix: str | os.PathLike, pad_id: int = 0) -> None:
        self.prefix = str(prefix)
        self.pad_id = int(pad_id)
        names = {key: f"{self.prefix}_{key}_document" for key in KEYS}
        for key in KEYS[:2]:
            if not exists(names[key]):
                raise InputError(
                    f"{names[key]}.bin/.idx: not found (write it with llm-prep sft -o {self.prefix})"
                )
        self.input_ids = IndexedDatasetReader(names["input_ids"])
        self.loss_mask = IndexedDatasetReader(names["loss_mask"])
        self.segment_ids = (
            IndexedDatasetReader(names["segment_ids"]) if exists(names["segment_ids"]) else None
        )
        lengths = self.input_ids.document_lengths()
        for reader in (self.loss_mask, self.segment_ids):
            if reader is None:
                continue
            other = reader.document_lengths()
            if other.shape != lengths.shape or not np.array_equal(other, lengths):
                bad = (
                    int(np.argmax(other != lengths))
                    if other.shape == lengths.shape
                    else min(len(other), len(lengths))
                )
                raise InputError(
                    f"{reader.idx_file}: not aligned with {self.input_ids.idx_file} "
                    f"(document {bad}: {len(other)} vs {len(lengths)} documents, or different lengths)"
                )
        self.lengths = lengths

    @property
    def packed(self) -> bool:
        return self.segment_ids is not None

    def __len__(self) -> int:
        return int(self.lengths.size)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        """Document ``i``: ``input_ids``, ``loss_mask`` and ``segment_ids`` (all ones when unpacked)."""
        ids = self.input_ids.document(i)
        out = {"input_ids": ids, "loss_mask": self.loss_mask.document(i)}
        out["segment_ids"] = (
            self.segment_ids.document(i) if self.segment_ids is not None else np.ones(ids.size, np.int64)
        )
        return out

    def batch(self, indices, seq_length: int) -> dict[str, np.ndarray]:
        """Fixed-shape arrays for documents ``indices`` (see the module docstring)."""
        n, width = len(indices), seq_length + 1
        ids = np.full((n, width), self.pad_id, dtype=np.int64)
        mask = np.zeros((n, width), dtype=np.int64)
        seg = np.zeros((n, width), dtype=np.int64)
        for row, i in enumerate(indices):
            doc = self[int(i)]
            k = min(width, doc["input_ids"].size)
            ids[row, :k] = doc["input_ids"][:k]
            mask[row, :k] = doc["loss_mask"][:k]
            seg[row, :k] = doc["segment_ids"][:k]
        labels_seg = seg[:, 1:]
        same_sample = (labels_seg == seg[:, :-1]) & (labels_seg > 0)
        positions = np.stack([position_ids_from_segments(s) for s in seg[:, :-1]]) if n else seg[:, :-1]
        return {
            "tokens": ids[:, :-1],
            "labels": ids[:, 1:],
            "loss_mask": mask[:, 1:] * same_sample,
            "position_ids": positions,
            "segment_ids": seg[:, :-1],
        }
