"""Sequence parallelism (DeepSpeed-Ulysses): peak memory per rank and tokens/s, SP=1 against SP=2.

Each (sequence length, degree) cell is a fresh ``torch.distributed.run`` of N processes (gloo on CPU,
NCCL on CUDA) that trains one row of ``seq`` tokens through the model's own path: at SP=2 each rank
holds half of the row and the attention layers exchange heads with DeepSpeed's ``DistributedAttention``
(:mod:`llmtools.model.sequence_parallel`). Peak memory is the largest, over the ranks, of the resident
set grown during the steps (CPU) or ``max_memory_allocated`` (CUDA). The longest sequence that fits a
memory budget is read off the table for each degree; both degrees train the same model on the same
row, so their losses agree (the table shows the largest |loss difference|).

    python benchmarks/bench_sequence_parallel.py                       # seq 2k..16k, budget 640 MB/rank
    python benchmarks/bench_sequence_parallel.py --quick               # seq 1k and 2k
    python benchmarks/bench_sequence_parallel.py --seq 4096 8192 --budget-mb 400
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from llmtools.model import LlamaForCausalLM
    from llmtools.model.presets import load_model_config

    cuda = args.device.startswith("cuda")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = f"cuda:{rank}" if cuda else "cpu"
    torch.set_num_threads(args.threads)
    base = load_model_config(args.preset).to_dict()
    config = load_model_config(
        {
            **base,
            "num_hidden_layers": args.layers,
            "max_position_embeddings": args.seq,
            "vocab_size": args.vocab,
        }
    )
    torch.manual_seed(1234)
    model = LlamaForCausalLM(config).to(device)
    part = slice(None)
    if world > 1:
        import deepspeed.ops
        from deepspeed import comm

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # plain gloo, as llm-train does

        from llmtools.model.sequence_parallel import enable_sequence_parallel
        from llmtools.train.sequence import start_sequence_parallel

        comm.init_distributed(dist_backend=dist.get_backend(), dist_init_required=False)
        _, sequence = start_sequence_parallel(world)
        enable_sequence_parallel(model, sequence.group, world)
        n = args.seq // world
        part = slice(rank * n, (rank + 1) * n)
    gen = torch.Generator().manual_seed(7)
    row = torch.randint(0, config.vocab_size, (1, args.seq + 1), generator=gen).to(device)
    tokens, labels = row[:, :-1][:, part], row[:, 1:][:, part]
    positions = torch.arange(args.seq, device=device)[None, part]
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    losses, times = [], []
    for _ in range(args.steps):
        dist.barrier()
        start = time.perf_counter()
        logits = model(tokens, position_ids=positions)
        total = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="sum")
        (total / args.seq).backward()  # each rank's share of the row's mean; the shares sum to it
        model.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()
        times.append(time.perf_counter() - start)
        summed = total.detach().clone()
        dist.all_reduce(summed)
        losses.append(float(summed) / args.seq)
    peak = (torch.cuda.max_memory_allocated() - before) if cuda else (
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before)  # fmt: skip
    peaks = [None] * world
    dist.all_gather_object(peaks, peak)
    if rank == 0:
        step = statistics.median(times[1:] or times)
        print(
            json.dumps(
                {"losses": losses, "step_s": step, "peak_mb": max(peaks) / 2**20, "tok_s": args.seq / step}
            )
        )
    dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cell(args: argparse.Namespace, seq: int, sp: int) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(sp), "--master_port", str(_port()),
           __file__, "--worker", "--seq", str(seq), "--preset", args.preset, "--layers", str(args.layers),
           "--vocab", str(args.vocab), "--steps", str(args.steps), "--device", args.device,
           "--threads", str(args.threads)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode:
        causes = [
            line
            for line in proc.stderr.splitlines()
            if "what()" in line or "terminate" in line or "Error" in line
        ]
        raise SystemExit(f"worker failed ({seq=}, {sp=}):\n" + "\n".join(causes[:10]))
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument(
        "--seq", type=int, nargs="+", default=None, help="sequence lengths (default 2k 4k 8k 16k)"
    )
    parser.add_argument(
        "--budget-mb", type=float, default=640.0, help="memory per rank the longest sequence must fit"
    )
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.seq = args.seq[0]
        worker(args)
        return
    if args.quick:
        args.seq = args.seq or [1024, 2048]
        args.steps = 2
    args.seq = args.seq or [2048, 4096, 8192, 16384]
    print(f"# bench_sequence_parallel: preset {args.preset}, {args.layers} layers, vocabulary {args.vocab}, one row, "
          f"{args.steps} steps (median after the first), device {args.device}, {args.threads} thread(s) per rank")  # fmt: skip
    header = f"{'seq':>6} {'SP':>3} {'peak MB/rank':>12} {'step s':>8} {'tokens/s':>9} {'mem ratio':>9} {'tok/s ratio':>11} {'max |dloss|':>12}"
    print(header)
    print("-" * len(header))
    longest = {1: 0, 2: 0}
    for seq in args.seq:
        one, two = run_cell(args, seq, 1), run_cell(args, seq, 2)
        diff = max(abs(a - b) for a, b in zip(one["losses"], two["losses"], strict=True))
        for sp, cell in ((1, one), (2, two)):
            if cell["peak_mb"] <= args.budget_mb:
                longest[sp] = max(longest[sp], seq)
        print(
            f"{seq:>6} {1:>3} {one['peak_mb']:>12.1f} {one['step_s']:>8.3f} {one['tok_s']:>9.0f} {1.0:>9.2f} {1.0:>11.2f} {0.0:>12.1e}"
        )
        print(f"{seq:>6} {2:>3} {two['peak_mb']:>12.1f} {two['step_s']:>8.3f} {two['tok_s']:>9.0f} "
              f"{two['peak_mb'] / one['peak_mb']:>9.2f} {two['tok_s'] / one['tok_s']:>11.2f} {diff:>12.1e}")  # fmt: skip
    ratio = longest[2] / longest[1] if longest[1] else float("nan")
    print(
        f"# longest sequence within {args.budget_mb:.0f} MB per rank (of those run): SP=1 {longest[1]}, "
        f"SP=2 {longest[2]} ({ratio:.1f}x)"
    )


if __name__ == "__main__":
    main()
