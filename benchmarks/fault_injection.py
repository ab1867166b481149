#!/usr/bin/env python3
"""Fault injection, the long version of tests/ckpt/test_resume_processes.py: kill -9 a training run N times.

Two subjects (``--command``):

* ``worker`` (the default): the test worker, a tiny deterministic DeepSpeed loop (tests/ckpt/worker.py),
  with its own crash points;
* ``llm-train``: the real command, a tiny LLaMA on a real tokenized dataset, ``--resume auto`` every time.
  Its kill points are injected by the contract tests' start-up hook (tests/contract/hooks/): the process
  is paused right after DeepSpeed saved its files, after the checksums were taken, after meta.json was
  written, after the folder was renamed (before ``latest``), or after ``latest``, and then SIGKILLed;
  or it is SIGKILLed after a random delay once a step has been logged.

Each round starts the subject with ``--resume auto`` and kills it with SIGKILL at a random point: inside a
save, or after a random delay (during a step, during or right after a save). After every kill, every
committed checkpoint must verify and ``resolve("auto")`` must pick one that verifies. At the end the run is
finished and every recorded loss and the final weights must equal the uninterrupted run's, bitwise.

    python benchmarks/fault_injection.py                  # 20 kills, 40 steps, ZeRO-2
    python benchmarks/fault_injection.py --quick          # 3 kills
    python benchmarks/fault_injection.py --kills 50 --zero 3 --seed 7
    python benchmarks/fault_injection.py --command llm-train --kills 50 --seed 1   # the real command
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
    parser.add_argument("--command", choices=("worker", "llm-train"), default="worker")
    args = parser.parse_args()
    if args.quick:
        args.kills, args.steps = 3, 12
    if args.command == "llm-train":
        return train_main(args)
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


# -- the real llm-train ---------------------------------------------------------------------------------
HOOKS = REPO / "tests" / "contract" / "hooks"
BIN = Path(sys.executable).parent
# Where the k-th save of a process is paused and then killed: kind -> (function of llmtools.ckpt.manager,
# its calls per save, which of them, before or after it). A random k in 1..3 lets the run move on.
SAVE_POINTS = {
    "ds-saved": ("atomic_file", 2, 1, ""),  # DeepSpeed's files written, the RNG file not yet
    "hashed": ("file_manifest", 1, 1, ""),  # checksums taken, meta.json not yet written
    "meta": ("atomic_file", 2, 2, ""),  # meta.json being written, the folder not renamed
    "renamed": ("write_text_atomic", 1, 1, "<"),  # renamed to step_N, `latest` not updated
    "latest": ("write_text_atomic", 1, 1, ""),  # `latest` updated, old checkpoints not pruned yet
}
TRAIN_CONFIG = """\
model: {{preset: tiny, hidden_size: 48, intermediate_size: 96, num_hidden_layers: 2, num_attention_heads: 4,
        num_key_value_heads: 2}}
