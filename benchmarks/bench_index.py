#!/usr/bin/env python3
"""What validating an ``.idx`` on open costs, on a 1B-token dataset (goal: < 5% of opening it).

The dataset is synthetic: a sparse 2 GB ``.bin`` (validation reads only its size) and an ``.idx`` whose
document lengths are drawn from a log-normal distribution, written directly. Two shapes:
``web`` (mean ~1,000 tokens a document: ~1M sequences) and ``short`` (mean ~200: ~5M sequences).

Measured in interleaved rounds (warm page cache; the median of each is reported):

* ``validate``       ``IndexedDatasetReader.validate()`` alone: the cost this benchmark is about;
* ``bare open``      the reader without validation: header, two memory maps (what opening cost before);
* ``open (llm-mix)`` what every consumer does to open a source: ``llmtools.data.mix.open_source``
                     (the validated reader, the sha256 of the ``.idx`` that names the plan, the sidecar);
* ``open (train)``   ``BlendedGPTDataset.from_prefixes`` for one epoch at sequence length 2048: the source
                     opened and its GPT document / sample / shuffle indices built;
* ``cold``           ``validate`` right after the ``.idx`` pages were dropped from the page cache
                     (``posix_fadvise(DONTNEED)``: the index read from disk), and the bare open plus a
                     first full pass over the index (``document_lengths``), equally cold.

    python benchmarks/bench_index.py                 # both shapes, 5 rounds
    python benchmarks/bench_index.py --quick         # 100M tokens, 2 rounds: a smoke run
    python benchmarks/bench_index.py --workdir /tmp/bench_index --keep
"""

from __future__ import annotations

import argparse
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


class _Unchecked(IndexedDatasetReader):
    """The reader as it opened before: header and memory maps, no O(sequences) checks."""

    def validate(self) -> None:
        pass


def _drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _time(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def measure(prefix: Path, rounds: int, seq_length: int) -> dict[str, list[float]]:
    from llmtools.data.dataset import BlendedGPTDataset
    from llmtools.data.mix import open_source

    tokens = IndexedDatasetReader(prefix).num_tokens
    epoch_samples = (tokens - 1) // seq_length
    idx = f"{prefix}.idx"
    reader = IndexedDatasetReader(prefix)
    steps = {
        "validate": lambda: reader.validate(),
        "bare open": lambda: _Unchecked(prefix),
        "open (llm-mix)": lambda: open_source(str(prefix)),
        "open (train)": lambda: BlendedGPTDataset.from_prefixes(
            [str(prefix)], None, seq_length=seq_length, num_samples=epoch_samples, split="100,0,0"
        ),
    }
    cold = {
        "cold validate": lambda: reader.validate(),
        "cold bare open + first pass": lambda: _Unchecked(prefix).document_lengths(),
    }
    times: dict[str, list[float]] = {name: [] for name in [*steps, *cold]}
    for round_ in range(rounds):
        order = list(steps) if round_ % 2 == 0 else list(reversed(steps))
        for name in order:
            times[name].append(_time(steps[name]))
        for name, fn in cold.items():
            _drop_cache(idx)
            times[name].append(_time(fn))
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="100M tokens, 2 rounds")
    parser.add_argument("--tokens", type=float, default=1e9)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seq-length", type=int, default=2048)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    tokens = int(1e8 if args.quick else args.tokens)
    rounds = 2 if args.quick else args.rounds
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench_index_"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        print(f"\n## Index validation on open: {tokens / 1e9:g}B tokens, median of {rounds} rounds\n")
        print("| shape | sequences | .idx MB | validate ms | ns/seq | bare open ms | open (llm-mix) ms | "
              "open (train) ms | validate / open (llm-mix) | validate / open (train) | cold validate ms | "
              "cold bare open + first pass ms |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for shape, mean in (("web", 1000.0), ("short", 200.0)):
            prefix = workdir / f"{shape}_text_document"
            if not Path(f"{prefix}.idx").exists():
                make_dataset(prefix, tokens, mean)
            reader = IndexedDatasetReader(prefix)
            s, idx_mb = reader.num_sequences, reader.idx_file.stat().st_size / 1e6
            del reader
            t = {k: statistics.median(v) * 1e3 for k, v in measure(prefix, rounds, args.seq_length).items()}
            print(
                f"| {shape} | {s:,} | {idx_mb:.0f} | {t['validate']:.1f} | {t['validate'] * 1e6 / s:.1f} | "
                f"{t['bare open']:.2f} | {t['open (llm-mix)']:.1f} | {t['open (train)']:.1f} | "
                f"{t['validate'] / t['open (llm-mix)']:.1%} | {t['validate'] / t['open (train)']:.1%} | "
                f"{t['cold validate']:.1f} | {t['cold bare open + first pass']:.1f} |",
                flush=True,
            )
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
