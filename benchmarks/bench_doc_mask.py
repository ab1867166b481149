"""Document-aware attention: peak memory and step time of document attention against a dense t x t mask.

Each (sequence length, attention) cell trains in a fresh subprocess so its peak is its own: on CPU the
peak resident set grown during the steps over what the process held before them; on CUDA
``torch.cuda.max_memory_allocated``. Both cells of a length train the same model from the same seed on
the same packed rows (documents of random length ending in EOD, Megatron's ``reset_attention_mask`` and
``reset_position_ids``), so their losses must agree; the table shows the largest |loss difference|.

- ``dense``: the model's packed path fed Megatron's dense mask (SDPA with a (b, 1, t, t) boolean mask).
- ``doc``: the model's own path (:mod:`llmtools.model.doc_attention`: per-document SDPA spans on CPU,
  variable-length flash attention on CUDA in bf16/fp16).

A dense cell whose mask alone would exceed ``--dense-limit-mb`` is not run (its size is printed).

    python benchmarks/bench_doc_mask.py                         # tiny preset x 2 layers, seq 2k 8k 32k
    python benchmarks/bench_doc_mask.py --quick                 # seq 512 and 2048, 2 steps
    python benchmarks/bench_doc_mask.py --device cuda --dtype bf16 --layers 8
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

EOD = 0


def _rows(seq: int, batch: int, mean_doc: int, vocab: int):
    import numpy as np

    rng = np.random.default_rng(7)
    rows = rng.integers(1, vocab, size=(batch, seq + 1))
    for row in rows:
        at = 0
        while True:
            at += int(rng.integers(mean_doc // 4, 2 * mean_doc))
            if at >= seq:
                break
            row[at] = EOD
    return rows


def worker(args: argparse.Namespace) -> dict:
    import torch
    import torch.nn.functional as F

    from llmtools.data.doc_mask import document_masks
    from llmtools.model import LlamaForCausalLM
    from llmtools.model import llama as llama_module
    from llmtools.model.presets import load_model_config

    torch.set_num_threads(args.threads)
    seq = args.seq[0]
    base = load_model_config(args.preset).to_dict()
    config = load_model_config(
        {
            **base,
            "num_hidden_layers": args.layers,
            "max_position_embeddings": seq,
            "vocab_size": args.vocab,
        }
    )
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    torch.manual_seed(1234)
    model = LlamaForCausalLM(config).to(device=args.device, dtype=dtype)
    model.train()
    if args.mode == "dense":  # the dense reference: Megatron's t x t mask through SDPA
        mask_of: dict = {}

        def dense_attention(q, k, v, spans, enable_gqa=False, kernel=None):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask_of["mask"], enable_gqa=enable_gqa)

        llama_module.document_attention = dense_attention
    rows = _rows(seq, args.batch, args.mean_doc, config.vocab_size)
    masks = document_masks(
        rows[:, :-1], EOD, reset_position_ids=True, reset_attention_mask=True, eod_mask_loss=False
    )
    tokens = torch.from_numpy(rows).to(args.device)
    positions = torch.from_numpy(masks["position_ids"]).to(args.device)
    segments = torch.from_numpy(masks["segment_ids"]).to(args.device)
    cuda = args.device.startswith("cuda")
    losses, times = [], []
    with PeakMemory(cuda) as peak:
        for _ in range(args.steps):
            start = time.perf_counter()
            if args.mode == "dense":
                mask_of["mask"] = llama_module.segment_causal_mask(segments)
            logits = model(tokens[:, :-1], position_ids=positions, segment_ids=segments)
            loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
            loss.backward()
            model.zero_grad(set_to_none=True)
            if args.mode == "dense":
                mask_of.clear()
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            losses.append(float(loss))
    return {"losses": losses, "step_s": statistics.median(times[1:] or times), "peak_mb": peak.grown_mb}


def run_cell(args: argparse.Namespace, seq: int, mode: str) -> dict:
    argv = ["--worker", "--seq", str(seq), "--mode", mode, "--preset", args.preset,
            "--layers", str(args.layers), "--batch", str(args.batch), "--steps", str(args.steps),
            "--device", args.device, "--threads", str(args.threads), "--dtype", args.dtype,
            "--mean-doc", str(args.mean_doc), "--vocab", str(args.vocab)]  # fmt: skip
    return run_worker(__file__, argv, f"{seq=}, {mode=}", args.threads)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument(
        "--seq", type=int, nargs="+", default=None, help="sequence lengths (default 2048 8192 32768)"
    )
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument(
        "--vocab", type=int, default=512, help="a small vocabulary keeps the logits out of the way"
    )
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--mean-doc", type=int, default=512, help="mean document length in tokens")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--dense-limit-mb", type=float, default=1024.0, help="skip dense cells whose mask is larger"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="doc", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    if args.quick:
        args.seq = args.seq or [512, 2048]
        args.steps = 2
    args.seq = args.seq or [2048, 8192, 32768]
    print(f"# bench_doc_mask: preset {args.preset}, {args.layers} layers, batch {args.batch}, {args.steps} steps "
          f"(median step after the first), mean document {args.mean_doc} tokens, device {args.device}, "
          f"{args.dtype}, {args.threads} thread(s)")  # fmt: skip
    header = f"{'seq':>6} {'attention':>9} {'peak MB':>9} {'step s':>8} {'mem ratio':>9} {'time ratio':>10} {'max |dloss|':>12}"
    print(header)
    print("-" * len(header))
    for seq in args.seq:
        doc = run_cell(args, seq, "doc")
        # a float mask is what SDPA's CPU path builds from the boolean one: 4 bytes a pair
        dense_mb = args.batch * seq * seq * 4 / 2**20
        if dense_mb > args.dense_limit_mb:
            print(f"{seq:>6} {'dense':>9} {'-':>9} {'-':>8} {'-':>9} {'-':>10} {'-':>12}  "
                  f"(not run: its mask alone is {dense_mb:,.0f} MB)")  # fmt: skip
        else:
            dense = run_cell(args, seq, "dense")
            diff = max(abs(a - b) for a, b in zip(dense["losses"], doc["losses"], strict=True))
            print(f"{seq:>6} {'dense':>9} {dense['peak_mb']:>9.1f} {dense['step_s']:>8.3f} {1.0:>9.2f} {1.0:>10.2f} "
                  f"{0.0:>12.1e}")  # fmt: skip
        ratio_mem = (
            f"{doc['peak_mb'] / dense['peak_mb']:>9.2f}" if dense_mb <= args.dense_limit_mb else f"{'-':>9}"
        )
        ratio_t = (
            f"{doc['step_s'] / dense['step_s']:>10.2f}" if dense_mb <= args.dense_limit_mb else f"{'-':>10}"
        )
        d = f"{diff:>12.1e}" if dense_mb <= args.dense_limit_mb else f"{'-':>12}"
        print(f"{seq:>6} {'doc':>9} {doc['peak_mb']:>9.1f} {doc['step_s']:>8.3f} {ratio_mem} {ratio_t} {d}")


if __name__ == "__main__":
    main()
