"""`llm-prep dedup` against datatrove's MinHash pipeline, whole processes side by side on one core.

1. signatures: `llm-prep dedup signatures` (MinHash only, --no-exact, as datatrove computes nothing
   else) vs datatrove's JsonlReader -> MinhashDedupSignature (LocalPipelineExecutor, one task) on the same
   JSONL; documents per second of CPU time, and wall time, peak RSS.
2. clusters: N synthetic duplicate pairs (random documents among 2N, spread over 14 band files), our
   clusters stage vs datatrove's MinhashDedupCluster reading the very same pair files; time and peak RSS.

    python benchmarks/bench_dedup.py                     # both, 20k documents, 10M pairs
    python benchmarks/bench_dedup.py --quick             # a smoke run
    python benchmarks/bench_dedup.py --only clusters --pairs 1000000 --skip-datatrove
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
PREP = [sys.executable, "-m", "llmtools.cli.prep"]


def measure(cmd: list[str], cwd: Path, env: dict | None = None) -> dict:
    """Wall time, CPU time (user + sys) and peak RSS of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{cmd[:4]} failed:\n{err[-2000:]}")
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "rss_mb": round(usage.ru_maxrss / 1024),
    }


def corpus(folder: Path, documents: int) -> int:
    """Real text (LAMBADA, WikiText, TinyShakespeare), repeated with a counter to reach `documents`."""
    texts = []
    for name in ("lambada/lambada_test.jsonl", "wikitext-2/valid.jsonl", "tinyshakespeare/input.jsonl"):
        texts += [json.loads(line)["text"] for line in (SHARED / name).read_text().splitlines()]
    texts = [t for t in texts if len(t.split()) >= 10]
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "00000.jsonl", "w") as handle:
        for i in range(documents):
            handle.write(json.dumps({"id": str(i), "text": f"{texts[i % len(texts)]} {i}"}) + "\n")
    return documents


DATATROVE_SIGNATURES = """
import sys
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.dedup.minhash import MinhashDedupSignature
from datatrove.pipeline.readers import JsonlReader
LocalPipelineExecutor([JsonlReader(sys.argv[1]), MinhashDedupSignature(sys.argv[2])], tasks=1, workers=1,
                      logging_dir=sys.argv[3]).run()
"""

DATATROVE_CLUSTERS = """
import sys
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.dedup.minhash import MinhashDedupCluster
LocalPipelineExecutor([MinhashDedupCluster(sys.argv[1], sys.argv[2])], tasks=1, workers=1, logging_dir=sys.argv[3]).run()
"""


def bench_signatures(tmp: Path, documents: int, skip_datatrove: bool) -> dict:
    data = tmp / "sigdata"
    corpus(data, documents)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", TASKSET="1")
    ours = measure(
        [*PREP, "dedup", "signatures", str(data / "*.jsonl"), "-o", str(tmp / "ours"), "--no-exact", "-q"],
        tmp,
        env,
    )
    row = {"documents": documents, "ours": ours, "ours_docs_per_cpu_s": round(documents / ours["cpu_s"])}
    if not skip_datatrove:
        theirs = measure(
            [sys.executable, "-c", DATATROVE_SIGNATURES, str(data), str(tmp / "dt"), str(tmp / "dtlogs")],
            tmp,
            env,
        )
        row["datatrove"] = theirs
        row["datatrove_docs_per_cpu_s"] = round(documents / theirs["cpu_s"])
        row["speedup_per_core"] = round(theirs["cpu_s"] / ours["cpu_s"], 2)
        for band in range(14):  # the same bytes
            mine = (tmp / "ours" / "work" / "sig" / "000000" / f"band_{band:03d}.sig").read_bytes()
            assert mine == (tmp / "dt" / f"bucket_{band:03d}" / "00000.minhash.sig").read_bytes(), band
        row["same_bytes"] = True
    return row


