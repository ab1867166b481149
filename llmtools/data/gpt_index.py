"""The GPTDataset indices of Megatron-LM (core_v0.16): document, sample and shuffle index.

For one split of one dataset (the sequence range ``[beg, end)``), asked for ``num_samples`` samples
of ``seq_length + 1`` tokens:

- tokens per epoch ``tpe`` = the split's tokens; epochs ``E`` = the smallest with
  ``E * tpe >= num_samples * seq_length + 1`` (1 when num_samples is None: one epoch);
- the final epoch is shuffled separately when ``E > 1`` and it contributes fewer than
  ``int(0.8 * samples_per_epoch)`` samples;
- one ``numpy.random.RandomState(seed)`` drawn in Megatron's order: the document index (the split's
  sequence ids tiled E times, int32, shuffled; the last epoch separately when separate), then the
  shuffle index (``arange(n)`` shuffled, or ``[0, n_sans)`` and ``[n_sans, n)`` separately);
- the sample index, ``(n + 1, 2)`` rows of (position in document index, token offset) with
  ``n = (E * tpe - 1) // seq_length``; consecutive samples share one token.

Everything is a pure function of its arguments, so a plan can be rebuilt anywhere and compared with
Megatron's own arrays element by element (tests/data/test_gpt_index.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llmtools import _native
from llmtools.errors import InputError

SEPARATE_FINAL_EPOCH_THRESHOLD = 0.80
ADD_EXTRA_TOKEN = 1  # Megatron's add_extra_token_to_sequence=True: samples of seq_length + 1 tokens


@dataclass(frozen=True)
class GPTIndices:
    document_index: np.ndarray  # int32, sequence ids in reading order
    sample_index: np.ndarray  # int32 or int64, (num_samples + 1, 2)
    shuffle_index: np.ndarray  # uint32 (int64 past 2**32 - 2 samples)
    num_epochs: int
    separate_final_epoch: bool
    tokens_per_epoch: int

    @property
    def num_samples(self) -> int:
        """Samples this index holds (Megatron's ``len(GPTDataset)``), usually a little over the request."""
        return int(self.sample_index.shape[0]) - 1


def num_epochs_for(tokens_per_epoch: int, num_samples: int | None, seq_length: int) -> int:
    """Megatron's ``_get_num_epochs`` (integer arithmetic instead of its loop: same answer)."""
    if num_samples is None:
        return 1
    if tokens_per_epoch <= 0:
        raise InputError("cannot draw samples from a split with no tokens")
    needed = num_samples * seq_length + ADD_EXTRA_TOKEN
    return max(1, -(-needed // tokens_per_epoch))


def samples_in(num_epochs: int, tokens_per_epoch: int, seq_length: int) -> int:
    return (num_epochs * tokens_per_epoch - ADD_EXTRA_TOKEN) // seq_length


def plan_epochs(tokens_per_epoch: int, num_samples: int | None, seq_length: int) -> tuple[int, bool, int]:
    """(epochs, separate final epoch?, samples before the final epoch)."""
    epochs = num_epochs_for(tokens_per_epoch, num_samples, seq_length)
    if epochs == 1 or num_samples is None:
        return epochs, False, 0
    sans_final = samples_in(epochs - 1, tokens_per_epoch, seq_length)
    from_final = num_samples - sans_final
    per_epoch = samples_in(1, tokens_per_epoch, seq_length)
    separate = from_final < int(SEPARATE_FINAL_EPOCH_THRESHOLD * per_epoch)
    return epochs, separate, sans_final


def build_document_index(
    documents: np.ndarray, num_epochs: int, rng: np.random.RandomState, separate_final_epoch: bool
) -> np.ndarray:
    """The split's ids tiled ``num_epochs`` times and shuffled (the final epoch on its own if separate)."""
    if not separate_final_epoch or num_epochs == 1:
        index = np.tile(np.asarray(documents, dtype=np.int32), num_epochs)
        rng.shuffle(index)
        return index
    first = build_document_index(documents, num_epochs - 1, rng, False)
    last = build_document_index(documents, 1, rng, False)
    return np.concatenate((first, last))


def build_shuffle_index(num_samples: int, total_size: int, rng: np.random.RandomState) -> np.ndarray:
    """``arange(num_samples)`` shuffled, then ``arange(num_samples, total_size)`` shuffled after it."""
    dtype = np.uint32 if total_size < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(0, num_samples, dtype=dtype)
    rng.shuffle(first)
    if num_samples == total_size:
        return first
    last = np.arange(num_samples, total_size, dtype=dtype)
    rng.shuffle(last)
    return np.concatenate((first, last))


def sample_index_dtype(sequence_lengths: np.ndarray, document_index: np.ndarray) -> np.dtype:
    """int32 unless a position or a length could exceed it (Megatron's rule)."""
    biggest = max(int(document_index.shape[0]), int(sequence_lengths.max()) if sequence_lengths.size else 0)
    return np.dtype(np.int32) if biggest <= np.iinfo(np.int32).max else np.dtype(np.int64)


def build_sample_index(
    sequence_lengths: np.ndarray,
    document_index: np.ndarray,
    seq_length: int,
    num_epochs: int,
    tokens_per_epoch: int,
) -> np.ndarray:
    """``(n + 1, 2)`` start (document-index position, offset) of every sample; Megatron's dtype."""
    n = samples_in(num_epochs, tokens_per_epoch, seq_length)
    dtype = sample_index_dtype(sequence_lengths, document_index)
    lib = _native.load()
    if lib is not None:
        sizes = np.ascontiguousarray(sequence_lengths, dtype=np.int32)
        docs = np.ascontiguousarray(document_index, dtype=np.int32)
        out = np.empty((n + 1, 2), dtype=np.int64)
        got = lib.llm_sample_idx(
            _native.ptr(sizes, _native._i32p),
            _native.ptr(docs, _native._i32p),
            int(docs.shape[0]),
            int(seq_length),
            int(n),
            ADD_EXTRA_TOKEN,
            _native.ptr(out, _native._i64p),
        )
        if got < 0:
            raise RuntimeError("sample index: documents ran out before the last sample (inconsistent sizes)")
        return out.astype(dtype, copy=False)
    return sample_index_numpy(sequence_lengths, document_index, seq_length, n).astype(dtype, copy=False)


def sample_index_numpy(
    sequence_lengths: np.ndarray, document_index: np.ndarray, seq_length: int, n: int
) -> np.ndarray:
    """Vectorised sample index, equal to the sequential one: sample ``k`` starts at flat token ``k * seq``.

    The sequential builder leaves each sample's start on the token where the previous sample ended
    (its ``seq_length + 1``-th token), i.e. at flat position ``k * seq_length`` of the documents read
    in document-index order. That position lies in the last document whose cumulative start is
    ``<=`` it (``searchsorted(..., "right") - 1``, which also steps over empty sequences), at offset
    ``position - start``. Row 0 is ``(0, 0)`` by definition.
    """
    starts = np.zeros(document_index.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.asarray(sequence_lengths)[document_index], dtype=np.int64, out=starts[1:])
    positions = np.arange(n + 1, dtype=np.int64) * int(seq_length)
    doc = np.searchsorted(starts, positions, side="right") - 1
    out = np.empty((n + 1, 2), dtype=np.int64)
    out[:, 0] = doc
    out[:, 1] = positions - starts[doc]
    out[0] = (0, 0)
    return out


def build_gpt_indices(
    sequence_lengths: np.ndarray,
    split_range: tuple[int, int],
    num_samples: int | None,
    seq_length: int,
    seed: int,
) -> GPTIndices:
    """All three indices for the sequences ``[beg, end)``, drawing from one RandomState(seed)."""
    beg, end = split_range
    documents = np.arange(beg, end, dtype=np.int32)
    lengths = np.asarray(sequence_lengths)
    tokens_per_epoch = int(np.sum(lengths[beg:end], dtype=np.int64))
    if tokens_per_epoch <= ADD_EXTRA_TOKEN:
        raise InputError(f"sequences {beg}..{end} hold {tokens_per_epoch} tokens; a sample needs at least 2")
    epochs, separate, sans_final = plan_epochs(tokens_per_epoch, num_samples, seq_length)
    if num_samples is not None and separate and num_samples - sans_final < 0:
        raise RuntimeError("negative sample count from the final epoch")  # cannot happen by construction
    rng = np.random.RandomState(seed)
    document_index = build_document_index(documents, epochs, rng, separate)
    sample_index = build_sample_index(lengths, document_index, seq_length, epochs, tokens_per_epoch)
    total = sample_index.shape[0] - 1
    shuffle_index = build_shuffle_index(sans_final if separate else total, total, rng)
    return GPTIndices(document_index, sample_index, shuffle_index, epochs, separate, tokens_per_epoch)
