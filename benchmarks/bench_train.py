#!/usr/bin/env python3
"""llm-train's loop against a bare PyTorch loop: tokens/s at ZeRO-1/2 on one process, and FLOPs accounting;
the step time of Lion and Muon against AdamW; the cost of the norm metrics (params_norm, update_ratio).

Both loops train the same model (the tiny preset), on the same batches (the same blended dataset, in the
same order), with the same optimizer (AdamW, no decay on norms), LR schedule, clipping and gradient
accumulation. The bare loop is what one would write by hand: forward, fp32 cross-entropy, backward,
clip, step. llm-train's figure is wall clock between its step records (so it includes DeepSpeed, the
health checks, the metrics records and the stderr lines). The runs are interleaved (bare, ZeRO-1,
ZeRO-2, bare, ...) and the median per method is reported, because the machine is shared and noisy.

On one rank llm-train reduces gradients once per step (``engine.coalesce_grad_reduction()``, see
``llmtools.train.loop.coalesce_reductions``); ``--uncoalesced`` adds a ZeRO-2 row with DeepSpeed's
default reduction after every micro-batch, for comparison.

FLOPs: ``flops_per_token`` (the documented 6N + 12LHQT formula) against (a) a count by hand from the
shapes, and (b) torch's FlopCounterMode over one real forward + backward.

Optimizers (``--sections optimizers``): llm-train at ZeRO-1 (one process) with AdamW, Lion and Muon, the
runs of a round interleaved; each optimizer's wall and CPU time per step over AdamW's of the same round
(paired ratio, median over rounds). Muon runs torch's Newton-Schulz (5 iterations, bf16) on every hidden
matrix: its extra cost grows with the matrices' size and the number of steps, not the batch.

Norm metrics (``--sections norms``): AdamW at ZeRO-2 with ``logging.norms`` off, on at ``log_every 10``
(the default cadence: measured every 10th step) and on at ``log_every 1`` (measured every step, what
``health.update_spike_factor`` does), paired per round; the overhead per step against norms off.

    python benchmarks/bench_train.py            # all sections, ~8-12 minutes on 2 CPU cores
    python benchmarks/bench_train.py --quick    # smoke run (~2 minutes)
    python benchmarks/bench_train.py --sections optimizers,norms --rounds 5
    python benchmarks/bench_train.py --uncoalesced --rounds 5
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
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED = Path(os.environ.get("LLMTOOLS_SHARED_DATA", ROOT.parent / "shared" / "data"))


def build_data(folder: Path, seq: int, samples: int) -> str:
    """A byte-level mix of tinyshakespeare (real text; no tokenizer training needed)."""
    from llmtools.data import mix as mixlib
    from tests.train.conftest import write_byte_prefix

    prefix = write_byte_prefix(
        SHARED / "tinyshakespeare" / "input.jsonl", folder / "shakespeare_text_document"
    )
    config = mixlib.MixConfig(
        blend=mixlib.Blend([str(prefix)], None), seq_length=seq, num_samples=samples, split="100,0,0"
    )
    mixlib.save_plan(mixlib.build_plan(config), folder / "mix.json")
    return str(folder / "mix.json")


def train_config(mix: str, steps: int, micro: int, global_batch: int, **sections):
    from llmtools.train.config import from_dict

    raw = {
        "model": {"preset": "tiny", "vocab_size": 320},
        "data": {"mix": mix},
        "training": {"micro_batch_size": micro, "global_batch_size": global_batch, "train_steps": steps},
        "optimizer": {"lr": 1e-3, "weight_decay": 0.1},
        "schedule": {"kind": "cosine", "warmup_steps": 5},
        "logging": {"log_every": 1},
        "checkpoint": {"save_every": 0, "save_final": False},
    }
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return from_dict(raw, "bench")


def run_llm_train(cfg, stage: int, run_dir: Path, warmup: int) -> tuple[float, float, list[float]]:
    """(tokens per wall second, tokens per CPU second, losses) of llm-train's loop, timed between steps."""
    from llmtools.train.deepspeed_config import load_ds_config
    from llmtools.train.loop import RunOptions, train

    ds = load_ds_config(ROOT / "configs" / "deepspeed" / f"zero{stage}.json")
    stamps: list[tuple[float, float]] = []
    result = train(
        cfg,
        ds,
        RunOptions(
            run_dir=run_dir,
            quiet=True,
            force=True,
            on_step=lambda step, loss: stamps.append((time.time(), time.process_time())),
        ),
    )
    tokens = (len(stamps) - warmup) * cfg.training.global_batch_size * result_seq(run_dir)
    wall = stamps[-1][0] - stamps[warmup - 1][0]
    cpu = stamps[-1][1] - stamps[warmup - 1][1]
    return tokens / wall, tokens / cpu, result.losses


