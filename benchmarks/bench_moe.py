"""The tiny MoE: its training step against a dense model with the same active parameters, what routing
costs, and how balanced the experts are after training with and without the load-balancing loss.

Three tables, each measured side by side in one run (the machine is shared: read the ratios):

1. **step time** (forward + backward of loss + router auxiliary loss), CPU seconds of this process (one
   thread), median of interleaved rounds: ``tiny-moe`` (8 experts of width 256, 2 per token) vs its dense
   twin (the same attention, a SwiGLU of width 2 x 256: the same active parameters but the routers'), and
   vs ``transformers.Qwen3MoeForCausalLM`` on the same weights;
2. **routing overhead**: one MoE layer's pieces timed alone, forward + backward, on the step's tokens:
   the router (gate matmul, softmax, top-k, renormalisation), the permutation (gathering each
   assignment's token in expert order, and the weighted scatter-add back), and the experts; router +
   permutation, times the MoE layers, as a share of the whole step;
3. **expert load** after N optimizer steps of AdamW on real text (tinyshakespeare, byte tokens), with
   ``router_aux_loss_coef`` 0.1, 0.01 (the preset's) and 0: coefficient of variation of the load per layer and
   the busiest expert's load relative to an even share (1.0 = balanced, 8 = one expert takes all).

    python benchmarks/bench_moe.py            # 5 rounds, 200 training steps
    python benchmarks/bench_moe.py --quick    # 2 rounds, 30 steps (a smoke run)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")
SHARED = Path(os.environ.get("LLMTOOLS_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def configs():
    from llmtools.model.config import MOE_DEFAULTS
    from llmtools.model.presets import load_model_config

    moe = load_model_config("tiny-moe")
    fields = {k: v for k, v in dataclasses.asdict(moe).items() if k not in MOE_DEFAULTS}
    dense = type(moe)(**{**fields, "intermediate_size": moe.num_experts_per_tok * moe.moe_intermediate_size})
    return moe, dense


def training_loss(model, ids):
    import torch.nn.functional as F

    out = model(ids[:, :-1], output_router=True)
    loss = F.cross_entropy(out.logits.float().flatten(0, 1), ids[:, 1:].flatten())
    return loss + out.aux_loss if out.aux_loss is not None else loss


def cpu_time(fn, steps: int) -> float:
    start = time.process_time()  # CPU time of this process: preemption on a shared machine does not count
    for _ in range(steps):
        fn()
    return (time.process_time() - start) / steps


def step_times(batch: int, seq: int, rounds: int, steps: int) -> dict[str, float]:
    import torch
    import transformers

    from llmtools.model.hf import to_hf_config
    from llmtools.model.llama import LlamaForCausalLM

    moe_config, dense_config = configs()
    torch.manual_seed(0)
    moe, dense = LlamaForCausalLM(moe_config), LlamaForCausalLM(dense_config)
    hf = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**to_hf_config(moe_config)), attn_implementation="sdpa"
    )
    hf.load_state_dict(moe.state_dict())
    ids = torch.randint(0, moe_config.vocab_size, (batch, seq + 1))
    runs = {
        "tiny-moe": lambda: training_loss(moe, ids).backward(),
        "dense twin": lambda: training_loss(dense, ids).backward(),
        "transformers MoE": lambda: hf(
            input_ids=ids[:, :-1], labels=ids[:, :-1], output_router_logits=True
        ).loss.backward(),
    }
    for fn in runs.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, fn in runs.items():
            times[name].append(cpu_time(fn, steps))
    return {name: statistics.median(values) for name, values in times.items()}


def routing_pieces(batch: int, seq: int, rounds: int, steps: int) -> dict[str, float]:
    """One MoE layer's router, permutation and experts, each forward + backward on its own."""
    import torch

    from llmtools.model.moe import SparseMoeBlock, route

    config, _ = configs()
    torch.manual_seed(0)
    block = SparseMoeBlock(config)
    for param in block.parameters():
        torch.nn.init.normal_(param, std=config.initializer_range)
    x = torch.randn(batch * seq, config.hidden_size, requires_grad=True)
    with torch.no_grad():
        probs = torch.softmax(block.gate(x), -1)
        fixed = route(probs, config.num_experts_per_tok, True, None, None)
    counts = fixed.counts.tolist()
    weight = fixed.weight.detach().requires_grad_()
    xs_fixed = x.detach()[fixed.token].requires_grad_()

    def router():
        probs = torch.softmax(block.gate(x), dim=-1, dtype=torch.float32)
        r = route(probs, config.num_experts_per_tok, True, None, None)
        (r.weight.sum() + probs.sum()).backward()

    def permutation():
        xs = x[fixed.token]
        out = torch.zeros_like(x).index_add_(0, fixed.token, xs * weight.unsqueeze(-1))
        out.sum().backward()

    def experts():
        block.experts(xs_fixed, counts).sum().backward()

    pieces = {"router": router, "permutation": permutation, "experts": experts}
    for fn in pieces.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in pieces}
    for _ in range(rounds):
        for name, fn in pieces.items():
            times[name].append(cpu_time(fn, steps))
    return {name: statistics.median(values) for name, values in times.items()}


