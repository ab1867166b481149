"""Activation checkpointing: peak memory and step time with and without it, at two sequence lengths, one run.

Each (sequence length, checkpointing) cell runs in a fresh subprocess so its peak is its own: on CPU the
peak resident set (``ru_maxrss``) grown during the training steps over what the process held after
building the model and optimizer; on CUDA ``torch.cuda.max_memory_allocated``. Every cell trains the
same model from the same seed on the same batches (fp32, AdamW, moments allocated before measuring), so the losses must agree: the table
shows the largest |loss difference| against the run without checkpointing (expected <= 1e-6).

    python benchmarks/bench_memory.py                      # tiny preset x 8 layers, seq 512 and 1024
    python benchmarks/bench_memory.py --quick              # seq 128 and 256, 3 steps
    python benchmarks/bench_memory.py --device cuda --seq 2048 4096 --layers 12
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.peak_memory import PeakMemory, run_worker  # noqa: E402


def worker(args: argparse.Namespace) -> dict:
    import torch

    from llmtools.model import LlamaForCausalLM
    from llmtools.model.presets import load_model_config

    torch.set_num_threads(args.threads)
    base = load_model_config(args.preset).to_dict()
    config = load_model_config(
        {**base, "num_hidden_layers": args.layers, "max_position_embeddings": max(args.seq)}
    )
    torch.manual_seed(1234)
    model = LlamaForCausalLM(config).to(args.device)
    model.gradient_checkpointing = bool(args.ac)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, foreach=False)
    # Allocate the Adam moments before measuring (a zero-gradient step with no decay leaves the weights
    # as they are), so the peak below is activations and gradients, not optimizer state.
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    gen = torch.Generator().manual_seed(7)
    seq = args.seq[0]
    batches = [
        torch.randint(0, config.vocab_size, (args.batch, seq + 1), generator=gen) for _ in range(args.steps)
    ]
    cuda = args.device.startswith("cuda")
    losses, times = [], []
    with PeakMemory(cuda) as peak:
        for batch in batches:
            batch = batch.to(args.device)
            start = time.perf_counter()
            loss = model.loss(batch[:, :-1], batch[:, 1:])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            losses.append(float(loss))
    return {"losses": losses, "step_s": statistics.median(times[1:] or times), "peak_mb": peak.grown_mb,
            "params": config.num_parameters()}  # fmt: skip


def run_cell(args: argparse.Namespace, seq: int, ac: bool) -> dict:
    argv = ["--worker", "--seq", str(seq), "--ac", str(int(ac)), "--preset", args.preset,
            "--layers", str(args.layers), "--batch", str(args.batch), "--steps", str(args.steps),
            "--device", args.device, "--threads", str(args.threads)]  # fmt: skip
    return run_worker(__file__, argv, f"{seq=}, {ac=}", args.threads)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument(
        "--seq", type=int, nargs="+", default=None, help="sequence lengths (default 512 1024)"
    )
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ac", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    if args.quick:
        args.seq = args.seq or [128, 256]
        args.steps, args.layers = 3, 4
    args.seq = args.seq or [512, 1024]
    print(f"# bench_memory: preset {args.preset}, {args.layers} layers, batch {args.batch}, {args.steps} steps "
          f"(median step after the first), device {args.device}, {args.threads} thread(s), fp32 AdamW")  # fmt: skip
    header = f"{'seq':>6} {'act. ckpt':>9} {'peak MB':>9} {'step s':>8} {'mem ratio':>9} {'time ratio':>10} {'max |dloss|':>12}"
    print(header)
    print("-" * len(header))
    for seq in args.seq:
        off = run_cell(args, seq, False)
        on = run_cell(args, seq, True)
        diff = max(abs(a - b) for a, b in zip(off["losses"], on["losses"], strict=True))
        print(
            f"{seq:>6} {'off':>9} {off['peak_mb']:>9.1f} {off['step_s']:>8.3f} {1.0:>9.2f} {1.0:>10.2f} {0.0:>12.1e}"
        )
        print(f"{seq:>6} {'on':>9} {on['peak_mb']:>9.1f} {on['step_s']:>8.3f} "
              f"{on['peak_mb'] / off['peak_mb']:>9.2f} {on['step_s'] / off['step_s']:>10.2f} {diff:>12.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
