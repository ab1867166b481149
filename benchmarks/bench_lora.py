"""Fine-tuning costs, one run, side by side: full fine-tuning vs LoRA, and packed-sample attention.

Cells (each in a fresh subprocess, so its memory peak is its own; same model, seed and batches):

* ``full``      all parameters train (AdamW);
* ``lora``      LoRA r=8 on all seven projections, base frozen (AdamW over the adapters only);
* ``full+seg``  full fine-tuning with a packed-sample (segment) mask: SDPA with a block-diagonal mask
                instead of its fused ``is_causal`` path, the price of packing.

Reported: trainable parameters, optimizer-state bytes, peak memory grown during the steps (CPU: ru_maxrss;
CUDA: max_memory_allocated), median step time, and ratios against ``full``.

    python benchmarks/bench_lora.py                     # tiny preset x 8 layers, seq 512, batch 8
    python benchmarks/bench_lora.py --quick             # 4 layers, seq 128, 3 steps
    python benchmarks/bench_lora.py --device cuda --preset 125m --seq 2048
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CELLS = ("full", "lora", "full+seg")


def worker(args: argparse.Namespace) -> dict:
    import torch

    from llmtools.model import LlamaForCausalLM
    from llmtools.model.lora import TARGETS, LoraSection, apply_lora
    from llmtools.model.presets import load_model_config

    torch.set_num_threads(args.threads)
    base = load_model_config(args.preset).to_dict()
    config = load_model_config(
        {**base, "num_hidden_layers": args.layers, "max_position_embeddings": args.seq}
    )
    torch.manual_seed(1234)
    model = LlamaForCausalLM(config).to(args.device)
    if args.cell == "lora":
        apply_lora(model, LoraSection(r=8, alpha=16, target_modules=list(TARGETS)))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0, foreach=False)
    for p in params:  # allocate the moments first: the peak below is activations + gradients
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    state_bytes = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values())
    gen = torch.Generator().manual_seed(7)
    seq = args.seq
    batches = [
        torch.randint(0, config.vocab_size, (args.batch, seq + 1), generator=gen) for _ in range(args.steps)
    ]
    # Four packed samples per row (segment ids 1..4), positions restarting per sample.
    seg = (torch.arange(seq) * 4 // seq + 1).expand(args.batch, seq).to(args.device)
    pos = (torch.arange(seq) % (seq // 4)).expand(args.batch, seq).to(args.device)
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times, losses = [], []
    for batch in batches:
        batch = batch.to(args.device)
        start = time.perf_counter()
        kwargs = {"position_ids": pos, "segment_ids": seg} if args.cell == "full+seg" else {}
        logits = model(batch[:, :-1], **kwargs)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(float(loss))
    peak = (
        torch.cuda.max_memory_allocated() / 2**20
        if cuda
        else (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    )
    return {
        "cell": args.cell,
        "trainable": sum(p.numel() for p in params),
        "total": sum(p.numel() for p in model.parameters()),
        "optimizer_mb": state_bytes / 2**20,
        "peak_mb": peak,
        "step_s": statistics.median(times[1:] or times),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="4 layers, seq 128, 3 steps")
    parser.add_argument("--cell", choices=CELLS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.layers, args.seq, args.steps = 4, 128, 3
    if args.cell:
        print(json.dumps(worker(args)))
        return
    rows = []
    for cell in CELLS:
        cmd = [sys.executable, __file__, "--cell", cell, "--preset", args.preset, "--layers", str(args.layers),
               "--seq", str(args.seq), "--batch", str(args.batch), "--steps", str(args.steps),
               "--threads", str(args.threads), "--device", args.device]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    full = rows[0]
    print(
        f"# {args.preset} x {args.layers} layers, seq {args.seq}, batch {args.batch}, {args.steps} steps, "
        f"{args.device}, {args.threads} threads"
    )
    print(
        f"{'cell':<9} {'trainable':>11} {'of total':>9} {'optim MB':>9} {'peak MB':>8} {'step ms':>8} "
        f"{'optim x':>8} {'peak x':>7} {'time x':>7}"
    )
    for r in rows:
        print(
            f"{r['cell']:<9} {r['trainable']:>11,} {r['trainable'] / r['total']:>9.2%} {r['optimizer_mb']:>9.2f} "
            f"{r['peak_mb']:>8.1f} {1000 * r['step_s']:>8.1f} "
            f"{r['optimizer_mb'] / max(full['optimizer_mb'], 1e-9):>8.3f} "
            f"{r['peak_mb'] / max(full['peak_mb'], 1e-9):>7.2f} {r['step_s'] / full['step_s']:>7.2f}"
        )


if __name__ == "__main__":
    main()
