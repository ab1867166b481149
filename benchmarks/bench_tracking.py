#!/usr/bin/env python3
"""The cost of experiment tracking per training step: the tiny run with ``logging.report_to`` empty, W&B
(offline) and MLflow (local folder store), a metrics record every step (``log_every 1``, the worst case).

Two figures per tracker, the runs interleaved (none, wandb, mlflow, none, ...) because the machine is
shared and noisy:

* direct: the seconds spent inside the tracker's ``log`` per step (timed around the call) over the median
  step time of the run (``step_time_s`` of metrics.jsonl); the steady figure;
* wall: the median wall-clock time between steps against the runs without a tracker of the same round
  (includes everything, noise included).

The one-off costs (importing the library, starting the run, the final summary and picture) are reported
apart: they do not grow with the steps. Goal: direct overhead < 2% per step.

    python benchmarks/bench_tracking.py                 # 3 rounds of 40 steps, ~4 minutes on 2 CPU cores
    python benchmarks/bench_tracking.py --quick         # 1 round of 15 steps
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_DISABLE_GIT", "true")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_train import build_data, train_config  # noqa: E402

TRACKERS = ("none", "wandb", "mlflow")


def run(mix: str, steps: int, tracker: str, run_dir: Path) -> dict:
    from llmtools.logs import trackers
    from llmtools.train.deepspeed_config import load_ds_config
    from llmtools.train.loop import RunOptions, train

    spent = {"log": 0.0, "calls": 0}
    original = trackers.Tracker.log

    def timed(self, record, step):
        started = time.perf_counter()
        original(self, record, step)
        spent["log"] += time.perf_counter() - started
        spent["calls"] += 1

    trackers.Tracker.log = timed
    stamps: list[float] = []
    cfg = train_config(
        mix, steps, 8, 16, logging={"log_every": 1, "report_to": [] if tracker == "none" else [tracker]}
    )
    started = time.perf_counter()
    try:
        train(
            cfg,
            load_ds_config(ROOT / "configs" / "deepspeed" / "zero2.json"),
            RunOptions(
                run_dir=run_dir,
                quiet=True,
                force=True,
                on_step=lambda s, loss: stamps.append(time.perf_counter()),
            ),
        )
    finally:
        trackers.Tracker.log = original
    total = time.perf_counter() - started
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step_times = [r["step_time_s"] for r in records if r["kind"] == "train"][3:]
    gaps = [b - a for a, b in zip(stamps[3:], stamps[4:], strict=False)]
    return {
        "step_s": statistics.median(step_times),
        "gap_s": statistics.median(gaps),
        "log_s_per_step": spent["log"] / max(len(stamps), 1),
        "once_s": total - sum(gaps) - (stamps[3] - started if len(stamps) > 3 else 0.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rounds, steps = (1, 15) if args.quick else (args.rounds, args.steps)
    results: dict[str, list[dict]] = {name: [] for name in TRACKERS}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        mix = build_data(tmp, 64, steps * 16 + 64)
        for r in range(rounds):
            for name in TRACKERS:
                results[name].append(run(mix, steps, name, tmp / f"run_{name}_{r}"))
    print(
        f"tiny preset, ZeRO-2, 1 process, {steps} steps x {rounds} round(s), a record every step (shared machine)"
    )
    print(f"{'tracker':8} {'step ms':>8} {'log ms/step':>12} {'direct':>8} {'wall':>8}")
    for name in TRACKERS:
        step = statistics.median(x["step_s"] for x in results[name])
        log = statistics.median(x["log_s_per_step"] for x in results[name])
        wall = statistics.median(
            x["gap_s"] / base["gap_s"] - 1 for x, base in zip(results[name], results["none"], strict=True)
        )
        print(f"{name:8} {1000 * step:8.1f} {1000 * log:12.3f} {log / step:8.2%} {wall:+8.2%}")
    for name in TRACKERS[1:]:
        once = statistics.median(
            x["once_s"] - base["once_s"] for x, base in zip(results[name], results["none"], strict=True)
        )
        print(f"one-off cost of {name} (start, summary, picture, close): {once:.1f} s")


if __name__ == "__main__":
    main()