def result_seq(run_dir: Path) -> int:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    return (train[-1]["consumed_tokens"] // train[-1]["consumed_samples"]) if train else 0


def run_bare(cfg, warmup: int) -> tuple[float, float, list[float]]:
    """The hand-written loop: same model, data order, optimizer, schedule, clipping, accumulation."""
    import torch
    import torch.nn.functional as F

    from llmtools.data.dataset import BlendedGPTDataset, MicroBatchSampler
    from llmtools.model import LlamaForCausalLM
    from llmtools.train.engine import param_groups
    from llmtools.train.plan import resolve_model_config
    from llmtools.train.schedule import build_lr_scheduler

    data = BlendedGPTDataset.from_mix(cfg.data.mix)
    t = cfg.training
    steps = cfg.steps(data.seq_length)
    torch.manual_seed(t.seed)
    model = LlamaForCausalLM(resolve_model_config(cfg))
    opt = torch.optim.AdamW(
        param_groups(model, cfg.optimizer.weight_decay),
        lr=cfg.optimizer.lr,
        betas=tuple(cfg.optimizer.betas),
        eps=cfg.optimizer.eps,
        foreach=False,
    )
    sched = build_lr_scheduler(opt, cfg.schedule, cfg.total_steps(data.seq_length))
    gas = t.global_batch_size // t.micro_batch_size
    batches = iter(
        MicroBatchSampler(steps * t.global_batch_size, t.micro_batch_size, t.global_batch_size, 0, 1)
    )
    losses, stamps = [], []
    for _step in range(steps):
        total = 0.0
        for _ in range(gas):
            tokens = torch.from_numpy(data.batch(next(batches))).long()
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
            (loss / gas).backward()
            total += loss.item() / gas
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.clip_grad)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total)
        stamps.append((time.time(), time.process_time()))
    tokens = (steps - warmup) * t.global_batch_size * data.seq_length
    wall = stamps[-1][0] - stamps[warmup - 1][0]
    cpu = stamps[-1][1] - stamps[warmup - 1][1]
    return tokens / wall, tokens / cpu, losses


def variant_name(stage: int, coalesced: bool) -> str:
    return f"llm-train ZeRO-{stage}" + ("" if coalesced else " per-micro")


def flops_check(seq: int, micro: int) -> list[tuple[str, float, float, float]]:
    """(what, formula, measured, ratio) for the tiny preset and a Llama-3-like GQA shape."""
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    from llmtools.model import LlamaForCausalLM, load_model_config
    from llmtools.model.flops import flops_per_token

    rows = []
    for name in ("tiny", "125m"):
        mc = load_model_config(name)
        h, d, q, kv, inter, layers, vocab = (
            mc.hidden_size,
            mc.head_dim or mc.hidden_size // mc.num_attention_heads,
            mc.num_attention_heads,
            mc.num_key_value_heads or mc.num_attention_heads,
            mc.intermediate_size,
            mc.num_hidden_layers,
            mc.vocab_size,
        )
        # By hand, per token, forward: 2 FLOPs per multiply-add of every projection, the lm_head, and the
        # two attention products (Q K^T, A V) over all `seq` positions; training = 3 x forward.
        per_layer = 2 * (h * q * d + 2 * h * kv * d + q * d * h + 3 * h * inter) + 2 * 2 * q * d * seq
        hand = 3 * (layers * per_layer + 2 * h * vocab)
        formula = flops_per_token(mc, seq)
        rows.append((f"{name}: formula vs hand count (FLOPs/token)", formula, hand, formula / hand))
        if name == "tiny":
            torch.manual_seed(0)
            model = LlamaForCausalLM(mc)
            ids = torch.randint(0, vocab, (micro, seq + 1))
            with FlopCounterMode(display=False) as counter:
                logits = model(ids[:, :-1])
                F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten()).backward()
            measured = counter.get_total_flops() / (micro * seq)
            rows.append((f"{name}: formula vs torch FlopCounterMode", formula, measured, formula / measured))
            # FlopCounterMode has no formula for the CPU attention kernel: compare the matmul part (6N) alone.
            from llmtools.model.flops import matmul_parameters

            six_n = 6.0 * matmul_parameters(mc)
            rows.append(
                (f"{name}: 6N vs FlopCounterMode (no CPU SDPA count)", six_n, measured, six_n / measured)
            )
    return rows


def paired(results: dict[str, list[float]], base: str, name: str) -> float:
    """Median over rounds of base's throughput over name's (> 1: name is slower), paired by round."""
    return statistics.median(b / v for b, v in zip(results[base], results[name], strict=True))


