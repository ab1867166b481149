#!/usr/bin/env python3
"""What one writer per output costs: the lock (llmtools.locks), side by side with what it protects.

1. ``lock_output`` taken and released (open, flock, holder record + fsync, unlink, close) against the
   smallest output a command writes: one atomic file (temporary, fsync, rename, directory fsync). Paired,
   interleaved rounds; the ratio is per round, then the median.
2. The same lock inside a command: ``llm-prep json2bin`` on a small JSONL (byte tokenizer), in process,
   with the lock and with it stubbed out, interleaved rounds.
3. Plan verification on open (llmtools.data.plan_check, the cache digests, the source fingerprints) for a
   plan of --sources sources (default 1,000): ``BlendedGPTDataset.from_mix`` with every check, and with
   the checks taken out (stubs, and a mix.json without digests or fingerprints), interleaved rounds; warm
   page cache. Goal: the checks cost < 1 s at 1,000 sources.

Usage: python benchmarks/bench_writer.py [--quick] [--rounds N] [--sources N] [--dir PATH]
(--dir: run on another filesystem, e.g. an NFS or Lustre mount, to see its lock cost.)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
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


def make_sources(folder: Path, count: int, docs: int, seed: int = 0) -> list[str]:
    """``count`` small byte-token sources with sidecars (random document lengths, 50-500 tokens)."""
    import numpy as np

    from llmtools.formats.indexed import IndexedDatasetWriter
    from llmtools.formats.sidecar import write_sidecar
    from llmtools.tokenize import load_tokenizer

    identity = load_tokenizer("byte").identity()
    rng = np.random.default_rng(seed)
    prefixes = []
    for i in range(count):
        prefix = folder / f"src{i:04d}_text_document"
        lengths = rng.integers(50, 500, size=docs)
        with IndexedDatasetWriter(prefix, np.uint16) as writer:
            writer.add_documents(rng.integers(0, 256, size=int(lengths.sum()), dtype=np.uint16), lengths)
        write_sidecar(prefix, {"format": "llmtools.indexed-sidecar", "version": 1, "tokenizer": identity})
        prefixes.append(str(prefix))
    return prefixes


def plan_open(folder: Path, sources: int, docs: int, samples: int, rounds: int):
    """Seconds to open a ``sources``-source plan with every check and without them, interleaved."""
    from llmtools.data import dataset as dataset_module
    from llmtools.data import mix as mixlib
    from llmtools.data import plan_check

    prefixes = make_sources(folder, sources, docs)
    started = time.perf_counter()
    config = mixlib.MixConfig(
        blend=mixlib.Blend(prefixes, [1.0] * len(prefixes)),
        seq_length=256,
        num_samples=samples,
        split="100,0,0",
    )
    checked = folder / "mix.json"
    mixlib.save_plan(mixlib.build_plan(config), checked)
    built = time.perf_counter() - started
    bare = folder / "bare" / "mix.json"  # the same plan, nothing to verify: no digests, no fingerprints
    bare.parent.mkdir()
    data = json.loads(checked.read_text())
    data["cache"].pop("digests")
    for source in data["sources"]:
        source.pop("files")
    for name in data["cache"]["files"]["train"].values():
        os.link(folder / name, bare.parent / name)
    bare.write_text(json.dumps(data))

    real = (plan_check.check_recorded, plan_check.check_arrays, plan_check.check_source)

    def open_plan(verify: bool) -> float:
        if not verify:
            plan_check.check_recorded = plan_check.check_arrays = plan_check.check_source = lambda *a, **k: (
                None
            )
        try:
            start = time.perf_counter()
            ds = dataset_module.BlendedGPTDataset.from_mix(checked if verify else bare)
            took = time.perf_counter() - start
            assert len(ds) == samples
            return took
        finally:
            plan_check.check_recorded, plan_check.check_arrays, plan_check.check_source = real

    open_plan(True), open_plan(False)
    with_checks, without = [], []
    for r in range(rounds):
        for verify in (True, False) if r % 2 == 0 else (False, True):
            (with_checks if verify else without).append(open_plan(verify))
    return built, with_checks, without


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--sources", type=int, default=1000, help="sources in the plan of part 3")
    parser.add_argument("--dir", type=Path, default=None, help="where to work (default: a temporary folder)")
    args = parser.parse_args()
    rounds, n, docs = (3, 50, 200) if args.quick else (args.rounds, 500, 2000)
    sources = min(args.sources, 50) if args.quick else args.sources
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
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        samples = 200 * sources
        built, checked, bare = plan_open(Path(tmp), sources, 200, samples, rounds)
        cost = [a - b for a, b in zip(checked, bare, strict=True)]
        print(f"plan of {sources} sources ({samples:,} samples, seq 256; llm-mix built it in {built:.1f} s): "
              f"from_mix with every check median {statistics.median(checked):.3f} s, without "
              f"{statistics.median(bare):.3f} s; the checks cost {statistics.median(cost):.3f} s "
              f"(per round: {', '.join(f'{c:.3f}' for c in cost)}; goal < 1 s)")  # fmt: skip


if __name__ == "__main__":
    main()
