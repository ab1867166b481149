#!/usr/bin/env python3
"""llm-mix speed, side by side with megatron-core's compiled helpers in one run.

1. The greedy blend (build_blending_indices) for 2 x 10M and 3 x 10M samples: ours (ctypes C, built by
   pip or on first use), Megatron's helpers_cpp, and our pure-Python fallback (on fewer samples,
   scaled). Every timing includes allocating the output arrays; best of --repeat runs.
2. The GPT indices of a 1B-token source at seq_length 2048 (document, sample and shuffle index):
   ours vs the same three steps with Megatron's functions; and the sample index alone (ours in C, ours
   vectorised numpy, Megatron's C++).
3. Random-access sample reads per second at seq_length 2048 from a warm page cache, one core:
   ``ds[i]`` (zero-copy view when a sample lies in one document) and ``ds.batch`` (int64 copies).
4. The continuation blend of a mix changed in flight: 10M remaining samples over 3 and over 1,000
   sources, every source continuing its stream at a cursor (llmtools.data.stages.build: the greedy with
   offsets, the (source, segment) mapping, the per-source checks), against a fresh blend of the same
   size (build_blending_indices, what a static plan costs). Paired rounds, alternating order; the best
   of each and the median of the per-round ratios. 1,000 sources take ~1 min a blend (the greedy is
   O(samples x sources), Megatron's too), so they get a third of the rounds.
5. A blend over many sources (``--sources``, default 1,000, in 4 folders): ``llm-mix 'DIR/*/*'`` end to
   end (a subprocess: start-up, opening and hashing every source, every index, mix.json and the
   thousands of cache files made durable), and how many lines ``--explain`` prints.

Usage: python benchmarks/bench_mix.py [--quick] [--repeat N] [--sources N] [--continue-sources 3,1000]
                                      [--only blend,gpt,reads,continue,sources]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from llmtools import _native  # noqa: E402
from llmtools.data import blend, gpt_index  # noqa: E402
from llmtools.data.dataset import BlendedGPTDataset  # noqa: E402
from llmtools.formats.indexed import IndexedDatasetWriter  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
        from megatron.core.datasets import helpers as megatron_helpers
        from megatron.core.datasets.gpt_dataset import _build_document_index, _build_shuffle_index
    except Exception as error:  # noqa: BLE001 - the benchmark still reports our own numbers
        megatron_helpers = None
        print(f"(megatron-core unavailable: {error})", file=sys.stderr)


def best(fn, repeat):
    times = []
    out = None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


def duel(fa, fb, repeat):
    """Best times of fa and fb, run alternately so that a change in machine load hits both alike.

    One untimed run of each first: the allocator then has memory at hand for both alike.
    """
    fa(), fb()
    ta, tb, a, b = [], [], None, None
    for _ in range(repeat):
        start = time.perf_counter()
        a = fa()
        ta.append(time.perf_counter() - start)
        start = time.perf_counter()
        b = fb()
        tb.append(time.perf_counter() - start)
    return min(ta), min(tb), a, b


def paired(fa, fb, rounds):
    """Times of fa and fb over ``rounds`` paired rounds, the order alternating from round to round (so a
    load change or the allocator's state favours neither)."""
    fa(), fb()
    ta, tb = [], []
    for r in range(rounds):
        for f, times in ((fa, ta), (fb, tb)) if r % 2 == 0 else ((fb, tb), (fa, ta)):
            start = time.perf_counter()
            f()
            times.append(time.perf_counter() - start)
    return ta, tb


def megatron_blend(weights, size):
    di = np.zeros(size, dtype=np.int16)
    dsi = np.zeros(size, dtype=np.int64)
    megatron_helpers.build_blending_indices(
        di, dsi, np.asarray(weights, dtype=np.float64), len(weights), size, False
    )
    return di, dsi


def python_blend(weights, size):
    di = np.empty(size, dtype=np.int16)
    dsi = np.empty(size, dtype=np.int64)
    blend._blend_python(list(weights), size, di, dsi)
    return di, dsi


def row(*cells):
    print(" | ".join(str(c) for c in cells))


def bench_blend(size, repeat):
    print(f"\n## blend: build_blending_indices, {size:,} samples (best of {repeat})\n")
    row(
        "sources",
        "llmtools (C) s",
        "megatron helper s",
        "ratio megatron/ours",
        "python fallback s (est.)",
        "identical",
    )
    row("---", "---", "---", "---", "---", "---")
    small = max(1, size // 50)
    for weights in ([0.7, 0.3], [0.5, 0.3, 0.2]):
        w = blend.blend_weights(weights)
        if megatron_helpers is not None:
            ours_t, theirs_t, ours, theirs = duel(
                lambda w=w: blend.build_blending_indices(w, size), lambda w=w: megatron_blend(w, size), repeat
            )
            same = bool(np.array_equal(ours[0], theirs[0]) and np.array_equal(ours[1], theirs[1]))
            ratio = f"{theirs_t / ours_t:.2f}x"
        else:
            ours_t, _ = best(lambda w=w: blend.build_blending_indices(w, size), repeat)
            theirs_t, same, ratio = float("nan"), "n/a", "n/a"
        py_t, _ = best(lambda w=w: python_blend(w, small), 1)
        row(
            f"{len(weights)} x {size:,}",
            f"{ours_t:.3f}",
            f"{theirs_t:.3f}",
            ratio,
            f"{py_t * size / small:.1f}",
            same,
        )


def bench_gpt(tokens, seq, repeat):
    rng = np.random.RandomState(0)
    mean = 1000
    n_docs = tokens // mean
    lengths = rng.randint(1, 2 * mean, size=n_docs).astype(np.int32)
    tpe = int(lengths.sum(dtype=np.int64))
    num_samples = (tpe - 1) // seq
    print(
        f"\n## GPT indices: {tpe:,} tokens in {n_docs:,} documents, seq_length {seq}, {num_samples:,} samples (best of {repeat})\n"
    )
    row("step", "llmtools s", "megatron s", "ratio megatron/ours", "identical")
    row("---", "---", "---", "---", "---")

    def ours_all():
        return gpt_index.build_gpt_indices(lengths, (0, n_docs), num_samples, seq, 1234)

    if megatron_helpers is not None:

        def megatron_all():
            r = np.random.RandomState(1234)
            doc = _build_document_index(np.arange(0, n_docs, dtype=np.int32), 1, r, False)
            sample = megatron_helpers.build_sample_idx(lengths, doc, seq, 1, tpe, True, True)
            shuffle = _build_shuffle_index(sample.shape[0] - 1, sample.shape[0] - 1, r)
            return doc, sample, shuffle

        ours_t, theirs_t, ours, theirs = duel(ours_all, megatron_all, repeat)
        same = all(
            np.array_equal(a, b)
            for a, b in zip((ours.document_index, ours.sample_index, ours.shuffle_index), theirs, strict=True)
        )
        row(
            "document + sample + shuffle index",
            f"{ours_t:.3f}",
            f"{theirs_t:.3f}",
            f"{theirs_t / ours_t:.2f}x",
            same,
        )
        doc = ours.document_index
        c_t, c_out = best(lambda: gpt_index.build_sample_index(lengths, doc, seq, 1, tpe), repeat)
        np_t, np_out = best(lambda: gpt_index.sample_index_numpy(lengths, doc, seq, num_samples), repeat)
        m_t, m_out = best(
            lambda: megatron_helpers.build_sample_idx(lengths, doc, seq, 1, tpe, True, True), repeat
        )
        row(
            "sample index only (C)",
            f"{c_t:.3f}",
            f"{m_t:.3f}",
            f"{m_t / c_t:.2f}x",
            bool(np.array_equal(c_out, m_out)),
        )
        row(
            "sample index only (numpy fallback)",
            f"{np_t:.3f}",
            f"{m_t:.3f}",
            f"{m_t / np_t:.2f}x",
            bool(np.array_equal(np_out, m_out)),
        )
    else:
        ours_t, _ = best(ours_all, repeat)
        row("document + sample + shuffle index", f"{ours_t:.3f}", "n/a", "n/a", "n/a")


def bench_reads(tokens, seq, reads, folder):
    rng = np.random.RandomState(1)
    print(
        f"\n## random-access reads: seq_length {seq}, {reads:,} random samples, warm page cache, one core\n"
    )
    row("documents", "access", "samples/s", "tokens/s", "share of samples in one document")
    row("---", "---", "---", "---", "---")
    for label, mean in (("mean 1,000 tokens", 1000), ("mean 20,000 tokens", 20000)):
        prefix = Path(folder) / f"src{mean}"
        lengths = rng.randint(1, 2 * mean, size=max(1, tokens // mean)).astype(np.int64)
        with IndexedDatasetWriter(prefix, np.uint16, durable=False) as writer:
            step = 1 << 16
            for lo in range(0, lengths.size, step):
                part = lengths[lo : lo + step]
                writer.add_documents(rng.randint(0, 50000, size=int(part.sum()), dtype=np.uint16), part)
        num = (int(lengths.sum()) - 1) // seq
        ds = BlendedGPTDataset.from_prefixes([str(prefix)], None, seq, num, split="100,0,0")
        ds.batch(np.arange(len(ds)))  # warm the page cache
        idx = rng.randint(0, len(ds), size=reads)
        single = sum(len(ds.runs(int(i))[1]) == 1 for i in idx[:2000]) / min(reads, 2000)
        start = time.perf_counter()
        for i in idx.tolist():
            ds[i]
        ours_t = time.perf_counter() - start
        row(
            label,
            "llmtools ds[i]",
            f"{reads / ours_t:,.0f}",
            f"{reads * (seq + 1) / ours_t:,.0f}",
            f"{single:.0%}",
        )
        start = time.perf_counter()
        for lo in range(0, reads, 64):
            ds.batch(idx[lo : lo + 64])
        t = time.perf_counter() - start
        row(
            label,
            "llmtools ds.batch(64) -> int64",
            f"{reads / t:,.0f}",
            f"{reads * (seq + 1) / t:,.0f}",
            f"{single:.0%}",
        )
        megatron = megatron_gpt_dataset(str(prefix), seq, num, folder)
        if megatron is not None:
            query = megatron._query_document_sample_shuffle_indices
            for i in idx[:100].tolist():  # same samples, same tokens
                if not np.array_equal(query(i)[0], ds[i]):
                    raise SystemExit(f"sample {i} differs from Megatron's")
            start = time.perf_counter()
            for i in idx.tolist():
                query(i)
            t = time.perf_counter() - start
            row(
                label,
                "megatron GPTDataset tokens (no torch)",
                f"{reads / t:,.0f}",
                f"{reads * (seq + 1) / t:,.0f}",
                f"ours ds[i] {t / ours_t:.2f}x faster",
            )


def bench_continue(size, source_counts, repeat, folder):
    """A stage taken up at cursors (a mix changed in flight) vs a fresh blend of the same size.

    Every source is a stream over one shared token file (its segment 0 built once, before timing, as a
    run has it from the plan's cache); the cursors are what an earlier stage of ``size`` samples with
    other weights left. Timed: the whole stage build (greedy with offsets, parts, per-source checks)."""
    from llmtools.data.stages import Stage, build
    from llmtools.data.streams import SourceStream, StreamSpec

    seq = 2  # short samples keep the shared source small: each source may draw up to ~size samples
    tokens = int(2.2 * size * seq)
    rng = np.random.RandomState(3)
    lengths = rng.randint(1, 2000, size=tokens // 1000).astype(np.int64)
    prefix = Path(folder) / "continue-src"
    with IndexedDatasetWriter(prefix, np.uint16, durable=False) as writer:
        writer.add_documents(rng.randint(0, 50000, size=int(lengths.sum()), dtype=np.uint16), lengths)
    from llmtools.formats.indexed import IndexedDatasetReader

    reader = IndexedDatasetReader(prefix)
    tpe = int(lengths.sum())
    first = gpt_index.build_gpt_indices(reader.sequence_lengths, (0, lengths.size), None, seq, 1234)
    print(
        f"\n## continuation blend: {size:,} remaining samples, sources at their cursors ({repeat} paired rounds, "
        "3 for 1,000 sources)\n"
    )
    row("sources", "fresh blend s (best)", "continuation s (best)", "ratio of bests", "median of paired ratios",
        "same choices")  # fmt: skip
    row("---", "---", "---", "---", "---", "---")
    for n in source_counts:
        old = np.array([0.5, 0.3, 0.2]) if n == 3 else rng.dirichlet(np.ones(n))
        new = np.array([0.2, 0.3, 0.5]) if n == 3 else rng.dirichlet(np.ones(n))
        streams = {}
        for i in range(n):
            spec = StreamSpec(f"{i:064x}", str(prefix), f"s{i}", (0, lengths.size), seq, 1234, None, tpe)
            streams[spec.key] = SourceStream.open(spec, reader, first)
        keys = list(streams)
        cursors = np.bincount(
            blend.build_blending_indices(blend.blend_weights(old.tolist()), size)[0], minlength=n
        )
        w = blend.blend_weights(blend.normalize_weights(new.tolist()))
        stage = Stage(size, 2 * size, keys, w, new.tolist(), dict(zip(keys, cursors.tolist(), strict=True)))
        need = int(cursors.max()) + size
        if first.num_samples < need:
            raise SystemExit(f"the shared source holds {first.num_samples} samples, {need} needed")

        def fresh(w=w):
            return blend.build_blending_indices(w, size)

        def continued(streams=streams, stage=stage):
            return build(streams, [stage], size)

        rounds = repeat if n < 1000 else max(3, repeat // 3)  # a 1,000-source blend takes about a minute
        fresh_times, cont_times = paired(fresh, continued, rounds)
        plain, built = fresh(), continued()
        same = bool(np.array_equal(plain[0], built.dataset_index)) and bool(
            np.array_equal(plain[1] + cursors[plain[0]], built.dataset_sample_index)
        )
        ratios = sorted(c / f for f, c in zip(fresh_times, cont_times, strict=True))
        row(
            f"{n:,} x {size:,}",
            f"{min(fresh_times):.3f}",
            f"{min(cont_times):.3f}",
            f"{min(cont_times) / min(fresh_times):.2f}x",
            f"{ratios[len(ratios) // 2]:.2f}x",
            same,
        )


def megatron_gpt_dataset(prefix, seq, num, folder):
    """Megatron's own GPTDataset over the same prefix and sample count (indices cached in folder)."""
    if megatron_helpers is None:
        return None
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    class Tok:
        vocab_size, eod, pad, special_tokens_dict, unique_identifiers = 50000, 0, -1, {}, {"name": "bench"}

    config = GPTDatasetConfig(
        random_seed=1234,
        sequence_length=seq,
        blend=([prefix], None),
        split="100,0,0",
        tokenizer=Tok(),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        path_to_cache=str(Path(folder) / "megatron-cache"),
    )
    import logging

    logging.getLogger("megatron").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return BlendedMegatronDatasetBuilder(GPTDataset, [num, 0, 0], lambda: True, config).build()[0]


def bench_sources(count: int, folder: str) -> None:
    """``llm-mix`` over ``count`` generated sources (200 documents of 50-2,000 tokens each)."""
    import subprocess

    root = Path(folder) / "sources"
    rng = np.random.default_rng(0)
    for k in range(count):
        lengths = rng.integers(50, 2000, 200)
        with IndexedDatasetWriter(
            root / ("web", "code", "books", "wiki")[k % 4] / f"s{k:05d}", np.uint16, durable=False
        ) as w:
            w.add_documents(rng.integers(0, 50_000, int(lengths.sum())), lengths)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    args = [sys.executable, "-m", "llmtools.cli.mix", f"{root}/*/*", "--seq-length", "1024"]
    args += ["--num-samples", "1M", "--valid-samples", "10000"]
    started = time.perf_counter()
    out = subprocess.run([*args, "-o", f"{folder}/out/mix.json"], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if out.returncode != 0:
        raise SystemExit(out.stderr)
    files = len(out.stdout.splitlines())
    explained = subprocess.run([*args, "--explain"], env=env, capture_output=True, text=True)
    print(f"\n## a blend over {count:,} sources (llm-mix end to end, 1M + 10k samples, seq 1024)")
    row("sources", "seconds", "files written", "--explain lines")
    row(f"{count:,}", f"{seconds:.2f}", f"{files:,}", f"{len(explained.stdout.splitlines())}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run in seconds")
    parser.add_argument("--repeat", type=int, default=None, help="repeats per timing (best is reported)")
    parser.add_argument(
        "--only",
        default="blend,gpt,reads,continue,sources",
        help="comma-separated parts: blend, gpt, reads, continue, sources",
    )
    parser.add_argument("--sources", type=int, default=None, help="sources of the many-source blend (1000)")
    parser.add_argument(
        "--continue-sources", default=None, help="source counts of the continuation part (default 3,1000)"
    )
    args = parser.parse_args()
    only = {part.strip() for part in args.only.split(",")}
    repeat = args.repeat or (2 if args.quick else 5)
    lib = _native.load()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    print(
        f"# bench_mix ({'quick' if args.quick else 'full'}); native library: {getattr(lib, '_name', None)}; "
        f"{os.cpu_count()} CPUs, load average {load} (compare ratios, not absolute times, on a busy machine)"
    )
    if "blend" in only:
        bench_blend(1_000_000 if args.quick else 10_000_000, repeat)
    if "gpt" in only:
        bench_gpt(50_000_000 if args.quick else 1_000_000_000, 2048, repeat)
    with tempfile.TemporaryDirectory(prefix="bench_mix-") as folder:
        if "reads" in only:
            bench_reads(
                20_000_000 if args.quick else 100_000_000, 2048, 20_000 if args.quick else 100_000, folder
            )
        if "continue" in only:
            size = 1_000_000 if args.quick else 10_000_000
            counts = (3, 100) if args.quick else (3, 1000)
            if args.continue_sources:
                counts = tuple(int(n) for n in args.continue_sources.split(","))
            bench_continue(size, counts, args.repeat or (3 if args.quick else 9), folder)
    if "sources" in only:
        with tempfile.TemporaryDirectory(prefix="bench_mix-") as folder:
            bench_sources(args.sources or (100 if args.quick else 1000), folder)


if __name__ == "__main__":
    main()
