"""llm-log tb throughput and memory: our event writer vs a naive SummaryWriter.add_scalar loop.

Both sides read the same synthetic metrics.jsonl (records shaped like llm-train's: 12 numbers a
record) and write one TensorBoard scalar per number. Each side runs in its own child process so its
peak RSS is its own (ru_maxrss). The naive loop is what one would write by hand:

    for line in f: rec = json.loads(line); for k, v in rec.items(): writer.add_scalar(f"train/{k}", v, step, walltime)

It is slow, so it runs on the first --naive-records records (default 50k) and its records/s is
compared with ours on the same records; ours then also runs on the whole file (default 1M records)
and on a tenth of it, to show that memory stays flat as the log grows.

    python benchmarks/bench_log.py            # 1M records (~2 minutes on 2 cores)
    python benchmarks/bench_log.py --quick    # 50k records, smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def make_log(path: Path, records: int) -> None:
    t = 1_787_000_000.0
    with open(path, "w") as handle:
        for step in range(1, records + 1):
            t += 0.25
            rec = {
                "kind": "train",
                "step": step,
                "time": t,
                "consumed_samples": step * 64,
                "consumed_tokens": step * 64 * 2048,
                "loss": 2.0 + 8.0 * math.exp(-step / 20000) + 0.01 * math.sin(step),
                "grad_norm": 0.5 + 1.0 / math.sqrt(step),
                "lr": 3e-4 * min(1.0, step / 2000),
                "step_time_s": 0.25 + 1e-6 * (step % 97),
                "tokens_per_s": 524288.0 + step % 1000,
                "mfu": 0.41 + 1e-4 * (step % 13),
                "memory_mb": 30512.5,
                "loss_scale": 65536.0,
            }
            handle.write(json.dumps(rec) + "\n")
            if step % 5000 == 0:
                handle.write(
                    json.dumps(
                        {
                            "kind": "eval",
                            "step": step,
                            "time": t,
                            "consumed_tokens": step * 131072,
                            "eval_loss": rec["loss"] + 0.05,
                            "eval_ppl": math.exp(rec["loss"] + 0.05),
                        }
                    )
                    + "\n"
                )


def head(path: Path, records: int, out: Path) -> None:
    with open(path) as src, open(out, "w") as dst:
        for index, line in enumerate(src):
            if index >= records:
                break
            dst.write(line)


def child_ours(log: str, logdir: str) -> dict:
    sys.path.insert(0, str(REPO))
    from llmtools.logs.tb import TbConfig, convert

    start, cpu = time.perf_counter(), time.process_time()
    result = convert([log], TbConfig(Path(logdir), run="ours"))
    return {
        "seconds": time.perf_counter() - start,
        "cpu": time.process_time() - cpu,
        "records": result.counts.lines,
        "scalars": result.runs["ours"]["points"],
    }


def child_naive(log: str, logdir: str) -> dict:
    from torch.utils.tensorboard import SummaryWriter

    start, cpu = time.perf_counter(), time.process_time()
    writer = SummaryWriter(logdir)
    records = scalars = 0
    with open(log) as handle:
        for line in handle:
            rec = json.loads(line)
            step, wall, kind = rec.pop("step"), rec.pop("time"), rec.pop("kind")
            for key, value in rec.items():
                if isinstance(value, (int, float)):
                    writer.add_scalar(f"{kind}/{key}", value, step, walltime=wall)
                    scalars += 1
            records += 1
    writer.close()
    # process_time counts every thread: SummaryWriter's background writer thread included
    return {
        "seconds": time.perf_counter() - start,
        "cpu": time.process_time() - cpu,
        "records": records,
        "scalars": scalars,
    }


def run_child(kind: str, log: Path, logdir: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, str(log), str(logdir)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--naive-records", type=int, default=50_000)
    parser.add_argument("--quick", action="store_true", help="50k records, naive on 5k")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, log, logdir = args.child
        result = child_ours(log, logdir) if kind == "ours" else child_naive(log, logdir)
        result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(result))
        return
    if args.quick:
        args.records, args.naive_records = 50_000, 5_000
    with tempfile.TemporaryDirectory(prefix="bench_log-") as tmp:
        tmp = Path(tmp)
        full = tmp / "metrics.jsonl"
        t = time.perf_counter()
        make_log(full, args.records)
        print(
            f"# made {full.stat().st_size / 2**20:.0f} MiB metrics.jsonl ({args.records:,} train records) in "
            f"{time.perf_counter() - t:.1f}s; python {sys.version.split()[0]}",
            file=sys.stderr,
        )
        small, tenth = tmp / "small.jsonl", tmp / "tenth.jsonl"
        head(full, args.naive_records, small)
        head(full, args.records // 10, tenth)
        # The machine is shared and its load swings: the two writers alternate on the same records,
        # each twice, and the best run of each counts; CPU seconds (all threads) are less load-bound.
        results: dict[str, list[dict]] = {"naive": [], "ours": []}
        for rep in range(2):
            for kind in ("naive", "ours"):
                results[kind].append(run_child(kind, small, tmp / f"tb-{kind}-{rep}"))
        tenth_r = run_child("ours", tenth, tmp / "tb-tenth")
        full_r = run_child("ours", full, tmp / "tb-full")
        naive = min(results["naive"], key=lambda r: r["seconds"])
        same = min(results["ours"], key=lambda r: r["seconds"])
        naive_cpu = min(r["cpu"] for r in results["naive"])
        same_cpu = min(r["cpu"] for r in results["ours"])
        rows = [
            ("SummaryWriter.add_scalar loop", naive, naive_cpu),
            ("llm-log tb (ours)", same, same_cpu),
            ("llm-log tb (ours)", tenth_r, tenth_r["cpu"]),
            ("llm-log tb (ours)", full_r, full_r["cpu"]),
        ]
        print(
            f"{'writer':30} {'lines':>10} {'scalars':>11} {'wall s':>8} {'CPU s':>8} {'records/s':>10} "
            f"{'rec/CPU-s':>10} {'peak RSS MB':>11}"
        )
        for label, r, cpu in rows:
            print(
                f"{label:30} {r['records']:>10,} {r['scalars']:>11,} {r['seconds']:>8.2f} {cpu:>8.2f} "
                f"{r['records'] / r['seconds']:>10,.0f} {r['records'] / cpu:>10,.0f} {r['peak_rss_mb']:>11.0f}"
            )
        wall_x = naive["seconds"] / same["seconds"]
        cpu_x = naive_cpu / same_cpu
        print(
            f"\nspeed-up on the same {naive['records']:,} records: {wall_x:.1f}x wall, {cpu_x:.1f}x CPU (goal >= 5x)"
        )
        print(
            f"ours, {full_r['records']:,} vs {same['records']:,} lines: "
            f"{(full_r['records'] / full_r['cpu']) / (same['records'] / same_cpu):.2f}x records per CPU-second"
        )
        print(
            f"peak RSS ours, {full_r['records']:,} vs {tenth_r['records']:,} lines: {full_r['peak_rss_mb']:.0f} vs "
            f"{tenth_r['peak_rss_mb']:.0f} MB (ratio {full_r['peak_rss_mb'] / tenth_r['peak_rss_mb']:.2f}; flat = 1)"
        )


if __name__ == "__main__":
    main()