def optimizer_section(mix: str, tmp: Path, args, steps: int, rounds: int, warmup: int) -> None:
    """Step time of Lion and Muon against AdamW: llm-train at ZeRO-1, one process, interleaved rounds."""
    variants = {
        "AdamW": {"optimizer": {"name": "adamw"}},
        "Lion": {"optimizer": {"name": "lion", "lr": 3e-4, "weight_decay": 0.3}},
        "Muon": {"optimizer": {"name": "muon"}},
    }
    wall: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    final: dict[str, float] = {}
    for r in range(rounds):
        for name, sections in variants.items():
            cfg = train_config(mix, steps, args.micro, args.global_batch, **sections)
            tps, cps, losses = run_llm_train(cfg, 1, tmp / f"opt-{name}-{r}", warmup)
            wall[name].append(tps)
            cpu[name].append(cps)
            final[name] = losses[-1]
        print(f"optimizers round {r + 1}/{rounds}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in wall.items()),
              file=sys.stderr, flush=True)  # fmt: skip
    print(
        f"\nStep time of each optimizer over AdamW's (llm-train, ZeRO-1, 1 process, fp32, tiny preset, "
        f"{args.micro}x{args.seq} tokens per micro-batch, global batch {args.global_batch}, {steps} steps, "
        f"timed after step {warmup}; paired per round, median of {rounds} interleaved rounds)"
    )
    print(f"{'optimizer':<10} {'wall tok/s':>10} {'wall ratio':>10} {'cpu ratio':>10} {'final loss':>11}")
    for name in variants:
        print(
            f"{name:<10} {statistics.median(wall[name]):>10,.0f} {paired(wall, 'AdamW', name):>10.3f} "
            f"{paired(cpu, 'AdamW', name):>10.3f} {final[name]:>11.4f}"
        )


def norms_section(mix: str, tmp: Path, args, steps: int, rounds: int, warmup: int) -> None:
    """The cost of params_norm / update_norm / update_ratio per step: off, every 10th step, every step."""
    variants = {
        "norms off": {"logging": {"norms": False, "log_every": 1}},
        "norms, log_every 10": {"logging": {"norms": True, "log_every": 10}},
        "norms, log_every 1": {"logging": {"norms": True, "log_every": 1}},
    }
    wall: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(rounds):
        for index, (name, sections) in enumerate(variants.items()):
            cfg = train_config(mix, steps, args.micro, args.global_batch, **sections)
            tps, cps, _ = run_llm_train(cfg, 2, tmp / f"norms-{index}-{r}", warmup)
            wall[name].append(tps)
            cpu[name].append(cps)
        print(f"norms round {r + 1}/{rounds}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in wall.items()),
              file=sys.stderr, flush=True)  # fmt: skip
    print(
        f"\nCost of the norm metrics per step (AdamW, llm-train ZeRO-2, 1 process, fp32, tiny preset, {steps} "
        f"steps; overhead = step time over norms off - 1, paired per round, median of {rounds} rounds). A "
        "measured step copies the optimizer's fp32 parameters (its partition) and takes two norms of them."
    )
    print(f"{'variant':<22} {'wall tok/s':>10} {'wall overhead':>14} {'cpu overhead':>13}")
    for name in variants:
        print(
            f"{name:<22} {statistics.median(wall[name]):>10,.0f} {paired(wall, 'norms off', name) - 1:>14.2%} "
            f"{paired(cpu, 'norms off', name) - 1:>13.2%}"
        )
    # The end-to-end difference is within the shared machine's noise: time the measurement itself too
    # (CPU time of NormMonitor's before/after around a step, on the same model's parameters) against the
    # CPU time of a norms-off step.
    measure = norm_measurement_seconds(cfg)
    step = statistics.median(cpu["norms off"])
    step_seconds = args.global_batch * args.seq / step
    print(
        f"NormMonitor alone (copy + two norms over {measure[1]:,} fp32 parameters, CPU time, median of 50): "
        f"{measure[0] * 1e3:.2f} ms = {measure[0] / step_seconds:.2%} of a norms-off step "
        f"({step_seconds * 1e3:.0f} ms CPU); per step at log_every 10: {measure[0] / step_seconds / 10:.2%}"
    )


def norm_measurement_seconds(cfg) -> tuple[float, int]:
    """(median CPU seconds of one measured step's NormMonitor work, parameter count) on cfg's model."""
    import torch

    from llmtools.model import LlamaForCausalLM
    from llmtools.train.norms import NormMonitor
    from llmtools.train.plan import resolve_model_config

    model = LlamaForCausalLM(resolve_model_config(cfg))
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    monitor = NormMonitor(opt, model)
    times = []
    for _ in range(50):
        start = time.process_time()
        monitor.begin()
        old = monitor.before(opt)
        monitor.after(opt, old)
        monitor.finish("cpu")
        times.append(time.process_time() - start)
    return statistics.median(times), sum(p.numel() for p in model.parameters())


