#!/usr/bin/env python3
"""Safe loading vs today's loading of a checkpoint's ``.pt`` files (goal: at most 5% slower).

The checkpoint is ``bench_ckpt.py``'s: a Qwen3-0.6B DeepSpeed ZeRO-3 engine (bf16 with fp32 master weights,
AdamW) saved by ``CheckpointManager`` (``--adam-step``: after one step, so Adam's moments are in it too).
Page cache warm (each file is read once first); interleaved rounds, the order flipped every round;
medians reported.

* ``resume reads``  every ``.pt`` of the checkpoint loaded whole, as a resume reads them: today
                    ``torch.load(weights_only=False)`` (DeepSpeed's ``TorchCheckpointEngine.load`` and our
                    RNG file), now :func:`llmtools.ckpt.safeload.load` (``weights_only=True`` with the
                    allowlist);
* ``engine load``   with ``--engine``: ``engine.load_checkpoint`` of that checkpoint into a fresh Qwen3-0.6B
                    ZeRO-3 engine, DeepSpeed's own checkpoint engine vs the one :func:`guard_engine` routes
                    through the safe loader (needs ~3x the checkpoint in memory);
* ``verify``        ``llm-ckpt verify``'s work: sizes, sha256 of every file, shapes, and now the pickle of
                    every ``.pt`` checked against the allowlist (the new part is timed on its own).

    python benchmarks/bench_safeload.py --adam-step            # build (~13 GB RAM at peak), then measure
    python benchmarks/bench_safeload.py --workdir W --keep     # keep (or reuse) the checkpoint in W
    python benchmarks/bench_safeload.py --quick                # the tiny preset: a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("DS_ACCELERATOR", "cpu")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _paired(arms: dict, rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in arms}
    for round_ in range(rounds):
        for name in list(arms) if round_ % 2 == 0 else list(reversed(arms)):
            started = time.perf_counter()
            arms[name]()
            times[name].append(time.perf_counter() - started)
    return times


def resume_reads(checkpoint: Path, rounds: int) -> dict[str, list[float]]:
    import deepspeed  # noqa: F401 - as in a resume: DeepSpeed's classes are importable
    import torch

    from llmtools.ckpt import safeload

    files = sorted(checkpoint.glob("*.pt"))
    for file in files:  # warm the page cache
        with open(file, "rb") as handle:
            while handle.read(1 << 24):
                pass

    def today():
        for file in files:
            torch.load(file, map_location="cpu", weights_only=False)

    def safe():
        for file in files:
            safeload.load(file, map_location="cpu")

    return _paired({"torch.load(weights_only=False)": today, "safeload.load": safe}, rounds)


def verify_parts(checkpoint: Path, rounds: int) -> dict[str, list[float]]:
    from llmtools.ckpt.safeload import check_file
    from llmtools.ckpt.verify import verify

    files = sorted(checkpoint.glob("*.pt"))
    return _paired(
        {
            "verify (all of it)": lambda: verify(checkpoint),
            "of which: pickles against the allowlist": lambda: [check_file(f) for f in files],
        },
        rounds,
    )


def engine_child(checkpoint: Path, preset: str, rounds: int, out: Path) -> None:
    """In its own process: one engine, loaded from the checkpoint ``rounds`` times each way."""
    import deepspeed
    import torch
    import torch.distributed as tdist

    from llmtools.ckpt import safeload
    from llmtools.model import LlamaForCausalLM, load_model_config

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    os.environ.update({"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1"})
    tdist.init_process_group("gloo", store=tdist.HashStore(), rank=0, world_size=1)
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    model = LlamaForCausalLM(load_model_config(preset))
    ds = {
        "train_batch_size": 1,
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "zero_optimization": {"stage": 3},
        "bf16": {"enabled": True},
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
    del model
    original = engine.checkpoint_engine.load

    def load(guarded: bool):
        def run():
            if guarded:
                safeload.guard_engine(engine)
            else:
                engine.checkpoint_engine.load = original
                engine.checkpoint_engine._llmtools_safe = False
            path, _ = engine.load_checkpoint(str(checkpoint.parent), tag=checkpoint.name)
            assert path is not None

        return run

    times = _paired(
        {"DeepSpeed's checkpoint engine": load(False), "guarded (safe loader)": load(True)}, rounds
    )
    out.write_text(json.dumps(times))


def _row(name: str, seconds: list[float], base: float) -> str:
    m = statistics.median(seconds)
    return f"| {name} | {m:.3f} | {min(seconds):.3f} | {m / base:.3f} |"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="qwen3-0.6b")
    parser.add_argument("--quick", action="store_true", help="the tiny preset")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--adam-step", action="store_true", help="one optimizer step before saving")
    parser.add_argument("--engine", action="store_true", help="also time engine.load_checkpoint both ways")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--_engine", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    preset = "tiny" if args.quick else args.preset
    if args._engine:
        checkpoint, out = args._engine.split(",")
        engine_child(Path(checkpoint), preset, args.rounds, Path(out))
        return 0
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench_safeload_"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        if not (workdir / "build.json").exists():
            build = [sys.executable, str(REPO / "benchmarks" / "bench_ckpt.py"), "--preset", preset]
            build += ["--_build", str(workdir)] + (["--adam-step"] if args.adam_step else [])
            subprocess.run(build, env=_env(), check=True)
        info = json.loads((workdir / "build.json").read_text())
        checkpoint = Path(info["checkpoint"])
        size = sum(f.stat().st_size for f in checkpoint.glob("*.pt")) / 1e9
        print(
            f"\n## Safe loading: {preset} ZeRO-3 checkpoint, {size:.2f} GB of .pt files, {args.rounds} rounds\n"
        )
        print("| what | median s | best s | vs today |")
        print("|---|---:|---:|---:|")
        reads = resume_reads(checkpoint, args.rounds)
        base = statistics.median(reads["torch.load(weights_only=False)"])
        for name, seconds in reads.items():
            print(_row(f"resume reads: {name}", seconds, base), flush=True)
        if args.engine:
            out = workdir / "engine.json"
            child = [sys.executable, __file__, "--preset", preset, "--rounds", str(args.rounds)]
            subprocess.run([*child, "--_engine", f"{checkpoint},{out}"], env=_env(), check=True)
            times = json.loads(out.read_text())
            base = statistics.median(times["DeepSpeed's checkpoint engine"])
            for name, seconds in times.items():
                print(_row(f"engine load: {name}", seconds, base), flush=True)
        parts = verify_parts(checkpoint, args.rounds)
        base = statistics.median(parts["verify (all of it)"])
        for name, seconds in parts.items():
            print(_row(name, seconds, base), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
