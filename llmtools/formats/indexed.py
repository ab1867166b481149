"""Megatron-LM's ``MMIDIDX`` indexed dataset (``.bin`` + ``.idx``), byte for byte.

``.idx`` layout (little-endian, no padding)::

    0   9 bytes  b"MMIDIDX\\x00\\x00"
    9   u64      version = 1
    17  u8       dtype code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16)
    18  u64      S = number of sequences
    26  u64      D = number of document indices (documents + 1)
    34  int32[S] sequence lengths
        int64[S] byte pointers into .bin (running sum of length * itemsize, from 0)
        int64[D] document indices (first 0, last S)
        int8[S]  optional modes (multimodal only)

``.bin`` holds the token ids back to back, no header. A *document* is a run of sequences
(one sequence per document unless sentences were split); an empty document adds a document
index but no sequence, exactly as Megatron's ``preprocess_data.py`` does.

The reader memory-maps both files and hands out zero-copy numpy views, after checking the index on open
(:meth:`IndexedDatasetReader.validate`, O(sequences) vectorised passes in bounded memory): lengths are not
negative, pointers are the running byte offsets of the lengths from 0 and the last sequence ends exactly
at the end of the ``.bin``, document indices run from 0 to the number of sequences without going back.
Whatever an ``.idx`` says, no reader of it can then read outside the ``.bin``. The writer is a context
manager that writes to temporary names and renames ``.bin`` then ``.idx`` into place on success,
so a crash never leaves an ``.idx`` (the file readers open first) beside a partial ``.bin``. It
keeps its per-sequence bookkeeping in temporary files, not Python lists, so memory stays flat
however many documents are written.
"""

from __future__ import annotations

import contextlib
import os
import struct
from pathlib import Path

import numpy as np

from llmtools import _native
from llmtools.errors import InputError, where
from llmtools.fsutil import (
    commit_file,
    copy_bytes,
    critical,
    discard,
    disk_full_guard,
    fsync_dir,
    fsync_file,
    tmp_sibling,
)

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_SIZE = 34

DTYPE_CODES: dict[int, type[np.generic]] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
CODE_OF_DTYPE = {np.dtype(v): k for k, v in DTYPE_CODES.items()}

STREAM_CHUNK = 1 << 18
"""Index entries handled at once when an index streams through (about 7 MB of temporaries): memory stays
flat however many sequences; 4M-entry chunks measured 136 MB of peak RSS in a 2,000-shard merge, this 46 MB."""

# Megatron picks uint16 below this vocabulary size (not 65536: it keeps a margin), else int32.
UINT16_VOCAB_LIMIT = 65500


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """The token dtype Megatron-LM uses for a vocabulary of ``vocab_size`` (added tokens included)."""
    return (
        np.dtype(np.uint16)
        if vocab_size is not None and vocab_size < UINT16_VOCAB_LIMIT
        else np.dtype(np.int32)
    )


def bin_path(prefix: str | os.PathLike) -> Path:
    return Path(f"{prefix}.bin")


def idx_path(prefix: str | os.PathLike) -> Path:
    return Path(f"{prefix}.idx")


def strip_suffix(path: str | os.PathLike) -> str:
    """Accept ``foo``, ``foo.bin`` or ``foo.idx`` (or ``foo.json``) and return the prefix ``foo``."""
    text = str(path)
    for suffix in (".bin", ".idx", ".json"):
        if text.endswith(suffix):
            return text[: -len(suffix)]
    return text


def exists(prefix: str | os.PathLike) -> bool:
    return bin_path(prefix).exists() and idx_path(prefix).exists()


_CHUNK = 1 << 16  # index entries per vectorised step of validation: its temporaries stay in cache


