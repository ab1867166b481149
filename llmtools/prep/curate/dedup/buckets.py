"""Stage 2, one unit per band (and one for exact duplicates): the pairs of documents whose band (or whose
normalised-text hash) is equal, in datatrove's order.

datatrove merges every input's sorted band file through a heap and writes (previous, current) whenever two
neighbours have equal signatures; the heap orders records by (signature, input, document). Here the merge
is done a range of first-hash values at a time: each input's sorted file is cut where the range ends (a
binary search), the pieces are sorted together by the same key and neighbours compared at once. The pairs
are those datatrove writes, in its order; memory holds one range, whatever the corpus size."""

from __future__ import annotations

from bisect import bisect_left
from pathlib import Path

import numpy as np

from llmtools.errors import InputError
from llmtools.fsutil import atomic_file
from llmtools.prep.curate.dedup.layout import Plan, pairs_path, sig_dir
from llmtools.prep.curate.dedup.signatures import EXACT_DTYPE, band_dtype

PAIR_DTYPE = np.dtype([("f1", "<u4"), ("d1", "<u4"), ("f2", "<u4"), ("d2", "<u4")])
RANGE_RECORDS = 1 << 21
"""Records sorted together at most (about: equal first hashes are never split): ~150 MB for 8 rows."""


class _Column:
    """The first field of a memory-mapped record file as a sequence `bisect` can search (no copy)."""

    def __init__(self, records: np.ndarray, field: str) -> None:
        self.records, self.field = records, field

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> int:
        return int(self.records[i][self.field])


def _open(path: Path, dtype: np.dtype, docs: int) -> np.ndarray:
    size = path.stat().st_size
    if size % dtype.itemsize:
        raise InputError(
            f"{path}: {size} bytes, not a whole number of {dtype.itemsize}-byte records (damaged?)"
        )
    if size == 0:
        return np.empty(0, dtype=dtype)
    records = np.memmap(path, dtype=dtype, mode="r")
    if len(records) > docs:
        raise InputError(f"{path}: {len(records)} records for {docs} documents (damaged?)")
    return records


def _boundaries(columns: list[np.ndarray], first: str, total: int) -> list[int]:
    """First-hash values that cut the band into ranges of about RANGE_RECORDS records (sampled)."""
    parts = -(-total // RANGE_RECORDS)
    if parts <= 1:
        return []
    step = max(1, total // (parts * 64))
    sample = np.sort(np.concatenate([c[first][::step].astype(np.uint64) for c in columns if len(c)]))
    cuts = np.unique(sample[np.linspace(0, len(sample) - 1, parts + 1)[1:-1].astype(np.int64)])
    return [int(c) for c in cuts]


def find_pairs(out: Path, plan: Plan, unit: int) -> int:
    """Write the pairs of `unit` (a band, or `bands` for exact duplicates); returns how many."""
    config = plan.config
    exact = unit == config.bands
    dtype = EXACT_DTYPE if exact else band_dtype(config)
    name = "exact.bin" if exact else f"band_{unit:03d}.sig"
    files = range(len(plan.paths))
    counts = [len(np.load(sig_dir(out, f) / "docs.npy", mmap_mode="r")) for f in files]
    records = [_open(sig_dir(out, f) / name, dtype, counts[f]) for f in files]
    keys = [n for n in dtype.names if n != "doc"]
    first = keys[0]
    total = sum(len(r) for r in records)
    cuts = _boundaries(records, first, total)
    found = 0
    with atomic_file(pairs_path(out, unit, config), "wb") as handle:
        starts = [0] * len(records)
        for hi in [*cuts, None]:
            ends = [
                len(r) if hi is None else bisect_left(_Column(r, first), hi, lo=s)
                for r, s in zip(records, starts, strict=True)
            ]
            pieces = [
                (f, records[f][s:e]) for f, (s, e) in enumerate(zip(starts, ends, strict=True)) if e > s
            ]
            starts = ends
            if not pieces:
                continue
            pairs = _range_pairs(pieces, keys, exact)
            found += len(pairs)
            handle.write(pairs.tobytes())
    return found


def _range_pairs(pieces, keys: list[str], exact: bool) -> np.ndarray:
    merged = np.concatenate([np.asarray(p) for _, p in pieces])
    file = np.concatenate([np.full(len(p), f, dtype=np.uint32) for f, p in pieces])
    doc = merged["doc"]
    order = np.lexsort([doc, file, *[merged[k] for k in reversed(keys)]])
    merged, file, doc = merged[order], file[order], doc[order]
    same = np.ones(len(merged) - 1, dtype=bool)
    for k in keys:
        column = merged[k]
        same &= column[1:] == column[:-1]
    at = np.flatnonzero(same) + 1  # record at[i] equals the one before it
    pairs = np.empty(len(at), dtype=PAIR_DTYPE)
    if exact:
        # every copy paired with its group's first (the order within a group does not matter here)
        starts = np.flatnonzero(np.concatenate([[True], ~same]))
        head = starts[np.searchsorted(starts, at, side="right") - 1]
        pairs["f1"], pairs["d1"] = file[head], doc[head]
    else:
        pairs["f1"], pairs["d1"] = file[at - 1], doc[at - 1]
    pairs["f2"], pairs["d2"] = file[at], doc[at]
    return pairs
