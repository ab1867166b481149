#!/usr/bin/env python3
"""Preference training (``task: dpo``): step time against SFT on the same tokens, and memory with the reference
log-probs precomputed (llm-train) against a live reference model (what DPO trainers keep by default).

Speed, in one process, interleaved rounds (SFT, SFT x2, DPO, SFT, ...), median step time after warm-up in
CPU seconds of the one-thread process (wall time is shown too; a busy shared machine moves it most),
all through llm-train's real loop (``llmtools.train.loop.train``, ZeRO-2, one rank, fp32):

* ``sft``     task sft on the chosen sequences of the pairs (``PREFIX_chosen`` is an llm-prep sft prefix),
              B sequences per micro-batch;
* ``dpo``     task dpo on the same pairs, B pairs per micro-batch = 2B sequences (chosen + rejected);
* ``sft x2``  task sft with 2B sequences per micro-batch: exactly the tokens of a DPO step.

The goal is dpo / sft <= 2.2x (twice the tokens, nothing for the reference at train time); dpo / sft x2 is
the per-token overhead of the preference loss. Every sequence has the same length (fixed-length random
text, byte tokenizer), so no variant pads more than another. The one-time reference pass is timed too,
against one epoch of DPO training.

Memory, each variant in a fresh process (peak resident set grown during ``train()`` on CPU,
``torch.cuda.max_memory_allocated`` on CUDA), a wider model so that weights dominate:

* ``precomputed``  task dpo as shipped: one reference pass, then no second model;
* ``live``         the same task with a frozen copy of the starting model kept for the whole run and run
                   on every micro-batch (registered here as a task ``dpo-live``: the task table is open).

    python benchmarks/bench_dpo.py              # ~5-8 minutes on 2 busy CPU cores
    python benchmarks/bench_dpo.py --quick      # smoke run (~2 minutes)
    python benchmarks/bench_dpo.py --rounds 5 --skip-memory
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.peak_memory import PeakMemory, run_worker  # noqa: E402

CHATML_OVERHEAD = len("<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n")


def build_pairs(folder: Path, seq: int, pairs: int) -> str:
    """``pairs`` preference pairs whose chosen and rejected sequences all have exactly ``seq + 1`` byte tokens."""
    from llmtools.prep.pref import PrefConfig, build_pref

    rng = random.Random(0)
    prompt_len = (seq + 1 - CHATML_OVERHEAD) // 3
    answer_len = seq + 1 - CHATML_OVERHEAD - prompt_len
    text = lambda n: "".join(rng.choice("abcdefghij klmnop") for _ in range(n))  # noqa: E731
    lines = [
        json.dumps({"prompt": text(prompt_len), "chosen": text(answer_len), "rejected": text(answer_len)})
        for _ in range(pairs)
    ]
    (folder / "pairs.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    prefix = str(folder / "pairs")
    build_pref(PrefConfig(inputs=[str(folder / "pairs.jsonl")], tokenizer="byte", output_prefix=prefix,
                          chat_template="chatml", force=True))  # fmt: skip
    return prefix


def model_section(args) -> dict:
    return {
        "preset": "tiny",
        "vocab_size": 320,
        "hidden_size": args.hidden,
        "intermediate_size": args.hidden * 8 // 3 // 64 * 64,
        "num_hidden_layers": args.layers,
        "num_attention_heads": max(1, args.hidden // 64),
        "num_key_value_heads": max(1, args.hidden // 64),
        "max_position_embeddings": max(512, args.seq),
    }


def config(args, task: str, prefix: str, micro: int, steps: int):
    from llmtools.train.config import from_dict

    data_prefix = f"{prefix}_chosen" if task == "sft" else prefix
    return from_dict(
        {
            "task": task,
            "model": model_section(args),
            "data": {"prefixes": [data_prefix], "seq_length": args.seq},
            "training": {
                "micro_batch_size": micro,
                "global_batch_size": micro * args.accumulation,
                "train_steps": steps,
            },  # fmt: skip
            "optimizer": {"lr": 1e-4, "weight_decay": 0.0},
            "schedule": {"kind": "constant", "warmup_steps": 0},
            "logging": {"log_every": 1000},
            "checkpoint": {"save_every": 0, "save_final": False},
        },
        f"bench-{task}",
    )


def timed_run(cfg, run_dir: Path) -> tuple[list[float], list[float], float]:
    """(step CPU times, step wall times, wall seconds from the call to the end of the first step) of one
    llm-train run. CPU seconds of this one-thread process are what a busy shared machine disturbs least."""
    from llmtools.train.deepspeed_config import load_ds_config
    from llmtools.train.loop import RunOptions, train

    stamps: list[tuple[float, float]] = []
    start = time.perf_counter()
    train(cfg, load_ds_config(ROOT / "configs/deepspeed/zero2.json"),
          RunOptions(run_dir=run_dir, quiet=True, force=True,
                     on_step=lambda s, loss: stamps.append((time.process_time(), time.perf_counter()))))  # fmt: skip
    cpu = [b[0] - a[0] for a, b in zip(stamps, stamps[1:], strict=False)]
    wall = [b[1] - a[1] for a, b in zip(stamps, stamps[1:], strict=False)]
    return cpu, wall, stamps[0][1] - start


def reference_pass_seconds(args, prefix: str) -> tuple[float, int]:
    """Wall time of the reference pass alone over every pair (the model as the run builds it)."""
    import torch

    from llmtools.model import LlamaForCausalLM
    from llmtools.train.plan import resolve_model_config
    from llmtools.train.tasks.base import RunContext
    from llmtools.train.tasks.dpo import PrefTrainData
    from llmtools.train.tasks.reference import compute_reference_logps

    cfg = config(args, "dpo", prefix, args.micro, 1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(resolve_model_config(cfg))
    data = PrefTrainData(prefix, args.seq, 1)
    run = RunContext(Path("."), 0, 1, "cpu", args.micro, lambda _: None)
    start = time.process_time()
    compute_reference_logps(model, data, run, lora=False)
    return time.process_time() - start, data.pairs


def speed(args) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-dpo-") as tmp:
        folder = Path(tmp)
        prefix = build_pairs(folder, args.seq, args.pairs)
        variants = {
            "sft": ("sft", args.micro),
            "sft x2": ("sft", 2 * args.micro),
            "dpo": ("dpo", args.micro),
        }
        times: dict[str, list[float]] = {name: [] for name in variants}
        walls: dict[str, list[float]] = {name: [] for name in variants}
        for r in range(args.rounds):
            for name, (task, micro) in variants.items():
                cpu, wall, _ = timed_run(
                    config(args, task, prefix, micro, args.steps), folder / f"run-{task}-{micro}"
                )
                times[name].append(statistics.median(cpu[args.warmup :]))
                walls[name].append(statistics.median(wall[args.warmup :]))
            line = ", ".join(f"{n} {times[n][-1] * 1000:.0f} ms" for n in variants)
            print(
                f"  round {r + 1}: {line}  (dpo/sft {times['dpo'][-1] / times['sft'][-1]:.2f}x)",
                file=sys.stderr,
            )
        ref_s, pairs = reference_pass_seconds(args, prefix)
    seqs = {"sft": args.micro, "sft x2": 2 * args.micro, "dpo": 2 * args.micro}
    print(f"\n## step time: {args.layers} layers, d={args.hidden}, seq {args.seq}, micro-batch {args.micro} "
          f"(pairs or sequences) x {args.accumulation} accumulation, ZeRO-2, 1 rank, fp32, "
          f"{args.rounds} interleaved rounds x {args.steps} steps (median after {args.warmup})")  # fmt: skip
    print(
        f"{'variant':<8} {'seqs/micro':>10} {'tokens/step':>11} {'CPU ms':>8} {'wall ms':>8}  CPU ms per round"
    )
    for name in variants:
        tokens = seqs[name] * args.accumulation * args.seq
        rounds = ", ".join(f"{t * 1000:.0f}" for t in times[name])
        print(f"{name:<8} {seqs[name]:>10} {tokens:>11,} {statistics.median(times[name]) * 1000:>8.0f} "
              f"{statistics.median(walls[name]) * 1000:>8.0f}  {rounds}")  # fmt: skip
    paired = [d / s for d, s in zip(times["dpo"], times["sft"], strict=True)]
    per_token = [d / s for d, s in zip(times["dpo"], times["sft x2"], strict=True)]
    print(f"dpo / sft (same pairs, twice the tokens): median {statistics.median(paired):.2f}x "
          f"(rounds: {', '.join(f'{x:.2f}' for x in paired)}; goal <= 2.2x)")  # fmt: skip
    print(f"dpo / sft x2 (the same tokens): median {statistics.median(per_token):.2f}x "
          f"(rounds: {', '.join(f'{x:.2f}' for x in per_token)})")  # fmt: skip
    dpo_epoch = statistics.median(times["dpo"]) * pairs / (args.micro * args.accumulation)
    print(f"reference pass, once before training: {ref_s:.2f} CPU s for {pairs} pairs "
          f"= {ref_s / dpo_epoch:.2f}x one epoch of DPO steps ({dpo_epoch:.2f} s)")  # fmt: skip


# ---------------------------------------------------------------------------------------------------
# Memory: each variant in its own process
# ---------------------------------------------------------------------------------------------------
def register_live_reference_task() -> None:
    """``task: dpo-live``: DPO with a frozen copy of the starting model run on every micro-batch."""
    import numpy as np
    import torch

    from llmtools.model import LlamaForCausalLM
    from llmtools.train import tasks
    from llmtools.train.tasks.dpo import DpoTask, pair_logps

    class LiveReferenceDpo(DpoTask):
        name = "dpo-live"
        section = None

        def prepare(self, model, run) -> None:
            module = getattr(model, "module", model)
            self.reference_model = LlamaForCausalLM(module.config).to(run.device)
            self.reference_model.load_state_dict(module.state_dict())
            self.reference_model.eval().requires_grad_(False)
            self.data.attach_reference(np.zeros((self.data.pairs, 2)))  # replaced per batch below

        def loss(self, model, batch, device):
            with torch.no_grad():
                chosen, rejected, _ = pair_logps(self.reference_model, batch, device)
            batch = {**batch, "ref_logps": torch.stack([chosen, rejected], -1).double().cpu().numpy()}
            return super().loss(model, batch, device)

    tasks.TASKS[LiveReferenceDpo.name] = LiveReferenceDpo


def memory_worker(args) -> dict:
    import torch

    register_live_reference_task()
    folder = Path(args.folder)
    task = "dpo-live" if args.variant == "live" else "dpo"
    cfg = config(args, task, args.prefix, args.micro, args.steps)
    cuda = torch.cuda.is_available()
    with PeakMemory(cuda) as peak:
        steps, _, startup = timed_run(cfg, folder / f"mem-{args.variant}")
    from llmtools.train.plan import resolve_model_config

    return {"peak_mb": peak.grown_mb, "step_s": statistics.median(steps[1:] or steps), "startup_s": startup,
            "params": resolve_model_config(cfg).num_parameters(), "device": "cuda" if cuda else "cpu"}  # fmt: skip


def memory(args) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-dpo-mem-") as tmp:
        prefix = build_pairs(Path(tmp), args.seq, args.mem_pairs)
        results: dict[str, list[dict]] = {"precomputed": [], "live": []}
        for _ in range(args.mem_rounds):
            for variant in results:
                argv = ["--memory-worker", variant, "--folder", tmp, "--prefix", prefix,
                        "--seq", str(args.seq), "--micro", str(args.micro), "--accumulation", str(args.accumulation),
                        "--steps", str(args.mem_steps), "--layers", str(args.mem_layers), "--hidden", str(args.mem_hidden)]  # fmt: skip
                results[variant].append(run_worker(__file__, argv, f"memory worker {variant}"))
    first = results["precomputed"][0]
    weights_mb = first["params"] * 4 / 2**20
    print(f"\n## memory: {args.mem_layers} layers, d={args.mem_hidden} ({first['params']:,} parameters, "
          f"{weights_mb:.0f} MB of fp32 weights), seq {args.seq}, micro-batch {args.micro} pairs, ZeRO-2, "
          f"fp32 AdamW, {args.mem_steps} steps, {first['device']}: peak {'allocated' if first['device'] == 'cuda' else 'RSS'} "
          f"grown during train(), {args.mem_rounds} round(s), median")  # fmt: skip
    print(f"{'reference':<12} {'peak MB':>9} {'step CPU ms':>11} {'start-up s':>10}")
    med = {}
    for variant, rows in results.items():
        med[variant] = {k: statistics.median(r[k] for r in rows) for k in ("peak_mb", "step_s", "startup_s")}
        print(f"{variant:<12} {med[variant]['peak_mb']:>9.0f} {med[variant]['step_s'] * 1000:>11.0f} "
              f"{med[variant]['startup_s']:>10.2f}")  # fmt: skip
    p, live = med["precomputed"], med["live"]
    print(f"precomputed / live: memory {p['peak_mb'] / live['peak_mb']:.2f}x ({live['peak_mb'] - p['peak_mb']:.0f} MB "
          f"less; one fp32 copy of the weights is {weights_mb:.0f} MB), step time {p['step_s'] / live['step_s']:.2f}x")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12, help="steps per speed run")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--micro", type=int, default=4, help="pairs (dpo) or sequences (sft) per micro-batch")
    parser.add_argument("--accumulation", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=192)
    parser.add_argument("--pairs", type=int, default=256)
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--mem-layers", type=int, default=8)
    parser.add_argument("--mem-hidden", type=int, default=768)
    parser.add_argument("--mem-steps", type=int, default=3)
    parser.add_argument("--mem-pairs", type=int, default=32)
    parser.add_argument("--mem-rounds", type=int, default=2)
    parser.add_argument("--memory-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_worker:
        args.variant = args.memory_worker
        print(json.dumps(memory_worker(args)))
        return
    if args.quick:
        args.rounds, args.steps, args.seq, args.pairs = 1, 5, 128, 64
        args.mem_layers, args.mem_hidden, args.mem_steps, args.mem_rounds = 4, 384, 2, 1
    if not args.skip_speed:
        speed(args)
    if not args.skip_memory:
        memory(args)


if __name__ == "__main__":
    main()