class IndexedDatasetReader:
    """Zero-copy reader of a ``.bin/.idx`` pair (any dtype, files from Megatron included), validated on
    open (:meth:`validate`; a bad index is an :class:`InputError` naming the file and byte offset).

    ``reader[i]`` is sequence ``i`` as a numpy view of the memory-mapped ``.bin``;
    ``reader.document(j)`` concatenates the sequences of document ``j``.
    """

    def __init__(self, prefix: str | os.PathLike) -> None:
        self.prefix = strip_suffix(prefix)
        self.idx_file = idx_path(self.prefix)
        self.bin_file = bin_path(self.prefix)
        for path in (self.idx_file, self.bin_file):
            if not path.exists():
                raise InputError(
                    f"{path}: no such file (expected a Megatron .bin/.idx pair at prefix {self.prefix})"
                )
        self._read_index()
        self._bin = self._map_bin()
        self.validate()

    # -- index ---------------------------------------------------------------------------------
    def _read_index(self) -> None:
        path = self.idx_file
        size = path.stat().st_size
        if size < HEADER_SIZE:
            raise InputError(
                f"{where(path, offset=0)}: file is {size} bytes, shorter than the {HEADER_SIZE}-byte header"
            )
        with open(path, "rb") as handle:
            header = handle.read(HEADER_SIZE)
        if header[:9] != MAGIC:
            raise InputError(
                f"{where(path, offset=0)}: bad magic {header[:9]!r}, expected {MAGIC!r} (not an MMIDIDX index)"
            )
        (version,) = struct.unpack_from("<Q", header, 9)
        if version != VERSION:
            raise InputError(f"{where(path, offset=9)}: unsupported version {version}, expected {VERSION}")
        code = header[17]
        if code not in DTYPE_CODES:
            raise InputError(f"{where(path, offset=17)}: unknown dtype code {code}")
        self.dtype = np.dtype(DTYPE_CODES[code])
        self.dtype_code = code
        self.num_sequences, self.num_doc_indices = struct.unpack_from("<QQ", header, 18)
        s, d = self.num_sequences, self.num_doc_indices
        expected = HEADER_SIZE + 12 * s + 8 * d
        if size not in (expected, expected + s):  # the optional int8 modes array
            raise InputError(
                f"{where(path)}: size {size} bytes does not match its header "
                f"({s} sequences, {d} document indices need {expected} bytes): truncated or corrupt"
            )
        self._idx = np.memmap(path, mode="r", dtype=np.uint8) if size else None
        buf = self._idx
        off = HEADER_SIZE
        self.sequence_lengths = np.frombuffer(buf, dtype=np.int32, count=s, offset=off)
        off += 4 * s
        self.sequence_pointers = np.frombuffer(buf, dtype=np.int64, count=s, offset=off)
        off += 8 * s
        self.document_indices = np.frombuffer(buf, dtype=np.int64, count=d, offset=off)
        off += 8 * d
        self.sequence_modes = (
            np.frombuffer(buf, dtype=np.int8, count=s, offset=off) if size > expected else None
        )
        if d == 0 or self.document_indices[0] != 0 or self.document_indices[-1] != s:
            raise InputError(
                f"{where(path, offset=HEADER_SIZE + 12 * s)}: document indices must run from 0 to {s} "
                f"(the number of sequences); found {self.document_indices[:1].tolist()}…{self.document_indices[-1:].tolist()}"
            )

    def _map_bin(self) -> np.ndarray:
        if self.bin_file.stat().st_size == 0:
            return np.empty(0, dtype=np.uint8)
        return np.memmap(self.bin_file, mode="r", dtype=np.uint8)

    # -- checks --------------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return int(self.sequence_lengths.sum(dtype=np.int64))

    @property
    def num_documents(self) -> int:
        return self.num_doc_indices - 1

    def expected_bin_size(self) -> int:
        if self.num_sequences == 0:
            return 0
        return int(self.sequence_pointers[-1]) + int(self.sequence_lengths[-1]) * self.dtype.itemsize

    def validate(self) -> None:
        """Check the index against itself and the ``.bin`` (see the module docstring), O(sequences); done
        on open. InputError naming the file, the byte offset of the bad entry and what is wrong.

        One compiled pass when the native helpers are there (``llm_check_index``, a few ns a sequence: a
        few per cent of opening a dataset for training, ``benchmarks/bench_index.py``); the vectorised
        numpy check otherwise, and always to say what is wrong with an index the compiled pass rejected."""
        lib = _native.load()
        if lib is None or self.num_sequences == 0:
            self.validate_numpy()
            return
        bad = lib.llm_check_index(
            _native.ptr(self.sequence_lengths, _native._i32p),
            _native.ptr(self.sequence_pointers, _native._i64p),
            self.num_sequences,
            self.dtype.itemsize,
            int(self._bin.size),
            _native.ptr(self.document_indices, _native._i64p),
            self.num_doc_indices,
        )
        if bad >= 0:
            self.validate_numpy()  # raises, naming the problem
            raise InputError(f"{self.idx_file}: corrupt index (entry {bad})")  # not reached

    def validate_numpy(self) -> None:
        """:meth:`validate` in vectorised numpy passes over chunks of :data:`_CHUNK` entries."""
        s, itemsize = self.num_sequences, self.dtype.itemsize
        lengths, pointers = self.sequence_lengths, self.sequence_pointers
        bin_size = int(self._bin.size)
        pointer_at = HEADER_SIZE + 4 * s
        running = 0  # byte offset where the next sequence must start
        for lo in range(0, s, _CHUNK):
            part = lengths[lo : lo + _CHUNK]
            if int(part.min()) < 0:
                bad = lo + int(np.argmax(part < 0))
                raise InputError(
                    f"{where(self.idx_file, offset=HEADER_SIZE + 4 * bad)}: sequence {bad} has negative "
                    f"length {int(lengths[bad])}"
                )
            ends = part.astype(np.int64)
            ends *= itemsize
            np.cumsum(ends, out=ends)  # no overflow: < 2**56 per chunk, and running <= bin_size
            ends += running
            starts = pointers[lo : lo + part.size]
            if int(starts[0]) != running or not np.array_equal(starts[1:], ends[:-1]):
                bad = lo if int(starts[0]) != running else lo + 1 + int(np.argmax(starts[1:] != ends[:-1]))
                expected = running if bad == lo else int(ends[bad - lo - 1])
                raise InputError(
                    f"{where(self.idx_file, offset=pointer_at + 8 * bad)}: pointer of sequence {bad} is "
                    f"{int(pointers[bad])}, expected {expected} (the running sum of the lengths before it)"
                )
            running = int(ends[-1])
            if running > bin_size:  # stop here: the sums of later chunks could overflow
                more = "at least " if lo + _CHUNK < s else ""
                raise InputError(
                    f"{where(self.bin_file, offset=bin_size)}: .bin is {bin_size} bytes but the index "
                    f"describes {more}{running} bytes (truncated)"
                )
        if running != bin_size:
            raise InputError(
                f"{where(self.bin_file, offset=running)}: .bin is {bin_size} bytes but the index "
                f"describes {running} bytes (trailing data)"
            )
        docs = self.document_indices
        doc_at = HEADER_SIZE + 12 * s
        for lo in range(0, docs.size - 1, _CHUNK):
            steps = np.diff(docs[lo : lo + _CHUNK + 1])
            if steps.size and int(steps.min()) < 0:
                bad = lo + 1 + int(np.argmax(steps < 0))
                raise InputError(
                    f"{where(self.idx_file, offset=doc_at + 8 * bad)}: document index {bad} is "
                    f"{int(docs[bad])}, less than the one before it ({int(docs[bad - 1])})"
                )

    # -- access --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.num_sequences

    def __getitem__(self, i: int) -> np.ndarray:
        if not -self.num_sequences <= i < self.num_sequences:
            raise IndexError(f"sequence {i} out of range (0..{self.num_sequences - 1})")
        i = int(i) % self.num_sequences
        return self.get(i)

    def get(self, i: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens ``[offset, offset+length)`` of sequence ``i``, as a zero-copy view."""
        seq_len = int(self.sequence_lengths[i])
        if length is None:
            length = seq_len - offset
        start = int(self.sequence_pointers[i]) + offset * self.dtype.itemsize
        return np.frombuffer(self._bin, dtype=self.dtype, count=length, offset=start)

    def document(self, j: int) -> np.ndarray:
        """All tokens of document ``j`` (a view when it is one sequence, else a concatenation)."""
        lo, hi = int(self.document_indices[j]), int(self.document_indices[j + 1])
        if hi - lo == 1:
            return self.get(lo)
        if hi == lo:
            return np.empty(0, dtype=self.dtype)
        return np.concatenate([self.get(k) for k in range(lo, hi)])

    def tokens(self) -> np.ndarray:
        """The whole ``.bin`` as one flat token array (zero-copy)."""
        return np.frombuffer(
            self._bin, dtype=self.dtype, count=self.expected_bin_size() // self.dtype.itemsize
        )

    def document_lengths(self) -> np.ndarray:
        """Token count of every document (int64), empty documents included."""
        cum = np.zeros(self.num_sequences + 1, dtype=np.int64)
        np.cumsum(self.sequence_lengths, out=cum[1:])
        return cum[self.document_indices[1:]] - cum[self.document_indices[:-1]]


class IndexedDatasetWriter:
    """Write a ``.bin/.idx`` pair atomically. Use as a context manager.

    >>> with IndexedDatasetWriter("out/wiki_text_document", np.uint16) as w:
    ...     w.add_document([1, 2, 3])
    ...     w.add_documents(flat_tokens, lengths)   # bulk: one call per encoded batch

    Nothing appears under the final names unless the block exits normally.
    """

    def __init__(self, prefix: str | os.PathLike, dtype, durable: bool = True) -> None:
        self.prefix = strip_suffix(prefix)
        self.dtype = np.dtype(dtype)
        if self.dtype not in CODE_OF_DTYPE:
            raise ValueError(f"dtype {self.dtype} has no MMIDIDX code")
        self.durable = durable
        self.num_sequences = 0
        self.num_documents = 0
        self.num_tokens = 0

    def __enter__(self) -> IndexedDatasetWriter:
        self._bin_tmp = self._len_tmp = self._doc_tmp = self._idx_tmp = None
        self._handles: list = []
        self._committed = False
        try:
            self._bin_tmp = tmp_sibling(bin_path(self.prefix))
            self._len_tmp = tmp_sibling(bin_path(self.prefix), ".lengths")
            self._doc_tmp = tmp_sibling(bin_path(self.prefix), ".docs")
            self._bin = open(self._bin_tmp, "wb")  # noqa: SIM115 - closed in __exit__
            self._lengths = open(self._len_tmp, "wb")  # noqa: SIM115
            self._docs = open(self._doc_tmp, "wb")  # noqa: SIM115
            self._handles = [self._bin, self._lengths, self._docs]
            with self._guard():
                self._docs.write(np.zeros(1, dtype=np.int64).tobytes())
        except BaseException:
            self._close(ok=False)
            raise
        return self

    def _guard(self):
        """A full disk while writing becomes one DiskFullError naming the .bin being written."""
        return disk_full_guard(bin_path(self.prefix))

    # -- adding data ---------------------------------------------------------------------------
    def add_document(self, tokens, sequence_lengths=None) -> None:
        """One document; ``sequence_lengths`` splits it into sentences (default: one sequence)."""
        # No dtype= here: a silent cast would wrap ids that do not fit; _write_tokens checks, then casts.
        tokens = np.asarray(tokens)
        if tokens.size == 0:
            tokens = tokens.astype(self.dtype)
        if sequence_lengths is None:
            self.add_documents(tokens, np.array([tokens.size], dtype=np.int64))
            return
        lengths = np.asarray(sequence_lengths, dtype=np.int64)
        lengths = lengths[lengths > 0]
        self._write_tokens(tokens, lengths)
        self.num_sequences += lengths.size
        with self._guard():
            self._docs.write(np.array([self.num_sequences], dtype=np.int64).tobytes())
        self.num_documents += 1

    def add_documents(self, tokens, lengths) -> None:
        """Many single-sequence documents at once: ``tokens`` flat, ``lengths`` per document.

        A zero length is an empty document: it gets a document index but no sequence, as in Megatron.
        """
        tokens = np.asarray(tokens)
        lengths = np.asarray(lengths, dtype=np.int64)
        if int(lengths.sum()) != tokens.size:
            raise ValueError(f"lengths sum to {int(lengths.sum())} but {tokens.size} tokens were given")
        nonempty = lengths[lengths > 0]
        self._write_tokens(tokens, nonempty)
        doc_ends = self.num_sequences + np.cumsum(lengths > 0, dtype=np.int64)
        with self._guard():
            self._docs.write(doc_ends.tobytes())
        self.num_sequences += nonempty.size
        self.num_documents += lengths.size

    def _write_tokens(self, tokens: np.ndarray, nonempty_lengths: np.ndarray) -> None:
        if tokens.size:
            if tokens.dtype != self.dtype:
                if tokens.size and (
                    int(tokens.min()) < np.iinfo(self.dtype).min
                    or int(tokens.max()) > np.iinfo(self.dtype).max
                ):
                    raise ValueError(
                        f"token ids {int(tokens.min())}..{int(tokens.max())} do not fit {self.dtype}"
                    )
                tokens = tokens.astype(self.dtype)
            with self._guard():
                self._bin.write(memoryview(np.ascontiguousarray(tokens)).cast("B"))
        if nonempty_lengths.size:
            if int(nonempty_lengths.max()) > np.iinfo(np.int32).max:
                raise ValueError("a sequence longer than 2**31-1 tokens cannot be indexed")
            with self._guard():
                self._lengths.write(nonempty_lengths.astype(np.int32).tobytes())
        self.num_tokens += int(tokens.size)

    def add_index(self, reader: IndexedDatasetReader, chunk: int = STREAM_CHUNK) -> dict:
        """Append a whole dataset, as Megatron's ``IndexedDatasetBuilder.add_index`` does (so a merge is
        byte for byte Megatron's ``tools/merge_datasets.py``), in bounded memory: the sequence lengths and
        document indices stream through in chunks of ``chunk`` entries, and the token bytes are copied
        with large sequential I/O (``copy_file_range`` where the kernel has it).

        The dataset is checked as it streams -- negative lengths, byte pointers that are not the running
        sum of the lengths, document indices out of order, a ``.bin`` of the wrong size -- and an
        :class:`InputError` names the file and the byte; nothing is committed then. Returns what was
        added: ``{"sequences", "documents", "tokens", "empty_documents", "bin_bytes"}``.
        """
        with self._guard():  # a full disk: one error naming the output
            return self._add_index(reader, chunk)

    def _add_index(self, reader: IndexedDatasetReader, chunk: int) -> dict:
        if reader.dtype != self.dtype:
            raise InputError(
                f"{reader.idx_file}: token dtype {reader.dtype.name}, but the output is {self.dtype.name} "
                "(datasets of different dtypes cannot be concatenated)"
            )
        if reader.sequence_modes is not None:
            raise InputError(
                f"{reader.idx_file}: has per-sequence modes (a multimodal dataset); only text datasets "
                "can be appended"
            )
        s, itemsize = reader.num_sequences, self.dtype.itemsize
        running = tokens = 0
        pointers_at = HEADER_SIZE + 4 * s
        for lo in range(0, s, chunk):
            lengths = np.asarray(reader.sequence_lengths[lo : lo + chunk])
            if int(lengths.min()) < 0:
                bad = lo + int(np.argmax(lengths < 0))
                raise InputError(
                    f"{where(reader.idx_file, offset=HEADER_SIZE + 4 * bad)}: sequence {bad} has negative "
                    f"length {int(reader.sequence_lengths[bad])} (corrupt index)"
                )
            wide = lengths.astype(np.int64)
            expected = np.empty_like(wide)
            expected[0] = running
            np.cumsum(wide[:-1] * itemsize, out=expected[1:])
            expected[1:] += running
            mismatch = np.flatnonzero(expected != reader.sequence_pointers[lo : lo + chunk])
            if mismatch.size:
                bad = lo + int(mismatch[0])
                raise InputError(
                    f"{where(reader.idx_file, offset=pointers_at + 8 * bad)}: pointer of sequence {bad} is "
                    f"{int(reader.sequence_pointers[bad])}, expected {int(expected[bad - lo])} (corrupt index)"
                )
            running = int(expected[-1] + wide[-1] * itemsize)
            tokens += int(wide.sum())
            self._lengths.write(lengths.astype(np.int32, copy=False).tobytes())
        docs_at = HEADER_SIZE + 12 * s
        previous, empty = 0, 0
        for lo in range(1, reader.num_doc_indices, chunk):
            docs = np.asarray(reader.document_indices[lo : lo + chunk])
            steps = np.diff(docs, prepend=previous)
            if int(steps.min()) < 0:
                bad = lo + int(np.argmax(steps < 0))
                raise InputError(
                    f"{where(reader.idx_file, offset=docs_at + 8 * bad)}: document index {bad} "
                    f"({int(reader.document_indices[bad])}) goes backwards (corrupt index)"
                )
            empty += int(np.count_nonzero(steps == 0))
            previous = int(docs[-1])
            self._docs.write((docs + self.num_sequences).tobytes())
        have = reader.bin_file.stat().st_size
        if have != running:
            raise InputError(
                f"{where(reader.bin_file, offset=min(have, running))}: .bin is {have} bytes but its index "
                f"describes {running} ({'truncated' if have < running else 'trailing data'})"
            )
        self._bin.flush()
        with open(reader.bin_file, "rb") as source:
            copied = copy_bytes(source, self._bin, running)
        if copied != running:
            raise InputError(
                f"{where(reader.bin_file, offset=copied)}: .bin ended after {copied} of {running} bytes "
                "(truncated while being read?)"
            )
        added = {
            "sequences": s,
            "documents": reader.num_documents,
            "tokens": tokens,
            "empty_documents": empty,
            "bin_bytes": running,
        }
        self.num_sequences += s
        self.num_documents += reader.num_documents
        self.num_tokens += tokens
        return added

    # -- finishing -----------------------------------------------------------------------------
    def finish(self) -> None:
        """Write the index to its temporary name (the slow part of finishing); :meth:`commit` then only
        renames. Called by ``__exit__`` when not called before; a command that commits several outputs
        together calls it on each first, then commits them inside one :func:`critical` section."""
        if self._idx_tmp is not None:
            return
        for handle in self._handles:
            with self._guard():
                handle.close()
        self._idx_tmp = tmp_sibling(idx_path(self.prefix))
        with disk_full_guard(idx_path(self.prefix)):
            self._write_index(self._idx_tmp)
        if self.durable:
            with self._guard():
                fsync_file(self._bin_tmp)
                fsync_file(self._idx_tmp)

    def commit(self) -> None:
        """Rename ``.bin`` then ``.idx`` into place (an ``.idx`` never points at a ``.bin`` that is not complete)."""
        if self._committed:
            return
        self.finish()
        with critical():
            commit_file(self._bin_tmp, bin_path(self.prefix), durable=False)
            commit_file(self._idx_tmp, idx_path(self.prefix), durable=False)
        if self.durable:
            fsync_dir(Path(self.prefix).parent)
        self._bin_tmp = self._idx_tmp = None
        self._committed = True
        self._close(ok=True)

    def _close(self, ok: bool) -> None:
        for handle in self._handles:
            with contextlib.suppress(OSError):
                handle.close()
        for path in (self._bin_tmp, self._len_tmp, self._doc_tmp, self._idx_tmp):
            if path is not None:
                discard(path)

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._close(ok=False)
            return
        if self._committed:
            return
        try:
            self.commit()
        except BaseException:
            self._close(ok=False)
            raise

    def _write_index(self, path: Path, chunk: int = STREAM_CHUNK) -> None:
        # The bookkeeping is read back with plain sequential reads and kernel copies, not a memory map:
        # a map of the whole file would count every page of it in this process's memory (RSS), which
        # would then grow with the dataset (merges of thousands of shards, corpora of billions of docs).
        itemsize = self.dtype.itemsize
        with open(path, "wb") as out:
            out.write(MAGIC)
            out.write(struct.pack("<Q", VERSION))
            out.write(struct.pack("<B", CODE_OF_DTYPE[self.dtype]))
            out.write(struct.pack("<Q", self.num_sequences))
            out.write(struct.pack("<Q", self.num_documents + 1))
            with open(self._len_tmp, "rb") as lengths:
                self._copy_exactly(lengths, out, 4 * self.num_sequences)
            running = 0
            with open(self._len_tmp, "rb") as lengths:
                for _ in range(0, self.num_sequences, chunk):  # byte pointers, streamed in chunks
                    part = np.fromfile(lengths, dtype=np.int32, count=chunk).astype(np.int64) * itemsize
                    pointers = np.empty_like(part)
                    pointers[0] = running
                    np.cumsum(part[:-1], out=pointers[1:])
                    pointers[1:] += running
                    running = int(pointers[-1] + part[-1])
                    out.write(pointers.tobytes())
            with open(self._doc_tmp, "rb") as docs:
                self._copy_exactly(docs, out, 8 * (self.num_documents + 1))

    @staticmethod
    def _copy_exactly(source, target, count: int) -> None:
        copied = copy_bytes(source, target, count)
        if copied != count:
            raise OSError(f"{source.name}: {copied} bytes where {count} were written (changed on disk?)")
