#!/usr/bin/env python3
"""What validating an ``.idx`` on open costs, on a 1B-token dataset (goal: < 5% of opening it).

The dataset is synthetic: a sparse 2 GB ``.bin`` (validation reads only its size) and an ``.idx`` whose
document lengths are drawn from a log-normal distribution, written directly. Two shapes:
``web`` (mean ~1,000 tokens a document: ~1M sequences) and ``short`` (mean ~200: ~5M sequences).

"Opening" is what a consumer does before it reads a token; each is timed with the validation and without
it (``IndexedDatasetReader.validate`` replaced by a no-op), in interleaved pairs, and the medians compared:

* ``reader + first pass``  the reader, then one pass over the index (``document_lengths``, as the GPT
                           index builder makes): the least any consumer does;
* ``same, cold``           the same with the ``.idx`` dropped from the page cache first
                           (``posix_fadvise(DONTNEED)``): read from disk, as a fresh job on a new node would;
* ``llm-mix source``       ``llmtools.data.mix_sources.open_source``: the reader, the sha256 of the ``.idx`` that
                           names the plan, the sidecar;
* ``training``             ``BlendedGPTDataset.from_prefixes`` for one epoch at sequence length 2048: the
                           source opened and its GPT document / sample / shuffle indices built.

The validation alone (compiled pass, on an index already in memory) is given per sequence too.

    python benchmarks/bench_index.py                 # both shapes, 7 pairs each
    python benchmarks/bench_index.py --quick         # 100M tokens, 3 pairs: a smoke run
    python benchmarks/bench_index.py --workdir /tmp/bench_index --keep
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from llmtools.formats.indexed import HEADER_SIZE, MAGIC, VERSION, IndexedDatasetReader  # noqa: E402


def make_dataset(prefix: Path, tokens: int, mean: float, seed: int = 0) -> int:
    """A valid .idx for ``tokens`` uint16 tokens in log-normal documents; a sparse .bin. Returns S."""
    rng = np.random.default_rng(seed)
    sigma = 1.0
    lengths = rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, size=int(tokens / mean * 1.2) + 16)
    lengths = np.maximum(1, lengths).astype(np.int64)
    cum = np.cumsum(lengths)
    s = int(np.searchsorted(cum, tokens)) + 1
    lengths = lengths[:s]
    lengths[-1] -= int(cum[s - 1]) - tokens  # exactly ``tokens`` in all
    lengths = lengths[lengths > 0].astype(np.int32)
    s = lengths.size
    pointers = np.zeros(s, dtype=np.int64)
    np.cumsum(lengths[:-1].astype(np.int64) * 2, out=pointers[1:])
    docs = np.arange(s + 1, dtype=np.int64)
    with open(f"{prefix}.idx", "wb") as out:
        out.write(MAGIC + struct.pack("<Q", VERSION) + struct.pack("<B", 8))  # 8: uint16
        out.write(struct.pack("<QQ", s, s + 1))
        for array in (lengths, pointers, docs):
            out.write(array.tobytes())
    with open(f"{prefix}.bin", "wb") as out:
        out.truncate(tokens * 2)  # sparse: validation reads only the size
    assert Path(f"{prefix}.idx").stat().st_size == HEADER_SIZE + 12 * s + 8 * (s + 1)
    return s


def _drop_cache(path: str) -> None:
    gc.collect()  # no map of the file may stay alive, or its pages stay in the cache
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _timed(fn, before=None) -> float:
    if before is not None:
        before()
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def measure(prefix: Path, pairs: int, seq_length: int) -> dict[str, tuple[float, float]]:
    """{consumer: (median seconds with validation, median without)}."""
    from llmtools.data.dataset import BlendedGPTDataset
    from llmtools.data.mix_sources import open_source

    tokens = IndexedDatasetReader(prefix).num_tokens
    idx = f"{prefix}.idx"
    consumers = {
        "reader + first pass": (lambda: IndexedDatasetReader(prefix).document_lengths(), None),
        "same, cold": (lambda: IndexedDatasetReader(prefix).document_lengths(), lambda: _drop_cache(idx)),
        "llm-mix source": (lambda: open_source(str(prefix)), None),
        "training": (
            lambda: BlendedGPTDataset.from_prefixes(
                [str(prefix)],
                None,
                seq_length=seq_length,
                num_samples=(tokens - 1) // seq_length,
                split="100,0,0",
            ),
            None,
        ),
    }
    checked = IndexedDatasetReader.validate
    results = {}
    for name, (fn, before) in consumers.items():
        arms: dict[bool, list[float]] = {True: [], False: []}
        for pair in range(pairs):
            for validating in (True, False) if pair % 2 == 0 else (False, True):
                IndexedDatasetReader.validate = checked if validating else (lambda self: None)
                try:
                    arms[validating].append(_timed(fn, before))
                finally:
                    IndexedDatasetReader.validate = checked
        results[name] = (statistics.median(arms[True]), statistics.median(arms[False]))
    return results


def check_alone(prefix: Path, rounds: int) -> float:
    """Seconds of ``validate()`` on a reader whose index is already mapped and touched."""
    reader = IndexedDatasetReader(prefix)
    return statistics.median(_timed(reader.validate) for _ in range(rounds))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="100M tokens, 3 pairs")
    parser.add_argument("--tokens", type=float, default=1e9)
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--seq-length", type=int, default=2048)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    tokens = int(1e8 if args.quick else args.tokens)
    pairs = 3 if args.quick else args.pairs
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench_index_"))
    workdir.mkdir(parents=True, exist_ok=True)
    from llmtools import _native

    native = "compiled" if _native.load() is not None else "numpy (no compiled helpers)"
    try:
        print(
            f"\n## Index validation on open: {tokens / 1e9:g}B tokens, {native} check, medians of {pairs} pairs\n"
        )
        print(
            "| shape | sequences | .idx MB | check alone ms (ns/seq) | opening | with check ms | without ms | cost |"
        )
        print("|---|---:|---:|---:|---|---:|---:|---:|")
        for shape, mean in (("web", 1000.0), ("short", 200.0)):
            prefix = workdir / f"{shape}_text_document"
            if not Path(f"{prefix}.idx").exists():
                make_dataset(prefix, tokens, mean)
            reader = IndexedDatasetReader(prefix)
            s, idx_mb = reader.num_sequences, reader.idx_file.stat().st_size / 1e6
            del reader
            alone = check_alone(prefix, 2 * pairs + 1)
            first = True
            for name, (with_, without) in measure(prefix, pairs, args.seq_length).items():
                head = (
                    f"| {shape} | {s:,} | {idx_mb:.0f} | {alone * 1e3:.2f} ({alone * 1e9 / s:.1f})"
                    if first
                    else "| | | |"
                )
                first = False
                cost = (with_ - without) / without
                print(
                    f"{head} | {name} | {with_ * 1e3:.1f} | {without * 1e3:.1f} | {cost:+.1%} |", flush=True
                )
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
