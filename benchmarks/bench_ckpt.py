#!/usr/bin/env python3
"""Checkpoint benchmarks: save time per GB, and ZeRO-3 -> Hugging Face conversion vs DeepSpeed's zero_to_fp32.

1. A child process builds a DeepSpeed ZeRO-3 engine (world size 1, bf16 with fp32 master weights, AdamW)
   around the LLaMA model of a preset with random weights (with ``--adam-step`` it also takes one optimizer
   step so Adam's moments are saved too: ~13 GB of RAM for 0.6B parameters), then saves it twice:
   DeepSpeed's bare ``engine.save_checkpoint`` and ``CheckpointManager.save`` (the same files plus
   fsync, sha256 of every file, meta.json, rename). Reported: seconds, GB written, s/GB, ratio.
2. The checkpoint is converted, each converter in its own child process (peak RSS from ``wait4``):
   DeepSpeed's ``convert_zero_checkpoint_to_fp32_state_dict`` (fp32 ``pytorch_model*.bin``: its safetensors
   mode refuses tied embeddings, e.g. Qwen3-0.6B's) and
   ``llm-ckpt convert --to hf`` (config.json + safetensors shards, fp32), and ``--to safetensors``.
   Converters run one after the other on the same (page-cached) files; with ``--repeat 2`` the order is
   reversed for the second round. Goal: ours peak RSS <= 0.5x zero_to_fp32's, and no slower.

    python benchmarks/bench_ckpt.py                       # qwen3-0.6b (596M parameters), ~6 GB RAM at peak
    python benchmarks/bench_ckpt.py --quick               # the tiny preset: a smoke run in under a minute
    python benchmarks/bench_ckpt.py --preset 125m --repeat 2 --workdir /tmp/bench

3. ``--stall``: the training stall of a save, synchronous vs ``checkpoint.async`` (staged to host memory,
   written, fsynced and hashed by a background thread, committed once written). One child process builds
   the engine (ZeRO-3, bf16 + fp32 master weights, world size 1), trains a few steps, then runs the same
   steps three ways, in interleaved rounds: no saves, a synchronous save every N steps, a background save
   every N steps. Reported per mode: the time the training thread spends inside ``save`` (the stall; for
   background saves: staging), inside the per-step ``poll`` and the final ``wait``, and the total time of
   the steps with their saves, against the run without saves (the overhead of saving every N steps).
   N is chosen so that a background write fits between two saves (the first synchronous save is timed
   for that). ``--optimizer adamw`` saves Adam's moments too (about 20 GB of RAM for Qwen3-0.6B with the
   staging copy); ``sgd`` (no optimizer state) fits a 16 GB machine.

    python benchmarks/bench_ckpt.py --stall --optimizer sgd               # qwen3-0.6b, ~11 GB RAM at peak
    python benchmarks/bench_ckpt.py --stall --quick                       # tiny preset
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


def measure(command: list[str]) -> dict:
    """Run a child; wall seconds and its peak resident set (MB) from wait4's rusage."""
    started = time.perf_counter()
    proc = subprocess.Popen(command, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        sys.stderr.write(out.decode(errors="replace")[-3000:])
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(command)}")
    return {"seconds": wall, "peak_rss_mb": usage.ru_maxrss / 1024, "output": out.decode(errors="replace")}


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


