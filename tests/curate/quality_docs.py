"""Documents for the quality rules' equality tests: real text (wiki, web, novels from ../shared/data, when
present) and seeded adversarial documents built to sit on every rule's edges."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

from tests.conftest import SHARED_DATA

WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at which but have an "
    "they you were their one all we can her has there been if more when will would who so no river city "
    "history government university population station season album church company music school building"
).split()
STOP_POOR = "zyx qwv plk mmrt brsk vvk trl spq".split()
UNICODE = [
    "naïve",
    "café",
    "東京",
    "日本語の文章です。",
    "مرحبا",
    "Привет",
    "😀",
    "ﬁne",
    "Ⅻ",
    "½",
    "x²",
    "\u200b",
]
SYMBOLS = [
    "#",
    "##",
    "...",
    "…",
    "—",
    "•",
    "-",
    "!!!",
    "&",
    "%",
    "[1]",
    "[edit]",
    "[citation needed]",
    "{",
    "}",
]
LINE_BREAKS = ["\n", "\n", "\n", "\n\n", "\n\n\n", "\r\n", "\u2028", "\x85", "\x0b", " \n ", "\n  \n"]


def real_texts(limit: int = 400) -> list[str]:
    """Real documents from the shared corpora (empty when the folder is absent)."""
    texts: list[str] = []
    web = SHARED_DATA / "megatron-deepspeed-fixtures" / "openwebtext-1000.reconstructed.jsonl"
    wiki = SHARED_DATA / "wikitext-2" / "valid.jsonl"
    novels = SHARED_DATA / "lambada" / "lambada_test.jsonl"
    for path, take in ((web, limit // 4), (wiki, limit // 40), (novels, limit // 2)):
        if path.exists():
            with open(path, encoding="utf-8") as handle:
                for line, _ in zip(handle, range(take), strict=False):
                    texts.append(json.loads(line)["text"])
    for path in sorted((SHARED_DATA / "c4-samples").glob("c4-sample.*.json.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            texts.extend(json.loads(line)["text"] for line in handle)
    return texts


def _sentence(rng: random.Random, pool: list[str]) -> str:
    words = [rng.choice(pool) for _ in range(rng.randint(1, 25))]
    if rng.random() < 0.15:
        words.insert(rng.randrange(len(words) + 1), rng.choice(UNICODE + SYMBOLS))
    text = " ".join(words)
    return (
        text[:1].upper() + text[1:] + rng.choice([".", ".", ".", "?", "!", "", "...", "…", '"', ":", ". [1]"])
    )


def _odd_line(rng: random.Random, pool: list[str], flavour: int) -> str:
    """A line of one kind of trouble; `flavour` picks the kind."""
    # seeded coin flips choosing what a document holds (no tolerance here)
    makers = [
        lambda: rng.choice(["• ", "- ", "  - ", "-"]) + _sentence(rng, pool),
        lambda: _sentence(rng, pool).rstrip(".!?") + rng.choice(["...", "…", " ...", "... "]),
        lambda: "#" + " #".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))),
        lambda: " ".join(rng.choice(SYMBOLS) for _ in range(rng.randint(1, 8))),
        lambda: " ".join(rng.choice(STOP_POOR) for _ in range(rng.randint(3, 12))) + ".",
        lambda: rng.choice(["Home", "Login", "Menu", "Share this:", "Next »", "Copyright 2020", "Tags", "x"]),
        lambda: rng.choice(["a", "I", "x"]) + " " + "w" * rng.choice([1, 2, 11, 30, 1001]) + " end.",
        lambda: " ".join(["very"] * rng.randint(2, 40)) + ".",
        lambda: "The cat sat on the mat and the dog sat on the log. " * rng.randint(1, 6),
        lambda: (
            " ".join(rng.choice(UNICODE) for _ in range(rng.randint(1, 8))) + rng.choice(["。", ".", "!", ""])
        ),
        lambda: (
            _sentence(rng, pool).rstrip(".")
            + rng.choice(["[1].", " [edit]", "[citation needed].", "[23]", "[]."])
        ),
        lambda: rng.choice(
            ["This site uses cookies.", "Read our Privacy Policy and Terms of Use.", "We use cookies here."]
        ),
        lambda: "Please enable JavaScript in your browser to view this page.",
        lambda: "" if rng.random() < 0.7 else " " * rng.randint(1, 6) + "\t",
        lambda: rng.choice(
            ["Lorem ipsum dolor sit amet, consectetur elit.", "var x = {a: 1}; f();", "IS_ALPHA is odd."]
        ),
        lambda: rng.choice(["1. 2. 3. 4. 5.", "Yes! No? Maybe. Sure.", "Dr. Smith went home. He slept."]),
    ]
    return makers[flavour % len(makers)]()


def adversarial(count: int, seed: int = 0, sentences: list[str] | None = None) -> list[str]:
    """Seeded documents on the edges of every rule: bullets, ellipses, repeated lines and paragraphs,
    repeated n-grams, symbols, few stop words, lorem ipsum, '{', javascript, citations, policy lines,
    unicode and odd line breaks, empty lines, whitespace runs, very short and very long words. Each
    document mixes clean lines with one kind of trouble in a random share, so documents fall on both
    sides of each threshold."""
    rng = random.Random(seed)
    pool = list(WORDS)
    sentences = sentences or []
    docs = []
    for _ in range(count):
        flavour = rng.randrange(16)
        # seeded coin flips choosing what a document holds (no tolerance here)
        share = rng.random() ** 2 if rng.random() < 0.5 else rng.random()
        lines = []
        for _ in range(rng.randint(0, 30)):
            if rng.random() < share:
                # seeded coin flips choosing what a document holds (no tolerance here)
                lines.append(_odd_line(rng, pool, flavour if rng.random() < 0.9 else rng.randrange(16)))
            elif sentences and rng.random() < 0.6:
                lines.append(rng.choice(sentences))
            else:
                lines.append(" ".join(_sentence(rng, pool) for _ in range(rng.randint(1, 3))))
        if lines and rng.random() < 0.25:
            # repeated lines and paragraphs
            lines += rng.sample(lines, k=min(len(lines), rng.randint(1, 6)))
            rng.shuffle(lines)
        # seeded coin flips choosing what a document holds (no tolerance here)
        breaks = LINE_BREAKS if rng.random() < 0.3 else ["\n", "\n", "\n\n"]
        text = "".join(line + rng.choice(breaks) for line in lines)
        if rng.random() < 0.5:
            text = text.strip()
        if rng.random() < 0.05:
            text = (text + "\n\n") * rng.randint(2, 4)
        docs.append(text)
    docs += ["", " ", "\n", "\n\n\n", "word", "#", "...", "a\nb", "Lorem ipsum.", "{"]
    return docs


def sentences_of(texts: list[str]) -> list[str]:
    """Lines of real text to mix into generated documents."""
    out = []
    for text in texts:
        out.extend(line.strip() for line in text.splitlines() if len(line.split()) > 3)
    return out[:5000]


def corpus(generated: int = 300, real: int = 40, seed: int = 0) -> list[str]:
    texts = real_texts(real)
    return texts + adversarial(generated, seed, sentences_of(texts))


def write_jsonl(path: Path, texts: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for number, text in enumerate(texts):
            handle.write(json.dumps({"id": str(number), "text": text}, ensure_ascii=False) + "\n")


def settle_datatrove() -> None:
    """Bring datatrove's tokenizer to its steady state: spaCy fails on "IS_ALPHA" in every memory zone
    after the first that met it, and datatrove then splits the text without it, as we always do."""
    from datatrove.utils.text import split_into_words

    split_into_words("IS_ALPHA")