data: {{prefixes: [{prefix}], seq_length: 32}}
training: {{micro_batch_size: 2, global_batch_size: 4, train_steps: {steps}, precision: fp32, seed: 7}}
optimizer: {{lr: 3.0e-3}}
schedule: {{kind: cosine, warmup_steps: 4, total_steps: {steps}}}
eval: {{every: 0}}
logging: {{log_every: 1}}
checkpoint: {{save_every: {save_every}, keep_last: 3}}
"""


def _train_losses(metrics: Path) -> dict[int, float]:
    """step -> loss, the last record of each step (a resumed run logs the steps it redoes again); a torn
    last line (the kill came mid-write) is skipped."""
    import json

    out: dict[int, float] = {}
    if not metrics.exists():
        return out
    for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("kind", "train") == "train" and "loss" in record:
            out[int(record["step"])] = record["loss"]
    return out


def _safetensors(run: Path, out: Path) -> dict:
    from safetensors.torch import load_file

    subprocess.run([str(BIN / "llm-ckpt"), "convert", str(run), "--to", "safetensors", "-o", str(out)],
                   env=_env(), check=True, capture_output=True)  # fmt: skip
    return load_file(str(out))


def train_main(args) -> int:
    import torch

    from llmtools.ckpt import layout
    from llmtools.ckpt.manager import CheckpointManager
    from llmtools.ckpt.verify import verify

    seed = args.seed if args.seed is not None else random.randrange(10**6)
    rng = random.Random(seed)
    steps = args.steps if args.steps != 40 or args.quick else max(40, 4 * args.kills + 20)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="fault_injection_train_"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    corpus = work / "corpus.jsonl"
    corpus.write_text(
        "".join(f'{{"text": "document {i}: {"abc " * (i % 17)}the end"}}\n' for i in range(400))
    )
    subprocess.run([str(BIN / "llm-prep"), "json2bin", str(corpus), "-t", "byte", "-o", str(work / "data"),
                    "--append-eod", "-q"], env=_env(), check=True, capture_output=True)  # fmt: skip
    config = work / "train.yaml"
    config.write_text(
        TRAIN_CONFIG.format(prefix=work / "data_text_document", steps=steps, save_every=args.save_every)
    )
    ds = REPO / "configs" / "deepspeed" / f"zero{args.zero}.json"
    command = [str(BIN / "llm-train"), str(config), "--deepspeed", str(ds)]
    reference = work / "reference"
    done = subprocess.run([*command, "-o", str(reference)], env=_env(), capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
        return 1
    expected = _train_losses(reference / "metrics.jsonl")
    run = work / "run"
    base = [*command, "-o", str(run), "--resume", "auto"]
    kinds: Counter = Counter()
    bad: list[str] = []
    mark = work / "paused"
    for i in range(args.kills):
        done_steps = max(_train_losses(run / "metrics.jsonl"), default=0)
        if done_steps >= steps - 1:
            print(
                f"the run reached step {done_steps} of {steps} after {i} kills: give more --steps",
                file=sys.stderr,
            )
            break
        kind = rng.choice([*SAVE_POINTS, "timed", "timed"])
        env = _env()
        if kind != "timed":
            function, per_save, which, when = SAVE_POINTS[kind]
            call = per_save * (rng.randint(1, 3) - 1) + which
            mark.unlink(missing_ok=True)
            env.update(PYTHONPATH=f"{HOOKS}{os.pathsep}{env['PYTHONPATH']}", LLMTOOLS_TEST_PAUSE_MARK=str(mark),
                       LLMTOOLS_TEST_PAUSE=f"llmtools.ckpt.manager:{function}@{call}{when}")  # fmt: skip
        before = len((run / "metrics.jsonl").read_bytes()) if (run / "metrics.jsonl").exists() else 0
        proc = subprocess.Popen(base, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if kind == "timed":
            while proc.poll() is None and (
                not (run / "metrics.jsonl").exists() or len((run / "metrics.jsonl").read_bytes()) <= before
            ):
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, 2.0))
        else:
            while proc.poll() is None and not mark.exists():
                time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kinds[kind] += 1
        for _, folder in layout.list_checkpoints(run / "checkpoints"):
            report = verify(folder)
            if not report.ok:
                bad.append(f"kill {i} ({kind}): {report.first_problem()}")
        picked = (
            CheckpointManager(run, warn=lambda _m: None).resolve("auto")
            if (run / "checkpoints").exists()
            else None
        )
        if picked is not None and not verify(picked).ok:
            bad.append(f"kill {i} ({kind}): auto picked {picked}, which does not verify")
        print(f"kill {i + 1:>3}/{args.kills}: {kind:<8} -> resume point {picked.name if picked else 'fresh'}",
              file=sys.stderr)  # fmt: skip
    final = subprocess.run(base, env=_env(), capture_output=True, text=True)
    if final.returncode != 0:
        print(final.stderr[-3000:], file=sys.stderr)
        return 1
    recorded = _train_losses(run / "metrics.jsonl")
    mismatched = [s for s in range(1, steps + 1) if recorded.get(s) != expected.get(s)]
    a, b = (
        _safetensors(reference, work / "reference.safetensors"),
        _safetensors(run, work / "run.safetensors"),
    )
    weights_equal = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    print(f"\n## Fault injection through llm-train (seed {seed}, ZeRO-{args.zero}, {steps} steps, "
          f"save every {args.save_every})\n")  # fmt: skip
    print("| kills | by kind | steps compared | losses != reference | final weights bitwise equal | "
          "broken checkpoints after a kill | seconds |")  # fmt: skip
    print("|---:|---|---:|---:|---|---:|---:|")
    print(f"| {sum(kinds.values())} | {dict(kinds)} | {steps} | {len(mismatched)} | {weights_equal} | {len(bad)} | "
          f"{time.perf_counter() - started:.0f} |")  # fmt: skip
    for line in bad:
        print(f"- {line}")
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if (weights_equal and not mismatched and not bad) else 1


if __name__ == "__main__":
    sys.exit(main())