# ------------------------------------------------------------------------------------------ child: build
def build(workdir: Path, preset: str, adam_step: bool) -> None:
    import deepspeed
    import torch
    import torch.distributed as tdist

    from llmtools.ckpt.manager import CheckpointManager
    from llmtools.model import LlamaForCausalLM, load_model_config

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    os.environ.update({"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1"})
    tdist.init_process_group("gloo", store=tdist.HashStore(), rank=0, world_size=1)
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    config = load_model_config(preset)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    ds = {
        "train_batch_size": 1,
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "zero_optimization": {"stage": 3},
        "bf16": {"enabled": True},
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
    del model
    if adam_step:
        tokens = torch.randint(0, config.vocab_size, (1, 9))
        logits = engine(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        engine.backward(loss)
        engine.step()

    raw_dir = workdir / "raw"
    started = time.perf_counter()
    engine.save_checkpoint(str(raw_dir), tag="step_00000001", save_latest=False)
    raw_seconds = time.perf_counter() - started
    raw_bytes = folder_bytes(raw_dir / "step_00000001")
    shutil.rmtree(raw_dir)  # keep the disk (and page cache) for what follows

    manager = CheckpointManager(workdir / "run")
    client = {
        "step": 1,
        "consumed_samples": 1,
        "consumed_tokens": 8,
        "config_hash": None,
        "model": config.to_dict(),
        "tokenizer": None,
        "data_fingerprint": None,
    }
    started = time.perf_counter()
    path = manager.save(engine, 1, client)
    ours_seconds = time.perf_counter() - started
    result = {
        "raw_seconds": raw_seconds,
        "raw_bytes": raw_bytes,
        "ours_seconds": ours_seconds,
        "ours_bytes": folder_bytes(path),
        "checkpoint": str(path),
        "parameters": config.num_parameters(),
    }
    (workdir / "build.json").write_text(json.dumps(result))


# ------------------------------------------------------------------------------------------ child: stall
def stall(workdir: Path, preset: str, optimizer: str, rounds: int) -> None:
    import deepspeed
    import torch
    import torch.distributed as tdist

    from llmtools.ckpt.manager import CheckpointManager
    from llmtools.model import LlamaForCausalLM, load_model_config

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    os.environ.update({"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1"})
    tdist.init_process_group("gloo", store=tdist.HashStore(), rank=0, world_size=1)
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    config = load_model_config(preset)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    opt = {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}
    client_optimizer = None
    if optimizer == "sgd":
        opt, client_optimizer = None, torch.optim.SGD(model.parameters(), lr=1e-4)
    ds = {
        "train_batch_size": 1,
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3},
        "bf16": {"enabled": True},
        "steps_per_print": 10**9,
        **({"optimizer": opt} if opt else {}),
        **({"zero_allow_untested_optimizer": True} if client_optimizer else {}),
    }
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), optimizer=client_optimizer, config=ds
    )
    del model
    generator = torch.Generator().manual_seed(0)

    def train_step() -> None:
        tokens = torch.randint(0, config.vocab_size, (1, 33), generator=generator)
        logits = engine(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        engine.backward(loss)
        engine.step()

    client = {"step": 0, "consumed_samples": 0, "consumed_tokens": 0, "model": config.to_dict()}
    step_seconds = []
    for _ in range(3):  # warm-up; the optimizer state exists from here on
        started = time.perf_counter()
        train_step()
        step_seconds.append(time.perf_counter() - started)
    step_s = min(step_seconds)
    probe = CheckpointManager(workdir / "probe")
    started = time.perf_counter()
    probe.save(engine, 1, client)
    sync_s = time.perf_counter() - started
    saved_bytes = folder_bytes(workdir / "probe" / "checkpoints" / "step_00000001")
    shutil.rmtree(workdir / "probe")
    # Room for a background write between two saves even while it competes with training for the cores.
    every = max(2, int(3 * sync_s / step_s) + 1)
    steps = 2 * every
    results: dict[str, list[dict]] = {"none": [], "sync": [], "async": []}
    for round_ in range(rounds):
        modes = ["none", "sync", "async"] if round_ % 2 == 0 else ["async", "sync", "none"]
        for mode in modes:
            folder = workdir / f"run_{mode}"
            manager = CheckpointManager(folder, keep_last=1, async_save=mode == "async")
            in_save, in_poll = [], 0.0
            began = time.perf_counter()
            for step in range(1, steps + 1):
                train_step()
                if mode != "none" and step % every == 0:
                    started = time.perf_counter()
                    manager.save(engine, step, {**client, "step": step})
                    in_save.append(time.perf_counter() - started)
                elif mode == "async":
                    started = time.perf_counter()
                    manager.poll()
                    in_poll += time.perf_counter() - started
            started = time.perf_counter()
            manager.wait()
            final_wait = time.perf_counter() - started
            results[mode].append(
                {
                    "total": time.perf_counter() - began,
                    "in_save": in_save,
                    "in_poll": in_poll,
                    "final_wait": final_wait,
                }
            )
            shutil.rmtree(folder, ignore_errors=True)
            print(f"round {round_ + 1} {mode}: {results[mode][-1]}", file=sys.stderr, flush=True)
    (workdir / "stall.json").write_text(
        json.dumps(
            {
                "preset": preset,
                "parameters": config.num_parameters(),
                "optimizer": optimizer,
                "step_s": step_s,
                "sync_probe_s": sync_s,
                "bytes": saved_bytes,
                "every": every,
                "steps": steps,
                "results": results,
            }
        )
    )


def report_stall(workdir: Path) -> int:
    info = json.loads((workdir / "stall.json").read_text())
    res = info["results"]
    median = statistics.median
    base = median(r["total"] for r in res["none"])
    sync_stall = median(x for r in res["sync"] for x in r["in_save"])
    async_stall = median(x for r in res["async"] for x in r["in_save"])
    print(
        f"\n## Training stall per save ({info['preset']}: {info['parameters']:,} parameters, ZeRO-3, bf16 + fp32 "
        f"master, {info['optimizer']}; {info['bytes'] / 1e9:.2f} GB per checkpoint; {info['steps']} steps, a save "
        f"every {info['every']}; median of {len(res['none'])} interleaved round(s))\n"
    )
    print(
        "| mode | stall per save (s) | poll per step (ms) | final wait (s) | total (s) | overhead vs no saves |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for mode in ("none", "sync", "async"):
        total = median(r["total"] for r in res[mode])
        saves = [x for r in res[mode] for x in r["in_save"]]
        poll_ms = 1000 * median(r["in_poll"] for r in res[mode]) / max(1, info["steps"])
        print(
            f"| {mode} | {median(saves) if saves else 0:.2f} | {poll_ms:.2f} | "
            f"{median(r['final_wait'] for r in res[mode]):.2f} | {total:.1f} | {100 * (total / base - 1):+.1f}% |"
        )
    ratio = async_stall / sync_stall
    # A run's first background save allocates its staging buffers; the later ones refill them.
    first = median(r["in_save"][0] for r in res["async"])
    later = [x for r in res["async"] for x in r["in_save"][1:]]
    print(
        f"\nstall: background {async_stall:.2f} s vs synchronous {sync_stall:.2f} s = {ratio:.3f}x "
        f"(goal <= 0.1x: {'MET' if ratio <= 0.1 else 'NOT MET'}); a run's first background save "
        f"{first:.2f} s ({first / sync_stall:.3f}x), the later ones "
        + (f"{median(later):.2f} s ({median(later) / sync_stall:.3f}x)" if later else "(none)")
    )
    return 0


# ------------------------------------------------------------------------------------------ parent
def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--preset", default="qwen3-0.6b", help="model preset (>= 500M parameters for the goal)"
    )
    parser.add_argument("--quick", action="store_true", help="the tiny preset: a smoke run")
    parser.add_argument("--repeat", type=int, default=1, help="conversion rounds (order alternates)")
    parser.add_argument("--workdir", default=None, help="where to build (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument(
        "--adam-step", action="store_true", help="one optimizer step first (Adam moments saved)"
    )
    parser.add_argument("--stall", action="store_true", help="async vs synchronous save stall (see above)")
    parser.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw", help="with --stall")
    parser.add_argument("--rounds", type=int, default=2, help="with --stall: interleaved rounds")
    parser.add_argument("--_build", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_stall", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._build:
        build(Path(args._build), args.preset, args.adam_step)
        return 0
    if args._stall:
        stall(Path(args._stall), args.preset, args.optimizer, args.rounds)
        return 0
    preset = "tiny" if args.quick else args.preset
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench_ckpt_"))
    if args.stall:
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            child = [sys.executable, __file__, "--preset", preset, "--optimizer", args.optimizer]
            done = measure([*child, "--rounds", str(args.rounds), "--_stall", str(workdir)])
            print(
                f"(stall child: {done['seconds']:.0f} s, peak RSS {done['peak_rss_mb']:,.0f} MB)",
                file=sys.stderr,
            )
            return report_stall(workdir)
        finally:
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        return run(workdir, preset, args.repeat, args.adam_step)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def run(workdir: Path, preset: str, repeat: int, adam_step: bool) -> int:
    print(f"# bench_ckpt: preset {preset}, work folder {workdir}", file=sys.stderr)
    extra = ["--adam-step"] if adam_step else []
    if (workdir / "build.json").exists():  # --workdir of an earlier --keep run: reuse its checkpoint
        built = {"seconds": float("nan"), "peak_rss_mb": float("nan")}
    else:
        built = measure([sys.executable, __file__, "--preset", preset, "--_build", str(workdir), *extra])
    info = json.loads((workdir / "build.json").read_text())
    checkpoint = Path(info["checkpoint"])
    gb_raw, gb_ours = info["raw_bytes"] / 1e9, info["ours_bytes"] / 1e9

    ds_code = (
        "import sys; from deepspeed.utils.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict as c; "
        "c(sys.argv[1], sys.argv[2], safe_serialization=False, tag=sys.argv[3])"
    )
    converters = {
        "zero_to_fp32": lambda out: [
            sys.executable,
            "-c",
            ds_code,
            str(checkpoint.parent),
            str(out),
            checkpoint.name,
        ],
        "llm-ckpt --to hf": lambda out: [
            sys.executable,
            "-m",
            "llmtools.cli.ckpt",
            "convert",
            str(checkpoint),
            "--to",
            "hf",
            "-o",
            str(out),
        ],
        "llm-ckpt --to safetensors": lambda out: [
            sys.executable,
            "-m",
            "llmtools.cli.ckpt",
            "convert",
            str(checkpoint),
            "--to",
            "safetensors",
            "-o",
            str(out),
        ],
    }
    results: dict[str, list[dict]] = {name: [] for name in converters}
    for round_ in range(repeat):
        order = list(converters) if round_ % 2 == 0 else list(reversed(converters))
        for name in order:
            out = workdir / f"out_{name.replace(' ', '_').replace('-', '')}"
            if name.endswith("safetensors"):
                out = out.with_suffix(".safetensors")
            shutil.rmtree(out, ignore_errors=True) if out.is_dir() else out.unlink(missing_ok=True)
            result = measure(converters[name](out))
            result["bytes"] = folder_bytes(out) if out.is_dir() else out.stat().st_size
            results[name].append(result)
            shutil.rmtree(out, ignore_errors=True) if out.is_dir() else out.unlink(missing_ok=True)

    def best(name: str, key: str) -> float:
        return min(r[key] for r in results[name])

    print(
        f"\n## Checkpoint save ({preset}: {info['parameters']:,} parameters, ZeRO-3, world size 1, bf16 + fp32 master, AdamW{', one step' if adam_step else ', no step'})\n"
    )
    print("| save | seconds | GB written | s/GB | ratio |")
    print("|---|---:|---:|---:|---:|")
    print(
        f"| DeepSpeed save_checkpoint | {info['raw_seconds']:.2f} | {gb_raw:.3f} | "
        f"{info['raw_seconds'] / gb_raw:.2f} | 1.00 |"
    )
    print(
        f"| CheckpointManager.save (+fsync, sha256, meta.json, rename) | {info['ours_seconds']:.2f} | "
        f"{gb_ours:.3f} | {info['ours_seconds'] / gb_ours:.2f} | "
        f"{(info['ours_seconds'] / gb_ours) / (info['raw_seconds'] / gb_raw):.2f} |"
    )
    print(f"\n(build child: {built['seconds']:.1f} s, peak RSS {built['peak_rss_mb']:,.0f} MB)\n")
    print(f"## Conversion of that checkpoint ({gb_ours:.2f} GB on disk), best of {repeat}\n")
    print("| converter | seconds | peak RSS MB | output GB | time vs zero_to_fp32 | RSS vs zero_to_fp32 |")
    print("|---|---:|---:|---:|---:|---:|")
    base_t, base_m = best("zero_to_fp32", "seconds"), best("zero_to_fp32", "peak_rss_mb")
    for name in converters:
        t, m = best(name, "seconds"), best(name, "peak_rss_mb")
        gb = results[name][0]["bytes"] / 1e9
        print(f"| {name} | {t:.2f} | {m:,.0f} | {gb:.3f} | {t / base_t:.2f}x | {m / base_m:.2f}x |")
    ours_t, ours_m = best("llm-ckpt --to hf", "seconds"), best("llm-ckpt --to hf", "peak_rss_mb")
    ok = ours_m <= 0.5 * base_m and ours_t <= base_t * 1.05
    print(
        f"\ngoal (--to hf peak RSS <= 0.5x and no slower than zero_to_fp32): {'MET' if ok else 'NOT MET'} "
        f"(RSS {ours_m / base_m:.2f}x, time {ours_t / base_t:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
