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

Two hosts (``--hosts 2``; root and iproute2 needed): two network namespaces joined by a link, one torchrun
agent each (c10d rendezvous, ``--max-restarts``), ``llm-train --resume auto`` on the tiny preset. An
uninterrupted run first; then the same job, whose workers are killed with SIGKILL N times, each time a
random worker on a random host at a random moment of a random step; torchrun restarts the job and it
resumes from the newest complete checkpoint. Reported: every run ends (no hang), every loss record and the
final weights equal the uninterrupted run's bitwise, and the time lost per failure: steps redone (killed
step - resumed step) and seconds from the kill to the first step after the restart.

    python benchmarks/fault_injection.py --hosts 2 --kills 10            # 10 kills, 60 steps, save every 4
    python benchmarks/fault_injection.py --hosts 2 --quick               # 2 kills, 20 steps
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
    parser.add_argument("--hosts", type=int, default=1, help="2: kill workers of a two-host torchrun job")
    args = parser.parse_args()
    if args.hosts > 1:
        return two_hosts(args)
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


def two_hosts(args) -> int:
    """N kills -9 of random workers of a two-host torchrun job; see the module docstring."""
    from safetensors.torch import load_file

    from tests.multihost import netns
    from tests.multihost.jobs import Job, host_env, last_step, train_records
    from tests.multihost.test_elastic import train_program, write_config

    why = netns.unavailable()
    if why:
        print(f"fault_injection --hosts: {why}", file=sys.stderr)
        return 2
    if args.quick:
        args.kills, args.steps = 2, 20
    elif args.steps == 40:  # the one-host default is too short for 10 restarts
        args.steps = max(60, 6 * args.kills)
    save_every = 4 if args.save_every == 2 else args.save_every
    seed = args.seed if args.seed is not None else random.randrange(10**6)
    rng = random.Random(seed)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="fault_injection_hosts_"))
    work.mkdir(parents=True, exist_ok=True)
    mix = _byte_mix(work / "data")
    config = write_config(work, mix, steps=args.steps, save_every=save_every)

    def convert(run: Path, out: Path) -> dict:
        subprocess.run(
            [sys.executable, "-m", "llmtools.cli.ckpt", "convert", str(run), "--to", "safetensors", "-o", str(out)],
            env=host_env(), check=True, capture_output=True,
        )  # fmt: skip
        return load_file(out)

    started = time.perf_counter()
    with netns.Cluster(args.hosts) as cluster:
        reference = work / "reference"
        job = Job(cluster.hosts, work / "ref_job").start(train_program(config, args.zero, reference))
        codes = job.wait(timeout=1800)
        job.kill()
        if codes != [0] * args.hosts:
            print(job.output(), file=sys.stderr)
            return 1
        run = work / "run"
        job = Job(cluster.hosts, work / "job", max_restarts=args.kills + 1)
        job.start(train_program(config, args.zero, run, "--resume", "auto"))
        kills: list[dict] = []
        hang = False
        for _ in range(args.kills):
            resumed_from = max(
                (r["step"] for r in train_records(run, "event") if r["event"] == "resume"), default=0
            )
            target = min(args.steps - 2, max(last_step(run), resumed_from) + rng.randint(1, 2 * save_every))
            deadline = time.monotonic() + 600
            while last_step(run) < target and time.monotonic() < deadline and job.procs[0].poll() is None:
                time.sleep(0.01)
            if last_step(run) < target:
                hang = job.procs[0].poll() is None
                break
            time.sleep(rng.uniform(0.0, 0.1))  # somewhere inside the next step
            host = rng.choice(cluster.hosts)
            victims = job.workers(host)
            if not victims:
                continue
            victim = rng.choice(victims)
            at_step = last_step(run)
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()
            resumes_before = len(_resumes(run))
            while time.monotonic() < killed_at + 600:  # until the restarted job has done a step
                resumes = _resumes(run)
                if len(resumes) > resumes_before and resumes[-1][1]:
                    break
                time.sleep(0.02)
            else:
                hang = True
                break
            kills.append(
                {
                    "host": host.index,
                    "at_step": at_step,
                    "resumed": resumes[-1][0],
                    "seconds": time.monotonic() - killed_at,
                }
            )
            print(
                f"kill {len(kills):>3}/{args.kills}: host {host.index} at step {at_step} -> resumed at step "
                f"{resumes[-1][0]}, training again after {kills[-1]['seconds']:.1f} s",
                file=sys.stderr,
            )
        codes = job.wait(timeout=1800)
        job.kill()
        hang = hang or None in codes
    expected = {r["step"]: r["loss"] for r in train_records(reference)}
    recorded = train_records(run)
    mismatched = [r for r in recorded if r["loss"] != expected.get(r["step"])]
    finished = codes == [0] * args.hosts and last_step(run) == args.steps
    equal = False
    if finished:
        a, b = convert(reference, work / "a.safetensors"), convert(run, work / "b.safetensors")
        equal = a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)
    redone = [k["at_step"] - k["resumed"] for k in kills]
    seconds = [k["seconds"] for k in kills]
    print(
        f"\n## Fault injection, {args.hosts} hosts (seed {seed}, ZeRO-{args.zero}, {args.steps} steps, "
        f"save every {save_every}, torchrun --max-restarts {args.kills + 1})\n"
    )
    print(
        "| kills | finished, no hang | loss records != reference | final weights bitwise equal | "
        "steps redone per failure (mean, max) | seconds from kill to training again (mean, max) | total s |"
    )
    print("|---:|---|---:|---|---|---|---:|")
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    print(
        f"| {len(kills)} | {finished and not hang} | {len(mismatched)} | {equal} | "
        f"{mean(redone):.1f}, {max(redone, default=0)} | {mean(seconds):.1f}, {max(seconds, default=0):.1f} | "
        f"{time.perf_counter() - started:.0f} |"
    )
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    ok = finished and not hang and equal and not mismatched and len(kills) == args.kills
    return 0 if ok else 1


def _resumes(run: Path) -> list[tuple[int, bool]]:
    """Each (re)start of the run: (the step it resumed from, whether a training step followed it yet)."""
    import json

    out: list[tuple[int, bool]] = []
    path = run / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("kind") == "event" and record.get("event") in ("resume", "start"):  # start: from step 0
            out.append((record["step"], False))
        elif record.get("kind") == "train" and out:
            out[-1] = (out[-1][0], True)
    return out


def _byte_mix(folder: Path) -> str:
    """The tests' byte-level mix of two real corpora (../shared/data), built once in ``folder``."""
    from llmtools.data import mix as mixlib
    from tests.conftest import SHARED_DATA
    from tests.train.conftest import SEQ, write_byte_prefix

    folder.mkdir(parents=True, exist_ok=True)
    a = write_byte_prefix(SHARED_DATA / "tinyshakespeare/input.jsonl", folder / "shakespeare_text_document")
    b = write_byte_prefix(SHARED_DATA / "wikitext-2/valid.jsonl", folder / "wiki_text_document")
    config = mixlib.MixConfig(
        blend=mixlib.Blend([str(a), str(b)], [0.7, 0.3]), seq_length=SEQ, num_samples=6000,
        valid_samples=256, test_samples=0, split="98,2,0",
    )  # fmt: skip
    mixlib.save_plan(mixlib.build_plan(config), folder / "mix.json")
    return str(folder / "mix.json")


if __name__ == "__main__":
    sys.exit(main())