def text_batches(batch: int, seq: int, seed: int):
    import numpy as np
    import torch

    path = SHARED / "tinyshakespeare" / "input.jsonl"
    if not path.exists():
        raise SystemExit(f"needs {path} (the shared data folder beside the repo)")
    text = "".join(json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines() if line)
    tokens = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(tokens) - seq - 1, batch)
        yield torch.from_numpy(np.stack([tokens[s : s + seq + 1] for s in starts]))


def balance_after_training(steps: int, coef: float, batch: int, seq: int) -> dict[str, float]:
    import torch

    from llmtools.model.llama import LlamaForCausalLM

    config, _ = configs()
    config = dataclasses.replace(config, vocab_size=320, router_aux_loss_coef=coef)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    batches = text_batches(batch, seq, seed=1)
    counts = None
    for step in range(steps):
        optimizer.zero_grad()
        target = next(batches)
        out = model(target[:, :-1], output_router=True)
        lm = torch.nn.functional.cross_entropy(out.logits.float().flatten(0, 1), target[:, 1:].flatten())
        (lm + out.aux_loss).backward()
        optimizer.step()
        if step >= steps - 10:  # the load over the last 10 steps
            counts = out.router.counts if counts is None else counts + out.router.counts
    load = counts / counts.sum(-1, keepdim=True)
    cv = load.std(-1, unbiased=False) / load.mean(-1)
    return {
        "lm_loss": float(lm.detach()),
        "cv_mean": float(cv.mean()),
        "cv_max": float(cv.max()),
        "max_load": float((load.max(-1).values * config.num_experts).max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and training steps (a smoke run)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    batch, seq = 8, 128
    rounds, steps = (2, 2) if args.quick else (5, 3)
    moe_config, dense_config = configs()
    print(
        f"# tiny-moe: {moe_config.num_parameters():,} parameters, {moe_config.num_active_parameters():,} active; "
        f"dense twin: {dense_config.num_parameters():,}"
    )
    print(
        f"# training step (fwd+bwd, {batch} x {seq} tokens), CPU ms, median of {rounds} interleaved rounds x "
        f"{steps} steps, {torch.get_num_threads()} thread(s)"
    )
    t = step_times(batch, seq, rounds, steps)
    for name, seconds in t.items():
        print(f"{name:18} {seconds * 1e3:8.1f} ms   {seconds / t['dense twin']:5.2f} x dense twin")

    pieces = routing_pieces(batch, seq, rounds, steps * 3)
    layers = len(moe_config.moe_layers())
    routing = (pieces["router"] + pieces["permutation"]) * layers
    print(f"\n# one MoE layer's pieces (fwd+bwd, {batch * seq} tokens), CPU ms, {layers} MoE layers per step")
    for name, seconds in pieces.items():
        print(f"{name:18} {seconds * 1e3:8.2f} ms")
    print(
        f"routing (router + permutation) x {layers} layers = {routing * 1e3:.1f} ms = "
        f"{routing / t['tiny-moe']:.1%} of the tiny-moe step"
    )

    train_steps = 30 if args.quick else 200
    print(
        f"\n# expert load over the last 10 of {train_steps} AdamW steps on tinyshakespeare ({batch} x {seq})"
    )
    print(f"{'router_aux_loss_coef':>20} {'lm loss':>8} {'load CV mean':>13} {'CV worst':>9} {'max load':>9}")
    for coef in (0.1, 0.01, 0.0):
        b = balance_after_training(train_steps, coef, batch, seq)
        print(f"{coef:20} {b['lm_loss']:8.3f} {b['cv_mean']:13.3f} {b['cv_max']:9.3f} {b['max_load']:9.2f}")


if __name__ == "__main__":
    main()
