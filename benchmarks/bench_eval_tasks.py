#!/usr/bin/env python3
"""The cost of in-loop downstream tasks (``eval.tasks``) against a training step of the same model.

The tiny preset (byte vocabulary), one process: one evaluation of a multiple-choice task (N examples of
two choices, ~40 tokens each: lm-eval's log-likelihood ranking, 2N sequences) and of a perplexity task
(N texts of ~60 tokens), against one training step of the tiny run's shape (16 sequences of 64 tokens:
forward, backward, AdamW). Timed alternately, median of the rounds (the machine is shared and noisy).
The fraction of a step interval is cost / (every x step time).

    python benchmarks/bench_eval_tasks.py                # N=100, 5 rounds
    python benchmarks/bench_eval_tasks.py --examples 500 --every 100
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--every", type=int, default=50, help="eval.every, for the fraction of an interval")
    args = parser.parse_args()

    import torch

    from llmtools.model import LlamaForCausalLM, load_model_config
    from llmtools.tokenize import load_tokenizer
    from llmtools.train.downstream import Task, _encode_pair, evaluate_tasks

    torch.manual_seed(0)
    tok = load_tokenizer("byte")
    import dataclasses

    config = dataclasses.replace(load_model_config("tiny"), vocab_size=320)
    model = LlamaForCausalLM(config)
    rng = random.Random(0)
    letters = "abcdefghij klmnopqrstuvwxyz"

    def text(k: int) -> str:
        return "".join(rng.choice(letters) for _ in range(k))

    mc = Task("mc", "multiple_choice")
    for _ in range(args.examples):
        mc.pairs.append([_encode_pair(tok, text(28), text(12)) for _ in range(2)])
        mc.gold.append(0)
        mc.choice_chars.append([12, 12])
    ppl = Task("ppl", "perplexity")
    for _ in range(args.examples):
        ppl.pairs.append([(tok.encode(text(60)), 1)])
        ppl.text_bytes.append(60)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randint(0, 256, (16, 65))

    def train_step() -> None:
        model.train()
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    def evaluate(tasks) -> None:
        model.eval()
        evaluate_tasks(model, tasks, "cpu", 0, 1, batch=8)

    train_step()
    evaluate([mc, ppl])  # warm up
    times: dict[str, list[float]] = {"step": [], "mc": [], "ppl": []}
    for _ in range(args.rounds):
        for name, call in (
            ("step", train_step),
            ("mc", lambda: evaluate([mc])),
            ("ppl", lambda: evaluate([ppl])),
        ):
            started = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - started)
    step = statistics.median(times["step"])
    print(
        f"tiny preset, 1 process, {args.examples} examples per task, median of {args.rounds} (shared machine)"
    )
    print(f"training step (16 x 64 tokens): {1000 * step:.0f} ms")
    for name, label in (("mc", "multiple choice (2 choices)"), ("ppl", "perplexity")):
        cost = statistics.median(times[name])
        print(
            f"{label}: {1000 * cost:.0f} ms = {cost / step:.2f} steps; every {args.every} steps: "
            f"{cost / (args.every * step):.2%} of the interval"
        )


if __name__ == "__main__":
    main()
