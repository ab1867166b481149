"""A built-in, generated sample corpus: deterministic from a seed, with structure a tiny model learns.

Two sources in different styles, so the mixing demo has something to blend:

* ``stories`` — short children's stories from a small grammar. Within a story the same name, pet,
  colour and place recur, so a model can learn to copy them forward; sentence shapes repeat.
* ``arith``   — lines of small-number arithmetic and counting (``7 + 5 = 12``, ``3, 4, 5, 6``):
  exact, checkable patterns whose loss falls fast.

The text depends only on (style, seed, document number): the same call gives the same bytes on any
machine and Python version (no ``hash()``, only ``random.Random`` seeded from sha256).
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

from llmtools.errors import UsageError
from llmtools.formats import jsonfile
from llmtools.prep.dataset_output import DatasetOutput

STYLES = ("stories", "arith")

NAMES = {
    "Mia": "She",
    "Tom": "He",
    "Lily": "She",
    "Ben": "He",
    "Sara": "She",
    "Max": "He",
    "Anna": "She",
    "Leo": "He",
    "Zoe": "She",
    "Sam": "He",
    "Nina": "She",
    "Jack": "He",
    "Ella": "She",
    "Finn": "He",
}
PETS = ["dog", "cat", "bird", "fish", "rabbit", "frog", "turtle", "pony"]
COLORS = ["red", "blue", "green", "yellow", "purple", "orange", "pink", "white"]
THINGS = ["ball", "kite", "hat", "box", "book", "boat", "cup", "drum"]
PLACES = ["park", "garden", "forest", "beach", "lake", "farm", "hill", "town"]
FEELINGS = ["happy", "sad", "scared", "proud", "tired", "excited", "surprised", "calm"]
WEATHER = ["sunny", "rainy", "windy", "cold", "warm", "snowy"]


def _rng(style: str, seed: int, index: int) -> random.Random:
    digest = hashlib.sha256(f"llmtools-sample-corpus/{style}/{seed}/{index}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


def story(rng: random.Random) -> str:
    name, friend = rng.sample(sorted(NAMES), 2)
    pet, color, thing, place = rng.choice(PETS), rng.choice(COLORS), rng.choice(THINGS), rng.choice(PLACES)
    feeling, end_feeling, weather = (
        rng.choice(FEELINGS),
        rng.choice(["happy", "proud", "calm"]),
        rng.choice(WEATHER),
    )
    they = NAMES[name]  # the pronoun agrees with the name: one more thing to learn
    lines = [
        f"Once upon a time, there was a child named {name}.",
        f"{name} had a {color} {thing} and a little {pet}.",
        f"It was a {weather} day, so {name} went to the {place} with the {pet}.",
    ]
    middle = [
        f"At the {place}, {name} played with the {color} {thing}.",
        f"The {pet} ran around and {name} laughed.",
        f'Then {name} met {friend}. {friend} said, "I like your {color} {thing}!"',
        f"{name} felt {feeling} when the {thing} rolled away.",
        f"{friend} helped {name} look for the {color} {thing} near the {place}.",
        f"They found the {thing} under a big tree.",
    ]
    rng.shuffle(middle)
    lines += middle[: rng.randint(3, len(middle))]
    lines += [f"{they} thanked {friend}. {name} and the {pet} went home {end_feeling}.", "The end."]
    return " ".join(lines)


def arith(rng: random.Random) -> str:
    out = []
    for _ in range(rng.randint(6, 14)):
        kind = rng.random()
        if kind < 0.4:
            a, b = rng.randint(0, 50), rng.randint(0, 50)
            out.append(f"{a} + {b} = {a + b}")
        elif kind < 0.7:
            a, b = rng.randint(0, 99), rng.randint(0, 50)
            a, b = max(a, b), min(a, b)
            out.append(f"{a} - {b} = {a - b}")
        elif kind < 0.85:
            a, b = rng.randint(0, 12), rng.randint(0, 12)
            out.append(f"{a} * {b} = {a * b}")
        else:
            start, step = rng.randint(0, 40), rng.randint(1, 5)
            out.append(", ".join(str(start + step * k) for k in range(rng.randint(4, 8))))
    return "\n".join(out) + "\n"


GENERATORS = {"stories": story, "arith": arith}


def generate(style: str, docs: int, seed: int = 1234) -> Iterator[str]:
    """``docs`` texts of ``style``, deterministic from ``seed``."""
    if style not in GENERATORS:
        raise UsageError(f"--style: unknown style {style!r} (choose from {', '.join(STYLES)})")
    make = GENERATORS[style]
    for i in range(docs):
        yield make(_rng(style, seed, i))


def write_sample_corpus(
    output_dir: str | os.PathLike,
    docs: int = 2000,
    seed: int = 1234,
    styles: Sequence[str] = STYLES,
    force: bool = False,
) -> list[Path]:
    """Write ``{output_dir}/{style}.jsonl`` (``{"text": ...}`` per line) for each style; returns the paths."""
    if docs < 1:
        raise UsageError(f"--docs: must be at least 1, got {docs}")
    styles = list(dict.fromkeys(styles))
    for style in styles:
        if style not in GENERATORS:
            raise UsageError(f"--style: unknown style {style!r} (choose from {', '.join(STYLES)})")
    with corpus_output(output_dir, styles, docs, seed, force) as output:  # all styles or none
        for style, path in zip(styles, output.files, strict=True):
            with open(output.path(path), "w", encoding="utf-8") as handle:
                for text in generate(style, docs, seed):
                    handle.write(jsonfile.dumps({"text": text}, ensure_ascii=False) + "\n")
        return output.commit()


def corpus_output(
    output_dir: str | os.PathLike,
    styles: Sequence[str] = STYLES,
    docs: int = 2000,
    seed: int = 1234,
    force: bool = False,
) -> DatasetOutput:
    """The files of a sample corpus: ``{output_dir}/{style}.jsonl`` for each style, each marked."""
    return DatasetOutput(
        files={
            Path(output_dir) / f"{style}.jsonl": {
                "kind": "sample-corpus",
                "style": style,
                "docs": docs,
                "seed": seed,
            }
            for style in dict.fromkeys(styles)
        },
        force=force,
    )


def arith_sums_task(examples: int = 100, seed: int = 1234) -> Iterator[dict]:
    """A multiple-choice downstream task built like the ``arith`` corpus: ``"a + b ="`` and four sums
    (the right one and three off by 1 to 10), in the task format of :mod:`llmtools.formats.tasks`."""
    for i in range(examples):
        rng = _rng("arith-sums-task", seed, i)
        a, b = rng.randint(0, 50), rng.randint(0, 50)
        right = a + b
        wrong: set[int] = set()
        while len(wrong) < 3:
            other = right + rng.choice((-1, 1)) * rng.randint(1, 10)
            if other >= 0 and other != right:
                wrong.add(other)
        choices = sorted(wrong | {right}, key=lambda _: rng.random())
        yield {"context": f"{a} + {b} =", "choices": [f" {c}" for c in choices], "gold": choices.index(right)}


def write_arith_task(
    path: str | os.PathLike, examples: int = 100, seed: int = 1234, force: bool = False
) -> Path:
    """Write :func:`arith_sums_task` to ``path`` (JSONL), with its marker."""
    if examples < 1:
        raise UsageError(f"--examples: must be at least 1, got {examples}")
    with arith_task_output(path, examples, seed, force) as output:
        with open(output.path(path), "w", encoding="utf-8") as handle:
            for item in arith_sums_task(examples, seed):
                handle.write(jsonfile.dumps(item) + "\n")
        output.commit()
    return Path(path)


def arith_task_output(
    path: str | os.PathLike, examples: int = 100, seed: int = 1234, force: bool = False
) -> DatasetOutput:
    """The task file of :func:`write_arith_task`, marked."""
    record = {"kind": "sample-task", "task": "arith-sums", "examples": examples, "seed": seed}
    return DatasetOutput(files={Path(path): record}, force=force)
