"""``llm-prep sft``'s rendering time against the number of turns of one conversation.

Finding where the assistant turns are renders the conversation prefix by prefix
(``ChatTemplate.assistant_spans``): one rendering per assistant turn, each as long as the conversation so
far, so the work grows with turns squared. This prints the time per conversation and per turn for
growing conversations with the built-in ``chatml`` template; a linear step keeps the time per turn flat.

    .venv/bin/python benchmarks/bench_sft_turns.py [--turns 16,64,256,1024] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time


def conversation(turns: int) -> list[dict]:
    out = []
    for i in range(turns):
        out.append({"role": "user", "content": f"question {i}: what is {i} + {i}?"})
        out.append({"role": "assistant", "content": f"It is {2 * i}."})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", default="16,64,256,1024")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from llmtools.prep.chat_template import load_chat_template

    template = load_chat_template("chatml", time_limit=3600.0)
    print(f"{'turns':>6} {'seconds':>9} {'ms/turn':>8} {'ratio to first ms/turn':>22}")
    first = None
    for turns in (int(t) for t in args.turns.split(",")):
        messages = conversation(turns)
        best = float("inf")
        for _ in range(args.repeat):
            started = time.perf_counter()
            template.assistant_spans(messages)
            best = min(best, time.perf_counter() - started)
        per_turn = best / turns * 1000
        first = first or per_turn
        print(f"{turns:>6} {best:>9.3f} {per_turn:>8.3f} {per_turn / first:>22.1f}")


if __name__ == "__main__":
    main()
