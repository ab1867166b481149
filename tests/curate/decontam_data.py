"""Generated evaluation tasks (task files in a folder) and training documents with evaluation text planted
in them the ways lm-eval's normalisation does and does not see through."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = (
    "the of and to in is was for on that with as by at from his her an were are which this be or had not "
    "river stone market Paris theorem algebra café naïve Élan élan straße Ärger über 東京 数学 мост река "
    "don't U.S.A. e-mail x=y+1 #tag @user 42 3.14 (parens) [list] {set} end. yes! why? semi;colon"
).split()


def sentence(rng: random.Random, count: int) -> list[str]:
    return [rng.choice(WORDS) for _ in range(count)]


def write_tasks(folder: Path, rng: random.Random) -> dict[str, list[str]]:
    """A task folder (one perplexity and one multiple-choice task file); returns each task's texts as
    lm-eval's Janitor is handed them."""
    folder.mkdir(parents=True, exist_ok=True)
    ppl = [" ".join(sentence(rng, rng.randint(15, 60))) for _ in range(12)]
    ppl.append("Short eval line.")  # fewer words than n: no n-gram
    mc = []
    for _ in range(10):
        context = " ".join(sentence(rng, rng.randint(10, 40))) + " Answer:"
        choices = [" " + " ".join(sentence(rng, rng.randint(1, 6))) for _ in range(4)]
        mc.append({"context": context, "choices": choices, "gold": rng.randrange(4)})
    (folder / "wiki_ppl.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in ppl), encoding="utf-8"
    )
    (folder / "quiz_mc.jsonl").write_text("".join(json.dumps(x) + "\n" for x in mc), encoding="utf-8")
    return {
        "wiki_ppl": ppl,
        "quiz_mc": [t for x in mc for t in (x["context"], x["context"] + x["choices"][x["gold"]])],
    }


def disguise(words: list[str], rng: random.Random) -> str:
    """The same words as lm-eval's normalisation sees them, written differently: other whitespace (line
    breaks, tabs, no-break and ideographic spaces), ASCII case changes, punctuation added inside words."""
    out = []
    for word in words:
        roll = rng.random()
        if roll < 0.2:
            word = word.upper() if word.isascii() else word
        elif roll < 0.3 and len(word) > 1:
            cut = rng.randrange(1, len(word))
            word = word[:cut] + rng.choice("-,.'!?") + word[cut:]
        elif roll < 0.35:
            word = "(" + word + ")."
        out.append(word)
    text = out[0] if out else ""
    for word in out[1:]:
        text += rng.choice([" ", " ", " ", "\n", "\t", "  ", "\u00a0", "\u3000", " \n\n "]) + word
    return text


def plant(text: str, rng: random.Random, n: int) -> tuple[str, str]:
    """A piece of ``text`` (an evaluation text) planted into training text, and how it was planted."""
    words = text.split()
    kind = rng.choice(["whole", "exact_n", "near_miss", "disguised", "dash_break", "unicode_case", "long"])
    if kind == "whole" or len(words) < n + 1:
        return text, "whole"
    start = rng.randrange(0, len(words) - n + 1)
    if kind == "exact_n":
        return " ".join(words[start : start + n]), kind
    if kind == "near_miss":  # n - 1 words: never an n-gram
        return " ".join(words[start : start + n - 1]), kind
    if kind == "disguised":
        return disguise(words[start : start + n + rng.randint(0, 5)], rng), kind
    if kind == "dash_break":  # a word of punctuation alone inside: lm-eval's n-grams break there
        piece = words[start : start + n]
        piece.insert(n // 2, "--")
        return " ".join(piece), kind
    if kind == "unicode_case":  # only ASCII letters are lowered: É is not é
        return " ".join(w.upper() for w in words[start : start + n]), kind
    return " ".join(words[start:]), kind


def training_documents(evals: list[str], rng: random.Random, n: int, count: int) -> list[str]:
    docs = []
    for number in range(count):
        parts = [" ".join(sentence(rng, rng.randint(0, 120)))]
        if number % 3 != 2:
            for _ in range(rng.choice([1, 1, 1, 2, 3, 12])):
                parts.append(plant(rng.choice(evals), rng, n)[0])
                parts.append(" ".join(sentence(rng, rng.randint(0, 80))))
        glue = rng.choice([" ", "\n", "\n\n", ". "])
        docs.append(glue.join(p for p in parts if p) or "empty")
    return docs
