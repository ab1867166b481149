"""``llm-prep sft``'s rendering time against the number of turns of one conversation.

Finding where the assistant turns are (``ChatTemplate.assistant_spans``) prefix by prefix renders the
conversation three times per assistant turn, each as long as the conversation so far: the work grows
with turns squared. The default way renders it a fixed number of times where it can (generation blocks:
once; contents written verbatim, trimmed, transformed or rewritten: at most 15 times). This prints, for
each template asked for, the time per conversation and per turn of both for growing conversations, and
checks that they find the same spans; a linear step keeps the time per turn flat.

Templates: ``chatml`` (built-in), ``escape`` (ChatML writing the content ``| e``), ``generation``
(ChatML whose assistant content and end-of-turn are a ``{% generation %}`` block), ``rewrite`` (ChatML
that drops the reasoning before ``</think>``, as reasoning models' templates do), ``inspect`` (a header
that prints the content's length: the template's own text depends on a content, so the default way
cannot check it and goes prefix by prefix too).

    .venv/bin/python benchmarks/bench_sft_turns.py [--turns 16,64,256,512] [--repeat 3] [--template all]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.prep.test_chat_template import chatml_writing  # noqa: E402 - the test's own templates

GENERATION = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>\\n' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TEMPLATES = {
    "chatml": None,  # the built-in
    "escape": chatml_writing("message['content'] | e"),
    "generation": GENERATION,
    # reasoning models drop a content's <think> part: rewritten, found between marked neighbours
    "rewrite": chatml_writing("message['content'].split('</think>')[-1].lstrip('\\n')"),
    # the template's own text depends on a content (its length in the header): prefix by prefix
    "inspect": "{% for message in messages %}{{ '<|im_start|>' + message['role'] + ' (' + "
    "(message['content'] | length | string) + ' chars)\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant (' }}{% endif %}",
}


def conversation(turns: int) -> list[dict]:
    out = []
    for i in range(turns):
        out.append({"role": "user", "content": f"question {i}: what is {i} + {i}?"})
        out.append({"role": "assistant", "content": f"<think>{i} & {i}</think>\nIt is <b>{2 * i}</b>."})
    return out


def load(name: str):
    from llmtools.prep.chat_template import ChatTemplate, load_chat_template

    if TEMPLATES[name] is None:
        return load_chat_template(name, time_limit=3600.0)
    return ChatTemplate(name, TEMPLATES[name], {"eos_token": "<|im_end|>"}, time_limit=3600.0)


def table(name: str, turn_counts: list[int], repeat: int) -> None:
    template = load(name)

    def prefix_by_prefix(messages):  # the reference way, whatever the template holds
        full = template.render(messages)
        return template._incremental_spans(messages, full)

    ways = {"prefix": prefix_by_prefix, "default": template.assistant_spans}
    print(f"\n--template {name}")
    print(
        f"{'turns':>6} {'prefix s':>9} {'ms/turn':>8} {'default s':>10} {'ms/turn':>8} "
        f"{'per-turn growth (prefix/default)':>33} {'speed-up':>9}"
    )
    first = {}
    for turns in turn_counts:
        messages = conversation(turns)
        best, spans = {}, {}
        for way, find in ways.items():
            best[way] = float("inf")
            for _ in range(repeat):
                started = time.perf_counter()
                spans[way] = find(messages)
                best[way] = min(best[way], time.perf_counter() - started)
        if spans["prefix"] != spans["default"]:
            raise SystemExit(f"{name}, {turns} turns: the two ways found different spans")
        per_turn = {way: seconds / turns * 1000 for way, seconds in best.items()}
        for way in per_turn:
            first.setdefault(way, per_turn[way])
        growth = "/".join(f"{per_turn[w] / first[w]:.1f}" for w in ways)
        print(
            f"{turns:>6} {best['prefix']:>9.3f} {per_turn['prefix']:>8.3f} {best['default']:>10.3f} "
            f"{per_turn['default']:>8.3f} {growth:>33} {best['prefix'] / best['default']:>8.1f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", default="16,64,256,512")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--template",
        action="append",
        choices=[*TEMPLATES, "all"],
        help="a table for this template (repeatable; default: chatml)",
    )
    args = parser.parse_args()
    names = args.template or ["chatml"]
    if "all" in names:
        names = list(TEMPLATES)
    turn_counts = [int(t) for t in args.turns.split(",")]
    for name in names:
        table(name, turn_counts, args.repeat)


if __name__ == "__main__":
    main()
