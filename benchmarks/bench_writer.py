#!/usr/bin/env python3
"""What one writer per output costs: the lock (llmtools.locks), side by side with what it protects.

1. ``lock_output`` taken and released (open, flock, holder record + fsync, unlink, close) against the
   smallest output a command writes: one atomic file (temporary, fsync, rename, directory fsync). Paired,
   interleaved rounds; the ratio is per round, then the median.
2. The same lock inside a command: ``llm-prep json2bin`` on a small JSONL (byte tokenizer), in process,
   with the lock and with it stubbed out, interleaved rounds.

Usage: python benchmarks/bench_writer.py [--quick] [--rounds N] [--dir PATH]
(--dir: run on another filesystem, e.g. an NFS or Lustre mount, to see its lock cost.)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmtools import locks  # noqa: E402
from llmtools.fsutil import write_text_atomic  # noqa: E402


def per_call(fn, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


def lock_cycle(target: Path):
    def run():
        with locks.lock_output(target):
            pass

    return run


def atomic_write(target: Path):
    def run():
        write_text_atomic(target, "x\n")

    return run


def paired(fa, fb, rounds: int, n: int) -> tuple[list[float], list[float]]:
    fa(), fb()  # warm both
    a, b = [], []
    for r in range(rounds):
        first, second = (fa, fb) if r % 2 == 0 else (fb, fa)
        t1, t2 = per_call(first, n), per_call(second, n)
        (a if first is fa else b).append(t1)
        (b if first is fa else a).append(t2)
    return a, b


def json2bin_with_and_without_lock(folder: Path, rounds: int, docs: int) -> tuple[list[float], list[float]]:
    from llmtools.prep import json2bin as j2b

    corpus = folder / "in.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(docs)))

    def run(locked: bool, i: int) -> float:
        out = folder / f"out{i}_{int(locked)}"
        real = locks.lock_output
        if not locked:  # json2bin imports lock_output at each call: a stub here takes the lock out
            locks.lock_output = lambda *_a, **_k: contextlib.nullcontext([])
        try:
            start = time.perf_counter()
            j2b.json2bin([str(corpus)], "byte", str(out), workers=1, progress=False)
            return time.perf_counter() - start
        finally:
            locks.lock_output = real

    run(True, -1), run(False, -1)
    with_lock, without = [], []
    for r in range(rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        for locked in order:
            (with_lock if locked else without).append(run(locked, r))
    return with_lock, without


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--dir", type=Path, default=None, help="where to lock (default: a temporary folder)")
    args = parser.parse_args()
    rounds, n, docs = (3, 50, 200) if args.quick else (args.rounds, 500, 2000)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp)
        lock_t, write_t = paired(
            lock_cycle(folder / "data_text_document"), atomic_write(folder / "f.txt"), rounds, n
        )
        ratios = [a / b for a, b in zip(lock_t, write_t, strict=True)]
        print(f"lock taken + released: median {statistics.median(lock_t) * 1e6:.0f} us "
              f"(rounds: {', '.join(f'{t * 1e6:.0f}' for t in lock_t)})")  # fmt: skip
        print(f"one atomic small-file write: median {statistics.median(write_t) * 1e6:.0f} us")
        print(
            f"lock / atomic write: {statistics.median(ratios):.2f}x (per round: {', '.join(f'{r:.2f}' for r in ratios)})"
        )
        with_lock, without = json2bin_with_and_without_lock(folder, rounds, docs)
        overhead = [a / b - 1 for a, b in zip(with_lock, without, strict=True)]
        print(f"json2bin, {docs} docs, byte tokenizer, in process: with the lock median "
              f"{statistics.median(with_lock) * 1e3:.1f} ms, without {statistics.median(without) * 1e3:.1f} ms, "
              f"overhead {statistics.median(overhead) * 100:+.1f}% (per round: "
              f"{', '.join(f'{o * 100:+.1f}%' for o in overhead)})")  # fmt: skip


if __name__ == "__main__":
    main()
