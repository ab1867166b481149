#!/usr/bin/env python3
"""llm-prep merge: peak memory and time against Megatron-LM's ``tools/merge_datasets.py``, same shards.

* Input: ``--shards`` (2,000) generated uint16 datasets in one folder, ``--mb-per-shard`` (1.5 MB) of
  tokens each (a few GB in all), documents of 1 to 600 tokens (~300 on average, so ~2,500 per shard:
  the index is large enough for its size to matter).
* Rows: ``llm-prep merge`` (a subprocess: start-up included) and Megatron's merge, on the first 200
  shards and on all of them, in interleaved rounds (``--rounds``; medians), peak RSS of each process
  (the kernel's VmHWM) and the ratio. Every output is compared byte for byte with ours.
* Megatron's side: with ``--megatron-script PATH`` Megatron-LM's own ``tools/merge_datasets.py``
  (e.g. ``git show core_v0.16.1:tools/merge_datasets.py > /tmp/meg/merge_datasets.py`` in a
  Megatron-LM clone; it is copied to a temporary folder and run from there, never from this repo),
  which takes ``--input DIR`` (every dataset in DIR, sorted) and imports the installed megatron-core;
  without it, a stand-in that does what that script does with megatron-core's builder (list DIR, sort
  the prefixes, ``IndexedDatasetBuilder(dtype of the first)``, ``add_index`` each, ``finalize``).
  The report says which ran.

    python benchmarks/bench_merge.py --quick                       # 40 small shards, seconds
    python benchmarks/bench_merge.py --megatron-script /tmp/meg/merge_datasets.py
    python benchmarks/bench_merge.py --shards 2000 --mb-per-shard 1.5 --rounds 2 --keep /big/disk/bench

Disk: the shards plus two outputs at a time (about 3x the shards; 9 GB by default). ``df -h`` first.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from bench_json2bin import run_measured, table  # noqa: E402 - the shared subprocess meter

STAND_IN = textwrap.dedent(
    '''
    """What Megatron-LM's tools/merge_datasets.py does, with megatron-core's builder (stand-in)."""
    import os, sys, warnings
    warnings.simplefilter("ignore")
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

    folder, out = sys.argv[1], sys.argv[2]
    prefixes = sorted({os.path.splitext(n)[0] for n in os.listdir(folder) if n.endswith((".bin", ".idx"))})
    dtype = IndexedDataset(os.path.join(folder, prefixes[0])).index.dtype
    builder = IndexedDatasetBuilder(out + ".bin", dtype=dtype)
    for prefix in prefixes:
        builder.add_index(os.path.join(folder, prefix))
    builder.finalize(out + ".idx")
    '''
)


def generate(folder: Path, shards: int, mb_per_shard: float, seed: int = 0) -> dict:
    """``shards`` datasets ``shard-00000`` ... written with our writer (durable=False: a benchmark input)."""
    from llmtools.formats.indexed import IndexedDatasetWriter

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tokens_per_shard = int(mb_per_shard * 1e6 / 2)
    totals = {"tokens": 0, "documents": 0, "bytes": 0}
    started = time.perf_counter()
    for k in range(shards):
        lengths = rng.integers(1, 600, size=tokens_per_shard // 300 + 1)
        lengths = lengths[np.cumsum(lengths) <= tokens_per_shard]
        tokens = rng.integers(0, 50_000, size=int(lengths.sum()), dtype=np.uint16)
        with IndexedDatasetWriter(folder / f"shard-{k:05d}", np.uint16, durable=False) as writer:
            writer.add_documents(tokens, lengths)
        totals["tokens"] += int(lengths.sum())
        totals["documents"] += int(lengths.size)
        totals["bytes"] += 2 * int(lengths.sum())
        if k and k % 200 == 0:
            print(f"  generated {k}/{shards} shards ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    return totals


def subset(folder: Path, target: Path, count: int) -> Path:
    """A folder of symlinks to the first ``count`` shards (Megatron's --input takes a folder)."""
    target.mkdir(parents=True, exist_ok=True)
    for k in range(count):
        for suffix in (".bin", ".idx"):
            os.symlink(folder / f"shard-{k:05d}{suffix}", target / f"shard-{k:05d}{suffix}")
    return target


def digest(prefix: Path) -> str:
    h = hashlib.sha256()
    for suffix in (".bin", ".idx"):
        with open(f"{prefix}{suffix}", "rb") as handle:
            for block in iter(lambda: handle.read(1 << 24), b""):
                h.update(block)
    return h.hexdigest()


def remove(prefix: Path) -> None:
    for suffix in (".bin", ".idx", ".json"):
        Path(f"{prefix}{suffix}").unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="40 shards of 0.2 MB (smoke run)")
    parser.add_argument("--shards", type=int, default=2000)
    parser.add_argument("--small", type=int, default=200, help="the smaller merge (first N shards)")
    parser.add_argument("--mb-per-shard", type=float, default=1.5)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds per size (medians)")
    parser.add_argument(
        "--megatron-script", type=Path, default=None, help="Megatron-LM's tools/merge_datasets.py"
    )
    parser.add_argument("--keep", type=Path, default=None, help="work in this folder and keep the shards")
    parser.add_argument(
        "--skip-megatron",
        action="store_true",
        help="ours only (Megatron's 2,000-shard merge takes ~1 hour here)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    args = parser.parse_args()
    if args.quick:
        args.shards, args.small, args.mb_per_shard, args.rounds = 40, 10, 0.2, 1

    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-merge-"))
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    env.pop("LLMTOOLS_DEBUG", None)
    meg_dir = Path(tempfile.mkdtemp(prefix="megatron-merge-"))  # outside the repo, removed at the end
    try:
        shards = work / "shards"
        if not (shards / f"shard-{args.shards - 1:05d}.idx").exists():
            print(
                f"generating {args.shards} shards of {args.mb_per_shard} MB in {shards} ...", file=sys.stderr
            )
            totals = generate(shards, args.shards, args.mb_per_shard)
        else:
            totals = {
                "bytes": sum((shards / f"shard-{k:05d}.bin").stat().st_size for k in range(args.shards))
            }
        small = work / f"first-{args.small}"
        if not small.exists():
            subset(shards, small, args.small)
        if args.megatron_script is not None:
            (meg_dir / "tools").mkdir()
            shutil.copy(args.megatron_script, meg_dir / "tools" / "merge_datasets.py")
            megatron_what = (
                f"Megatron-LM tools/merge_datasets.py ({args.megatron_script}), megatron-core installed here"
            )

            def megatron_cmd(folder: Path, out: Path) -> list[str]:
                script = str(meg_dir / "tools" / "merge_datasets.py")
                return [sys.executable, script, "--input", str(folder), "--output-prefix", str(out)]
        else:
            (meg_dir / "stand_in.py").write_text(STAND_IN)
            megatron_what = "stand-in: megatron-core's IndexedDatasetBuilder.add_index/finalize as merge_datasets.py calls them"

            def megatron_cmd(folder: Path, out: Path) -> list[str]:
                return [sys.executable, str(meg_dir / "stand_in.py"), str(folder), str(out)]

        rows, results = [], {}
        sizes = [(args.small, small), (args.shards, shards)]
        for count, folder in sizes:
            runs = {"ours": [], "megatron": []}
            hashes = set()
            for _ in range(args.rounds):
                for who in ("ours",) if args.skip_megatron else ("ours", "megatron"):
                    out = work / f"merged-{who}"
                    remove(out)
                    if who == "ours":
                        cmd = [
                            sys.executable,
                            "-m",
                            "llmtools.cli.prep",
                            "merge",
                            f"{folder}/shard-*",
                            "-o",
                            str(out),
                            "-q",
                        ]
                    else:
                        cmd = megatron_cmd(folder, out)
                    result = run_measured(cmd, env, cwd=meg_dir if who == "megatron" else REPO)
                    if result["rc"] != 0:
                        raise SystemExit(f"{who} failed ({result['rc']}): {result['stderr'][-2000:]}")
                    runs[who].append(result)
                    hashes.add(digest(out))
                    remove(out)
            if len(hashes) != 1 and not args.skip_megatron:
                raise SystemExit(f"{count} shards: the outputs differ ({len(hashes)} distinct)")
            ours_s = statistics.median(r["seconds"] for r in runs["ours"])
            ours_m = max(r["maxrss_mb"] for r in runs["ours"])
            if args.skip_megatron:
                runs["megatron"] = [{"seconds": float("nan"), "maxrss_mb": float("nan")}]
            meg_s = statistics.median(r["seconds"] for r in runs["megatron"])
            meg_m = max(r["maxrss_mb"] for r in runs["megatron"])
            mb = totals["bytes"] * count / args.shards / 1e6
            results[count] = {"ours_s": ours_s, "megatron_s": meg_s, "ours_rss_mb": ours_m, "megatron_rss_mb": meg_m,
                              "rounds_ours_s": [r["seconds"] for r in runs["ours"]],
                              "rounds_megatron_s": [r["seconds"] for r in runs["megatron"]], "mb": mb}  # fmt: skip
            rows.append([f"{count} shards ({mb:,.0f} MB)", f"{ours_s:.2f} s, {ours_m:.0f} MB", f"{meg_s:.2f} s, {meg_m:.0f} MB",
                         f"{meg_s / ours_s:.2f}x faster, {ours_m / meg_m:.2f}x memory",
                         "same every round" if args.skip_megatron else "identical"])  # fmt: skip
        print(f"\nllm-prep merge vs {megatron_what}; {args.rounds} round(s) each, medians; peak RSS = VmHWM")
        print(table([["merge", "llm-prep merge", "Megatron", "ratio", "bytes"], *rows]))
        flat = results[args.shards]["ours_rss_mb"] / results[args.small]["ours_rss_mb"]
        print(f"\nours: peak RSS {results[args.small]['ours_rss_mb']:.0f} MB at {args.small} shards, "
              f"{results[args.shards]['ours_rss_mb']:.0f} MB at {args.shards} ({flat:.2f}x for {args.shards // args.small}x the shards)")  # fmt: skip
        if args.json:
            args.json.write_text(json.dumps({"megatron": megatron_what, "results": results}, indent=2))
    finally:
        shutil.rmtree(meg_dir, ignore_errors=True)
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
