"""The rows of an export, streamed: each source yields (a dict of pyarrow list columns, tokens in the batch)
and knows its row and token counts in advance (for the shard count and the progress bar).

Every record batch is built straight from the memory-mapped token array (a zero-copy view for the
values, a small offsets array per batch); :class:`PageReleaser` hands the pages already exported back to
the OS, so the resident set stays flat however large the source. pyarrow is imported inside the
functions that build arrays: importing this module stays cheap.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from llmtools.errors import InputError
from llmtools.formats.indexed import IndexedDatasetReader

# ~1000 rows per record batch is what `datasets` itself writes; cap the tokens too so one batch of
# very long documents stays a few MB.
BATCH_ROWS = 1000
BATCH_TOKENS = 1 << 22


# --------------------------------------------------------------------------------------------------
def _list_array(values: np.ndarray, offsets: np.ndarray):
    """A ``list<values.dtype>`` array over ``values`` without copying them (int32 offsets, like `datasets`)."""
    import pyarrow as pa

    if offsets[-1] > np.iinfo(np.int32).max:
        raise InputError(
            f"one record batch would hold {int(offsets[-1])} tokens, more than a list column can"
        )
    values = np.ascontiguousarray(values)
    value_type = pa.from_numpy_dtype(values.dtype)
    child = pa.Array.from_buffers(value_type, values.size, [None, pa.py_buffer(values)])
    offs = pa.py_buffer(np.ascontiguousarray(offsets, dtype=np.int32))
    return pa.ListArray.from_buffers(pa.list_(value_type), offsets.size - 1, [None, offs], children=[child])


class PageReleaser:
    """A private read-only mmap of the ``.bin`` whose already-exported pages we hand back to the OS.

    File-backed pages count in a process's RSS until unmapped or dropped; dropping the ones behind
    us keeps the resident set flat however large the source (the data stays in the page cache).
    """

    def __init__(self, path: Path) -> None:
        self.size = path.stat().st_size
        self._handle = open(path, "rb")  # noqa: SIM115 - closed in close()
        self._map = mmap.mmap(self._handle.fileno(), 0, access=mmap.ACCESS_READ) if self.size else None
        self._released = 0

    def array(self, dtype: np.dtype) -> np.ndarray:
        if self._map is None:
            return np.empty(0, dtype=dtype)
        return np.frombuffer(self._map, dtype=dtype, count=self.size // dtype.itemsize)

    def release_before(self, byte: int) -> None:
        """Drop the mapped pages below ``byte`` (rounded down to a page)."""
        end = (byte // mmap.PAGESIZE) * mmap.PAGESIZE
        if self._map is not None and hasattr(mmap, "MADV_DONTNEED") and end - self._released >= (1 << 24):
            self._map.madvise(mmap.MADV_DONTNEED, self._released, end - self._released)
            self._released = end

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # an exported array still points into it; the GC unmaps it later
                pass
        self._handle.close()


class PrefixDocuments:
    """One row per document of a ``.bin/.idx`` prefix (empty documents included, as empty lists).

    The index is checked as it streams (pointers against lengths, document order), so a corrupt
    index is reported with its byte offset instead of exporting garbage.
    """

    def __init__(self, reader: IndexedDatasetReader, out_dtype: np.dtype, batch_rows: int) -> None:
        self.reader = reader
        self.out_dtype = out_dtype
        self.batch_rows = batch_rows
        self.total_tokens = reader.num_tokens
        self.num_rows = reader.num_documents
        self.with_sequence_lengths = _has_multi_sequence_documents(reader)

    def columns(self) -> dict[str, np.dtype | str]:
        cols: dict[str, np.dtype | str] = {"input_ids": self.out_dtype}
        if self.with_sequence_lengths:
            cols["sequence_lengths"] = np.dtype(np.int32)
        return cols

    def batches(self, releaser: PageReleaser) -> Iterator[tuple[dict, int]]:
        # The reader validated the index on open: documents are runs of sequences laid end to end.
        reader = self.reader
        itemsize = reader.dtype.itemsize
        flat = releaser.array(reader.dtype)
        doc_idx = reader.document_indices
        position = 0  # token position in .bin where the next document starts
        a = 0
        while a < self.num_rows:
            b = self._batch_end(a)
            seqs = np.asarray(doc_idx[a : b + 1], dtype=np.int64)
            s0, s1 = int(seqs[0]), int(seqs[-1])
            lengths = np.asarray(reader.sequence_lengths[s0:s1], dtype=np.int64)
            cum = np.zeros(lengths.size + 1, dtype=np.int64)
            np.cumsum(lengths, out=cum[1:])
            offsets = cum[seqs - s0]
            values = flat[position : position + int(cum[-1])]
            cols = {"input_ids": _list_array(_cast_ids(values, self.out_dtype, reader.bin_file), offsets)}
            if self.with_sequence_lengths:
                cols["sequence_lengths"] = _list_array(lengths.astype(np.int32), seqs - s0)
            position += int(cum[-1])
            yield cols, int(cum[-1])
            releaser.release_before(position * itemsize)
            a = b

    def _batch_end(self, a: int) -> int:
        """End of the batch starting at document ``a``: ``batch_rows`` rows, or fewer when they are long."""
        b = min(a + self.batch_rows, self.num_rows)
        doc_idx, reader = self.reader.document_indices, self.reader
        while b > a + 1:
            s0, s1 = int(doc_idx[a]), int(doc_idx[b])
            if s1 <= s0 or int(reader.sequence_lengths[s0:s1].sum(dtype=np.int64)) <= BATCH_TOKENS:
                break
            b = a + (b - a) // 2
        return b


class PrefixBlocks:
    """The Hugging Face ``group_texts`` recipe: all tokens concatenated and cut into ``seq_length``
    blocks; the remainder shorter than a block is dropped (as the recipe does)."""

    def __init__(
        self, reader: IndexedDatasetReader, out_dtype: np.dtype, seq_length: int, batch_rows: int
    ) -> None:
        self.reader = reader
        self.out_dtype = out_dtype
        self.seq_length = seq_length
        self.num_rows = reader.num_tokens // seq_length
        if self.num_rows == 0:  # an empty export that exits 0 would look like a result
            raise InputError(
                f"{reader.bin_file}: --seq-length {seq_length} is longer than all of its {reader.num_tokens} "
                "tokens: no block could be written"
            )
        self.total_tokens = self.num_rows * seq_length
        self.dropped_tokens = reader.num_tokens - self.total_tokens
        self.rows_per_batch = max(1, min(batch_rows, BATCH_TOKENS // seq_length))

    def columns(self) -> dict[str, np.dtype | str]:
        return {"input_ids": self.out_dtype, "labels": self.out_dtype}

    def batches(self, releaser: PageReleaser) -> Iterator[tuple[dict, int]]:
        flat = releaser.array(self.reader.dtype)
        n = self.seq_length
        for lo in range(0, self.num_rows, self.rows_per_batch):
            hi = min(lo + self.rows_per_batch, self.num_rows)
            values = _cast_ids(flat[lo * n : hi * n], self.out_dtype, self.reader.bin_file)
            ids = _list_array(values, np.arange(hi - lo + 1, dtype=np.int64) * n)
            yield {"input_ids": ids, "labels": ids}, (hi - lo) * n
            releaser.release_before(hi * n * self.reader.dtype.itemsize)


class MixSamples:
    """The samples of a ``mix.json`` plan in plan order, exactly as the training dataset yields them.

    Each row is one training sample of ``seq_length + 1`` tokens (Megatron's samples overlap by one
    token: it trains on ``tokens[:-1] -> tokens[1:]``); ``labels == input_ids`` so a Hugging Face
    causal-LM model, which shifts the labels itself, computes exactly the same loss. ``source`` names the
    mix source the sample was drawn from (its unique ``sources[].name`` in the mix.json, as mix reports and
    training metrics name it), so the blend can be checked from the dataset itself.
    """

    def __init__(self, dataset, out_dtype: np.dtype, batch_rows: int, source_names: list[str]) -> None:
        self.dataset = dataset
        self.source_names = np.asarray(source_names, dtype=object)
        self.out_dtype = out_dtype
        self.row_length = int(dataset.seq_length) + 1
        self.num_rows = len(dataset)
        self.total_tokens = self.num_rows * self.row_length
        self.rows_per_batch = max(1, min(batch_rows, BATCH_TOKENS // self.row_length))

    def columns(self) -> dict[str, np.dtype | str]:
        return {"input_ids": self.out_dtype, "labels": self.out_dtype, "source": "string"}

    def batches(self, releaser: PageReleaser | None) -> Iterator[tuple[dict, int]]:
        import pyarrow as pa

        n = self.row_length
        for lo in range(0, self.num_rows, self.rows_per_batch):
            hi = min(lo + self.rows_per_batch, self.num_rows)
            block = np.asarray(self.dataset.batch(np.arange(lo, hi, dtype=np.int64)))
            values = _cast_ids(block.reshape(-1), self.out_dtype, "mix sample")
            ids = _list_array(values, np.arange(hi - lo + 1, dtype=np.int64) * n)
            which = np.asarray(self.dataset.dataset_index[lo:hi], dtype=np.int64)
            source = pa.array(self.source_names[which], type=pa.string())
            yield {"input_ids": ids, "labels": ids, "source": source}, (hi - lo) * n


def _cast_ids(values: np.ndarray, dtype: np.dtype, origin) -> np.ndarray:
    if values.dtype == dtype:
        return values
    if values.size and not np.can_cast(values.dtype, dtype):
        lo, hi = int(values.min()), int(values.max())
        info = np.iinfo(dtype)
        if lo < info.min or hi > info.max:
            raise InputError(
                f"{origin}: token id {hi if hi > info.max else lo} does not fit {dtype} (vocabulary size wrong?)"
            )
    return values.astype(dtype)


def _has_multi_sequence_documents(reader: IndexedDatasetReader, chunk: int = 1 << 22) -> bool:
    """True when some document is not exactly one non-empty sequence (``--split-sentences`` output)."""
    if reader.num_sequences == reader.num_documents and reader.num_sequences == 0:
        return False
    doc_idx = reader.document_indices
    for lo in range(0, doc_idx.size - 1, chunk):
        part = np.asarray(doc_idx[lo : lo + chunk + 1])
        if np.any(np.diff(part) > 1):
            return True
    for lo in range(0, reader.num_sequences, chunk):
        if np.any(np.asarray(reader.sequence_lengths[lo : lo + chunk]) == 0):
            return True
    return False
