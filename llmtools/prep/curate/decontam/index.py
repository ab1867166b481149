"""The index of evaluation n-grams: a file of ours, built once, memory-mapped, checked on open.

Layout (little-endian)::

    magic    8 bytes  b"LLMNGRAM"
    version  uint32   1
    hlen     uint32   length of the header
    header   hlen bytes of UTF-8 JSON, padded with spaces to a multiple of 8 bytes
    key      uint64[entries]  ascending (ties by check, then task)
    check    uint64[entries]
    task     uint16[entries]  the position of the entry's task in header["tasks"]

The header: ``n``, ``normalization`` (:data:`.ngrams.NORMALIZATION`), ``entries``, and ``tasks``: one
record per evaluation set (name, kind, path, bytes, sha256 of the file, texts, words, n-grams, distinct
n-grams). One entry per distinct (n-gram, task): 18 bytes each.

Opening checks the header and its bounds, that the file holds exactly ``entries`` entries, that the keys
ascend and the task ids exist, and that each task's count of entries is the one its header states; a
file that fails is an :class:`InputError` naming it. Lookups first ask a bitmap of the keys' top bits
(built on open, in memory, about 8 bits per entry) and search the sorted keys only for what passes.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from pathlib import Path

import numpy as np

from llmtools.errors import InputError
from llmtools.formats import jsonfile
from llmtools.fsutil import atomic_file

from .ngrams import NORMALIZATION, Hasher, check_hash, eval_words
from .sources import MAX_TASKS, EvalSource

MAGIC = b"LLMNGRAM"
VERSION = 1
MAX_HEADER = 64 << 20
MAX_N = 1000
ENTRY_BYTES = 18
_PREFIX = struct.Struct("<8sII")


def build(
    sources: list[EvalSource], n: int, progress=None
) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray]:
    """Hash every n-gram of every source: ``(header, key, check, task)``, sorted and without repeats."""
    if not 1 <= n <= MAX_N:
        raise InputError(f"--ngram: expected 1..{MAX_N}, got {n}")
    hasher = Hasher(n)
    keys, checks, tasks, records = [], [], [], []
    for number, source in enumerate(sources):
        texts = words_total = ngrams_total = 0
        task_keys, task_checks = [], []
        for pieces in source.texts():
            texts += 1
            carry: list[str] = []
            for piece in pieces:
                words = carry + eval_words(piece)
                found = hasher.keys(words)
                if len(found):
                    task_keys.append(found)
                    task_checks.append(
                        np.fromiter(
                            (check_hash(" ".join(words[i : i + n])) for i in range(len(found))),
                            dtype=np.uint64,
                            count=len(found),
                        )  # fmt: skip
                    )
                    ngrams_total += len(found)
                words_total += len(words) - len(carry)
                carry = words[len(words) - n + 1 :] if n > 1 else []
                if progress is not None:
                    progress(len(piece))
        key, check = _distinct(task_keys, task_checks)
        keys.append(key)
        checks.append(check)
        tasks.append(np.full(len(key), number, dtype=np.uint16))
        records.append(
            {
                **source.describe(),
                "texts": texts,
                "words": words_total,
                "ngrams": ngrams_total,
                "distinct": len(key),
            }
        )
    key, check, task = (np.concatenate(a) if a else np.zeros(0, np.uint64) for a in (keys, checks, tasks))
    task = task.astype(np.uint16)
    order = np.lexsort((task, check, key))
    header = {"n": n, "normalization": NORMALIZATION, "entries": int(len(key)), "tasks": records}
    return header, key[order], check[order], task[order]


def _distinct(keys: list[np.ndarray], checks: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    if not keys:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    pairs = np.unique(np.stack([np.concatenate(keys), np.concatenate(checks)], axis=1), axis=0)
    return np.ascontiguousarray(pairs[:, 0]), np.ascontiguousarray(pairs[:, 1])


def write_to(handle, header: dict, key: np.ndarray, check: np.ndarray, task: np.ndarray) -> None:
    """The index file's bytes, into an open binary file."""
    text = jsonfile.dumps(header, what="n-gram index header").encode("utf-8")
    text += b" " * (-(_PREFIX.size + len(text)) % 8)
    handle.write(_PREFIX.pack(MAGIC, VERSION, len(text)))
    handle.write(text)
    for array, dtype in ((key, "<u8"), (check, "<u8"), (task, "<u2")):
        handle.write(np.ascontiguousarray(array, dtype=dtype).tobytes())


def save(path: str | os.PathLike, header: dict, key: np.ndarray, check: np.ndarray, task: np.ndarray) -> None:
    """The index file, written whole to a temporary and renamed into place."""
    with atomic_file(path, "wb") as handle:
        write_to(handle, header, key, check, task)