def synthetic_run(folder: Path, pairs: int, files: int = 20, seed: int = 0) -> None:
    """A run folder as the buckets stage leaves it: a plan, each input's document table, 14 band files of
    pairs (datatrove's .dups layout: the same files feed datatrove's clusters stage)."""
    from llmtools.prep.curate.dedup.config import DedupConfig
    from llmtools.prep.curate.dedup.layout import Plan, sig_dir, write_or_check_plan
    from llmtools.prep.curate.dedup.signatures import DOCS_DTYPE

    rng = np.random.default_rng(seed)
    per_file = max(1, 2 * pairs // files)
    plan = Plan(DedupConfig(exact=False), ["synthetic"], [f"in/{f:05d}.jsonl" for f in range(files)],
                [0] * files, [0] * files)  # fmt: skip
    write_or_check_plan(folder, plan)
    for f in range(files):
        docs = np.zeros(per_file, dtype=DOCS_DTYPE)
        docs["line"] = np.arange(1, per_file + 1)
        docs["nbytes"] = docs["nchars"] = 1000
        sig_dir(folder, f).mkdir(parents=True)
        np.save(sig_dir(folder, f) / "docs.npy", docs)
        (sig_dir(folder, f) / "input.json").write_text('{"input": null, "skipped": {}}\n')
    pairs_dir = folder / "work" / "pairs"
    pairs_dir.mkdir(parents=True)
    dups = folder / "dups"
    dups.mkdir()
    for band in range(14):
        n = pairs // 14 + (band < pairs % 14)
        table = np.empty(n, dtype=[("f1", "<u4"), ("d1", "<u4"), ("f2", "<u4"), ("d2", "<u4")])
        for a, b in (("f1", "d1"), ("f2", "d2")):
            table[a] = rng.integers(0, files, n)
            table[b] = rng.integers(0, per_file, n)
        same = (table["f1"] == table["f2"]) & (table["d1"] == table["d2"])  # no document is its own duplicate
        table["d2"][same] = (table["d2"][same] + 1) % per_file
        data = table.tobytes()
        (pairs_dir / f"band_{band:03d}.pairs").write_bytes(data)
        (dups / f"{band:05d}_00.dups").write_bytes(data)


def bench_clusters(tmp: Path, pairs: int, skip_datatrove: bool) -> dict:
    folder = tmp / "clusters"
    synthetic_run(folder, pairs)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    ours = measure([*PREP, "dedup", "clusters", "-o", str(folder), "-q"], tmp, env)
    row = {"pairs": pairs, "ours": ours}
    if not skip_datatrove:
        theirs = measure([sys.executable, "-c", DATATROVE_CLUSTERS, str(folder / "dups"), str(tmp / "dtremove"),
                          str(tmp / "dtlogs2")], tmp, env)  # fmt: skip
        row["datatrove"] = theirs
        row["speedup"] = round(theirs["wall_s"] / ours["wall_s"], 2)
        row["memory_ratio"] = round(ours["rss_mb"] / theirs["rss_mb"], 2)
        # the same removals: datatrove's .remove files against ours
        for f in range(20):
            theirs_remove = tmp / "dtremove" / f"{f:06d}.remove"
            expected = (
                np.fromfile(theirs_remove, dtype="<u4") if theirs_remove.exists() else np.empty(0, "<u4")
            )
            mine_path = folder / "work" / "remove" / f"{f:06d}.npy"
            mine = np.load(mine_path)["doc"] if mine_path.exists() else np.empty(0, "<u4")
            assert np.array_equal(mine, expected), f
        row["same_removals"] = True
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--documents", type=int, default=20000)
    parser.add_argument("--pairs", type=int, default=10_000_000)
    parser.add_argument("--only", choices=("signatures", "clusters"))
    parser.add_argument("--skip-datatrove", action="store_true")
    parser.add_argument("--quick", action="store_true", help="2,000 documents, 100k pairs")
    args = parser.parse_args()
    if args.quick:
        args.documents, args.pairs = 2000, 100_000
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.only in (None, "signatures"):
            print(
                json.dumps({"signatures": bench_signatures(tmp, args.documents, args.skip_datatrove)}),
                flush=True,
            )
        if args.only in (None, "clusters"):
            print(json.dumps({"clusters": bench_clusters(tmp, args.pairs, args.skip_datatrove)}), flush=True)


if __name__ == "__main__":
    main()
