"""Reading what ``llm-prep pref`` wrote: aligned chosen / rejected datasets as training batches of pairs.

``PrefDataset(prefix)`` opens ``PREFIX_chosen`` and ``PREFIX_rejected`` (each an SFT prefix of token ids and
loss mask, :class:`~llmtools.data.sft_dataset.SftDataset`) and checks that they hold the same number of
pairs. ``ds.batch(pairs, seq_length)`` gives one forward's worth of numpy arrays, the chosen rows first::

    tokens     (2n, w)  ids[:-1] of chosen pair 0..n-1, then rejected pair 0..n-1; right-padded
    labels     (2n, w)  ids[1:]
    loss_mask  (2n, w)  mask[1:]: 1 where the label is an answer token; 0 on the prompt and padding

``w`` is the longest row of the batch (at most ``seq_length``): padding beyond it would be computed and
thrown away. Sequences longer than ``seq_length + 1`` tokens are cut. No torch here.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from llmtools.data.sft_dataset import SftDataset
from llmtools.errors import InputError
from llmtools.formats.indexed import bin_path, exists, idx_path
from llmtools.formats.pref_layout import KEYS, side_prefix


class PrefDataset:
    """Aligned preference pairs under one prefix (the ``-o`` given to ``llm-prep pref``)."""

    def __init__(self, prefix: str | os.PathLike) -> None:
        self.prefix = str(prefix)
        for key in KEYS:
            if not exists(f"{self.prefix}_{key}_document"):
                raise InputError(
                    f"{self.prefix}_{key}_document.bin/.idx: not found (write it with llm-prep pref -o {self.prefix})"
                )
        self.chosen = SftDataset(side_prefix(self.prefix, "chosen"))
        self.rejected = SftDataset(side_prefix(self.prefix, "rejected"))
        if len(self.chosen) != len(self.rejected):
            raise InputError(
                f"{self.prefix}: {len(self.chosen)} chosen but {len(self.rejected)} rejected sequences "
                "(the two halves of a preference dataset must hold the same pairs)"
            )
        if self.chosen.packed or self.rejected.packed:
            raise InputError(f"{self.prefix}: packed sequences are not preference pairs")

    def __len__(self) -> int:
        return len(self.chosen)

    def files(self) -> list[Path]:
        """Every file the pairs are read from (what a result computed over them depends on)."""
        return [p(f"{self.prefix}_{key}_document") for key in KEYS for p in (idx_path, bin_path)]

    def unreachable_answers(self, seq_length: int) -> np.ndarray:
        """Pairs of which one side has no answer token among the first ``seq_length`` labels (its prompt
        fills the window): they would compare nothing."""
        bad = []
        for i in range(len(self)):
            for side in (self.chosen, self.rejected):
                if not side.loss_mask.document(i)[1 : seq_length + 1].any():
                    bad.append(i)
                    break
        return np.asarray(bad, dtype=np.int64)

    def batch(self, pairs, seq_length: int) -> dict[str, np.ndarray]:
        """The chosen rows of ``pairs`` then their rejected rows, cut to the batch's longest row."""
        pairs = [int(i) for i in pairs]
        halves = [side.batch(pairs, seq_length) for side in (self.chosen, self.rejected)]
        lengths = [
            min(int(side.lengths[i]), seq_length + 1) for side in (self.chosen, self.rejected) for i in pairs
        ]
        width = max(1, max(lengths, default=2) - 1)
        return {
            name: np.concatenate([half[name][:, :width] for half in halves])
            for name in ("tokens", "labels", "loss_mask")
        }