class NgramIndex:
    """An index file opened for lookups (read-only, memory-mapped)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        except OSError as error:
            raise InputError(f"{self.path}: cannot read ({error.strerror})") from None
        self.header, offset = self._read_header(size)
        self.n = self.header["n"]
        self.tasks = [t["name"] for t in self.header["tasks"]]
        m = self.header["entries"]
        if size != offset + m * ENTRY_BYTES:
            raise InputError(
                f"{self.path}: {size:,} bytes where its header promises {offset + m * ENTRY_BYTES:,}"
            )
        self.key = np.frombuffer(self._map, dtype="<u8", count=m, offset=offset)
        self.check = np.frombuffer(self._map, dtype="<u8", count=m, offset=offset + 8 * m)
        self.task = np.frombuffer(self._map, dtype="<u2", count=m, offset=offset + 16 * m)
        self._validate()
        self._bits, self._shift = _bitmap(self.key)

    def _read_header(self, size: int) -> tuple[dict, int]:
        if size < _PREFIX.size or self._map[:8] != MAGIC:
            raise InputError(f"{self.path}: not an n-gram index of ours (no {MAGIC.decode()} magic)")
        _, version, hlen = _PREFIX.unpack(self._map[: _PREFIX.size])
        if version != VERSION:
            raise InputError(
                f"{self.path}: n-gram index version {version}; this llmtools reads version {VERSION}"
            )
        if hlen > MAX_HEADER or _PREFIX.size + hlen > size or (_PREFIX.size + hlen) % 8:
            raise InputError(f"{self.path}: header length {hlen:,} out of bounds (file of {size:,} bytes)")
        try:
            header = jsonfile.loads(
                bytes(self._map[_PREFIX.size : _PREFIX.size + hlen]).decode("utf-8"), finite=True
            )
        except (ValueError, UnicodeDecodeError) as error:
            raise InputError(f"{self.path}: header is not JSON ({error})") from None
        _check_header(self.path, header)
        return header, _PREFIX.size + hlen

    def _validate(self) -> None:
        where = self.path
        if len(self.key) > 1 and not bool(np.all(self.key[1:] >= self.key[:-1])):
            raise InputError(
                f"{where}: keys out of order at entry {int(np.argmin(self.key[1:] >= self.key[:-1])) + 1}"
            )
        counts = (
            np.bincount(self.task, minlength=len(self.tasks)) if len(self.task) else np.zeros(len(self.tasks))
        )
        if len(counts) > len(self.tasks):
            raise InputError(
                f"{where}: an entry names task {len(counts) - 1}; the header lists {len(self.tasks)}"
            )
        for record, count in zip(self.header["tasks"], counts.tolist(), strict=False):
            if record["distinct"] != count:
                raise InputError(
                    f"{where}: task {record['name']!r} has {count:,} entries; its header says {record['distinct']:,}"
                )

    def candidates(self, keys: np.ndarray) -> np.ndarray:
        """Positions in ``keys`` whose key is in the index (an n-gram there, or a key collision)."""
        if not len(self.key) or not len(keys):
            return np.zeros(0, dtype=np.intp)
        top = keys >> self._shift
        maybe = np.flatnonzero((self._bits[top >> np.uint64(3)] >> (top & np.uint64(7)).astype(np.uint8)) & 1)
        if not len(maybe):
            return maybe
        found = np.searchsorted(self.key, keys[maybe])
        inside = found < len(self.key)
        hit = np.zeros(len(maybe), dtype=bool)
        hit[inside] = self.key[found[inside]] == keys[maybe][inside]
        return maybe[hit]

    def tasks_of(self, key: int, ngram: str) -> list[int]:
        """The tasks holding this n-gram (its text, normalised): none when only the key collided."""
        key = np.uint64(key)
        lo, hi = np.searchsorted(self.key, key, "left"), np.searchsorted(self.key, key, "right")
        check = check_hash(ngram)
        return sorted(
            {
                int(t)
                for c, t in zip(self.check[lo:hi].tolist(), self.task[lo:hi].tolist(), strict=True)
                if c == check
            }
        )

    def close(self) -> None:
        self.key = self.check = self.task = None
        if isinstance(self._map, mmap.mmap):
            with contextlib.suppress(BufferError):  # a view still held elsewhere: the collector closes it
                self._map.close()


def _bitmap(key: np.ndarray) -> tuple[np.ndarray, np.uint64]:
    """One bit per value of the keys' top ``b`` bits, 2**b about 64 times the entries (a miss is turned
    away here 98% of the time without touching the sorted keys)."""
    bits = int(min(30, max(16, (max(1, len(key)) * 64 - 1).bit_length())))
    shift = np.uint64(64 - bits)
    table = np.zeros(1 << (bits - 3), dtype=np.uint8)
    if len(key):
        top = key >> shift  # ascending, as the keys are (checked before)
        top = top[np.concatenate(([True], top[1:] != top[:-1]))]
        byte = top >> np.uint64(3)
        value = (np.uint8(1) << (top & np.uint64(7)).astype(np.uint8)).astype(np.uint8)
        starts = np.flatnonzero(np.concatenate(([True], byte[1:] != byte[:-1])))
        table[byte[starts]] = np.add.reduceat(value, starts).astype(np.uint8)  # distinct bits: sum == or
    return table, shift


def _check_header(path: Path, header) -> None:
    def bad(what: str):
        return InputError(f"{path}: header: {what}")

    if not isinstance(header, dict):
        raise bad("expected a JSON object")
    n = header.get("n")
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
        raise bad(f"n: expected 1..{MAX_N}")
    if header.get("normalization") != NORMALIZATION:
        raise bad(f"normalization {header.get('normalization')!r}; this llmtools makes {NORMALIZATION!r}")
    entries = header.get("entries")
    if not isinstance(entries, int) or isinstance(entries, bool) or entries < 0:
        raise bad("entries: expected a count")
    tasks = header.get("tasks")
    if not isinstance(tasks, list) or not 1 <= len(tasks) <= MAX_TASKS:
        raise bad(f"tasks: expected a list of 1..{MAX_TASKS} records")
    for i, task in enumerate(tasks):
        if not isinstance(task, dict) or not isinstance(task.get("name"), str) or not task["name"]:
            raise bad(f"tasks[{i}]: expected a record with a name")
        for field in ("distinct", "ngrams", "texts", "words"):
            value = task.get(field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise bad(f"tasks[{i}].{field}: expected a count")
