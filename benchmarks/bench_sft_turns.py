"""``llm-prep sft``'s rendering time against the number of turns of one conversation.

Finding where the assistant turns are (``ChatTemplate.assistant_spans``) prefix by prefix renders the
conversation three times per assistant turn, each as long as the conversation so far: the work grows
with turns squared. The bounded way (the default) renders it a fixed number of times. This prints, in
one run, the time per conversation and per turn of both for growing conversations with the built-in
``chatml`` template, and checks that they find the same spans; a linear step keeps the time per turn flat.

    .venv/bin/python benchmarks/bench_sft_turns.py [--turns 16,64,256,512] [--repeat 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import time


def conversation(turns: int) -> list[dict]:
    out = []
    for i in range(turns):
        out.append({"role": "user", "content": f"question {i}: what is {i} + {i}?"})
        out.append({"role": "assistant", "content": f"It is {2 * i}."})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", default="16,64,256,512")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from llmtools.prep.chat_template import load_chat_template

    linear = load_chat_template("chatml", time_limit=3600.0)
    incremental = dataclasses.replace(linear, linear=False)
    print(
        f"{'turns':>6} {'prefix s':>9} {'ms/turn':>8} {'bounded s':>10} {'ms/turn':>8} "
        f"{'per-turn growth (prefix/bounded)':>33} {'speed-up':>9}"
    )
    first = {}
    for turns in (int(t) for t in args.turns.split(",")):
        messages = conversation(turns)
        best, spans = {}, {}
        for name, template in (("prefix", incremental), ("bounded", linear)):
            best[name] = float("inf")
            for _ in range(args.repeat):
                started = time.perf_counter()
                spans[name] = template.assistant_spans(messages)
                best[name] = min(best[name], time.perf_counter() - started)
        if spans["prefix"] != spans["bounded"]:
            raise SystemExit(f"{turns} turns: the two ways found different spans")
        per_turn = {name: seconds / turns * 1000 for name, seconds in best.items()}
        for name in per_turn:
            first.setdefault(name, per_turn[name])
        growth = "/".join(f"{per_turn[n] / first[n]:.1f}" for n in ("prefix", "bounded"))
        print(
            f"{turns:>6} {best['prefix']:>9.3f} {per_turn['prefix']:>8.3f} {best['bounded']:>10.3f} "
            f"{per_turn['bounded']:>8.3f} {growth:>33} {best['prefix'] / best['bounded']:>8.1f}x"
        )


if __name__ == "__main__":
    main()
