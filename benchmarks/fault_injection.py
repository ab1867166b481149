#!/usr/bin/env python3
"""Fault injection, the long version of tests/ckpt/test_resume_processes.py: kill -9 a training run N times.

Each round starts the test worker (a tiny deterministic DeepSpeed loop, tests/ckpt/worker.py) with
``--resume auto`` and kills it with SIGKILL at a random point: inside a save (while hashing DeepSpeed's
files, after meta.json but before the rename, after the rename but before ``latest``), or after a random
delay (during a step, during or right after a save). After every kill, every committed checkpoint must
verify and ``resolve("auto")`` must pick one that verifies. At the end the run is finished and every
recorded loss and the final weights must equal the uninterrupted run's, bitwise.

    python benchmarks/fault_injection.py                  # 20 kills, 40 steps, ZeRO-2
    python benchmarks/fault_injection.py --quick          # 3 kills
    python benchmarks/fault_injection.py --kills 50 --zero 3 --seed 7
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
WORKER = REPO / "tests" / "ckpt" / "worker.py"


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update({"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"})
    return env


def _losses(path: Path) -> list[tuple[int, float]]:
    if not path.exists():
        return []
    return [(int(s), float(v)) for s, v in (line.split() for line in path.read_text().splitlines())]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--save-every", type=int, default=2)
    parser.add_argument("--zero", type=int, default=2)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="3 kills, 12 steps")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    if args.quick:
        args.kills, args.steps = 3, 12
    seed = args.seed if args.seed is not None else random.randrange(10**6)
    rng = random.Random(seed)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="fault_injection_"))
    import torch

    from llmtools.ckpt import layout
    from llmtools.ckpt.manager import CheckpointManager
    from llmtools.ckpt.verify import verify

    common = ["--zero", str(args.zero), "--steps", str(args.steps), "--dropout", "0.1"]
    started = time.perf_counter()
    reference = work / "reference"
    subprocess.run(
        [sys.executable, str(WORKER), "--run-dir", str(reference), *common],
        env=_env(),
        check=True,
        capture_output=True,
    )
    expected = dict(_losses(reference / "losses.txt"))
    run = work / "run"
    run.mkdir(parents=True, exist_ok=True)
    base = [
        sys.executable,
        str(WORKER),
        "--run-dir",
        str(run),
        *common,
        "--save-every",
        str(args.save_every),
        "--keep-last",
        "3",
        "--resume",
        "auto",
    ]
    kinds: Counter = Counter()
    bad: list[str] = []
    for i in range(args.kills):
        ckpt_dir = run / "checkpoints"
        done_steps = max([s for s, _ in _losses(run / "losses.txt")], default=0)
        future_saves = [s for s in range(done_steps + 1, args.steps + 1) if s % args.save_every == 0]
        kind = rng.choice(["hash", "rename", "latest", "timed", "timed"]) if future_saves else "timed"
        if kind == "timed":
            before = len(_losses(run / "losses.txt"))
            proc = subprocess.Popen(
                [*base, "--step-sleep", "0.05"],
                env=_env(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            while len(_losses(run / "losses.txt")) == before and proc.poll() is None:
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, 0.5))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        else:
            step = rng.choice(future_saves[:3])
            subprocess.run([*base, "--crash-at", f"{step}:{kind}"], env=_env(), capture_output=True)
        kinds[kind] += 1
        for _, folder in layout.list_checkpoints(ckpt_dir):
            report = verify(folder)
            if not report.ok:
                bad.append(f"kill {i} ({kind}): {report.first_problem()}")
        picked = CheckpointManager(run, warn=lambda _m: None).resolve("auto")
        if picked is not None and not verify(picked).ok:
            bad.append(f"kill {i} ({kind}): auto picked {picked}, which does not verify")
        print(
            f"kill {i + 1:>3}/{args.kills}: {kind:<6} -> resume point {picked.name if picked else 'fresh'}",
            file=sys.stderr,
        )
    final = subprocess.run(base, env=_env(), capture_output=True, text=True)
    if final.returncode != 0:
        print(final.stderr[-3000:], file=sys.stderr)
        return 1
    recorded = _losses(run / "losses.txt")
    mismatched = [(s, v) for s, v in recorded if v != expected[s]]
    a, b = torch.load(reference / "final.pt"), torch.load(run / "final.pt")
    weights_equal = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    covered = {s for s, _ in recorded} == set(range(1, args.steps + 1))
    print(
        f"\n## Fault injection (seed {seed}, ZeRO-{args.zero}, {args.steps} steps, save every {args.save_every})\n"
    )
    print(
        "| kills | by kind | loss records | records != reference | all steps covered | final weights bitwise "
        "equal | broken checkpoints after a kill | seconds |"
    )
    print("|---:|---|---:|---:|---|---|---:|---:|")
    print(
        f"| {sum(kinds.values())} | {dict(kinds)} | {len(recorded)} | {len(mismatched)} | {covered} | "
        f"{weights_equal} | {len(bad)} | {time.perf_counter() - started:.0f} |"
    )
    for line in bad:
        print(f"- {line}")
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if (weights_equal and not mismatched and covered and not bad) else 1


if __name__ == "__main__":
    sys.exit(main())