def loop_section(mix: str, tmp: Path, args, steps: int, rounds: int, warmup: int) -> None:
    """llm-train's loop against the bare PyTorch loop (AdamW), and the FLOPs accounting."""
    # ZeRO-1 reduces at the accumulation boundary only either way: the comparison is ZeRO-2's.
    variants = [(1, True), (2, True)] + ([(2, False)] if args.uncoalesced else [])
    names = ["bare PyTorch"] + [variant_name(stage, coalesced) for stage, coalesced in variants]
    results: dict[str, list[float]] = {name: [] for name in names}
    cpu_results: dict[str, list[float]] = {name: [] for name in names}
    losses: dict[str, list[float]] = {}
    cfg = train_config(mix, steps, args.micro, args.global_batch)
    for r in range(rounds):
        tps, cps, losses["bare PyTorch"] = run_bare(cfg, warmup)
        results["bare PyTorch"].append(tps)
        cpu_results["bare PyTorch"].append(cps)
        for stage, coalesced in variants:
            name = variant_name(stage, coalesced)
            os.environ["LLMTOOLS_COALESCE"] = "1" if coalesced else "0"
            tps, cps, losses[name] = run_llm_train(cfg, stage, tmp / f"run{stage}{coalesced}-{r}", warmup)
            results[name].append(tps)
            cpu_results[name].append(cps)
        os.environ["LLMTOOLS_COALESCE"] = "1"
        print(
            f"round {r + 1}/{rounds}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in results.items()),
            file=sys.stderr,
            flush=True,
        )

    print(
        f"\nllm-train loop vs bare PyTorch loop (tiny preset, {args.micro}x{args.seq} tokens per micro-batch, "
        f"global batch {args.global_batch}, 1 process, fp32, {steps} steps, median of {rounds} interleaved "
        f"rounds, timed after step {warmup})"
    )
    print(
        "wall: tokens per wall-clock second; cpu: tokens per CPU second of the process (steadier on a shared "
        "machine); overhead = bare / loop - 1, the median over rounds of each loop against the bare loop of its "
        "own round (paired, so load that changes between rounds cancels)"
    )
    print(
        f"{'loop':<30} {'wall tok/s':>10} {'overhead':>9} {'cpu tok/s':>10} {'overhead':>9} {'final loss':>11} "
        f"{'max |dloss|':>12}"
    )
    for name, values in results.items():
        tps, cps = statistics.median(values), statistics.median(cpu_results[name])
        overhead = paired(results, "bare PyTorch", name) - 1
        overhead_cpu = paired(cpu_results, "bare PyTorch", name) - 1
        diff = max(abs(a - b) for a, b in zip(losses[name], losses["bare PyTorch"], strict=True))
        print(
            f"{name:<30} {tps:>10,.0f} {overhead:>9.1%} {cps:>10,.0f} {overhead_cpu:>9.1%} "
            f"{losses[name][-1]:>11.4f} {diff:>12.2e}"
        )

    print("\nFLOPs accounting (llmtools.model.flops.flops_per_token = 6N + 12 L H Q T)")
    print(f"{'check':<48} {'formula':>12} {'count':>12} {'ratio':>7}")
    for what, formula, measured, ratio in flops_check(args.seq, args.micro):
        print(f"{what:<48} {formula:>12,.0f} {measured:>12,.0f} {ratio:>7.4f}")


SECTIONS = {"loop": loop_section, "optimizers": optimizer_section, "norms": norms_section}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--micro", type=int, default=8)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)} [all]"
    )
    parser.add_argument(
        "--uncoalesced",
        action="store_true",
        help="also time ZeRO-2 with DeepSpeed's default per-micro-batch gradient reduction (LLMTOOLS_COALESCE=0)",
    )
    args = parser.parse_args()
    chosen = [name.strip() for name in args.sections.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in SECTIONS]
    if unknown:
        parser.error(f"--sections: unknown {', '.join(unknown)} (choose from {', '.join(SECTIONS)})")
    steps = args.steps or (12 if args.quick else 60)
    rounds = args.rounds or (1 if args.quick else 3)
    warmup = 3 if args.quick else 10

    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        mix = build_data(tmp, args.seq, steps * args.global_batch + 64)
        for name in chosen:
            SECTIONS[name](mix, tmp, args, steps, rounds, warmup)


if __name__ == "__main__":
    main()
