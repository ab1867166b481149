"""A corpus with planted near duplicates at known Jaccard similarities, for the dedup tests.

Each planted pair is a document of random words and a copy whose last k words are replaced by fresh
ones: with M = words - n + 1 shingles, the pair shares M - k of them and each has k of its own, so its
Jaccard similarity is (M - k) / (M + k); k is chosen for the target, and the realised value is
returned. Real text (../shared/data) is mixed in, with exact copies of some of it (whitespace changed)
and a few short texts repeated (too short for a shingle: only exact dedup can see them)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from tests.conftest import shared

SIMILARITIES = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))


def planted_pairs(rng: random.Random, per_similarity: int, words: int = 120, n: int = 5):
    """[(similarity bucket, realised Jaccard, text a, text b)]."""
    shingles = words - n + 1
    out = []
    for s in SIMILARITIES:
        k = max(1, round(shingles * (1 - s) / (1 + s)))
        for _ in range(per_similarity):
            a = [_word(rng) for _ in range(words)]
            b = a[: words - k] + [_word(rng) for _ in range(k)]
            out.append((s, (shingles - k) / (shingles + k), " ".join(a), " ".join(b)))
    return out


def write_corpus(folder: Path, files: int = 3, per_similarity: int = 40, seed: int = 0) -> dict:
    """JSONL files 00000.jsonl ... with an "id" per document; returns what was planted."""
    rng = random.Random(seed)
    docs: list[dict] = []
    pairs = planted_pairs(rng, per_similarity)
    planted = []
    for i, (s, jaccard, a, b) in enumerate(pairs):
        planted.append({"similarity": s, "jaccard": jaccard, "a": f"p{i}a", "b": f"p{i}b"})
        docs += [{"id": f"p{i}a", "text": a}, {"id": f"p{i}b", "text": b}]
    real = [
        json.loads(x)["text"] for x in shared("lambada/lambada_test.jsonl").read_text().splitlines()[:300]
    ]
    real += [
        json.loads(x)["text"] for x in shared("tinyshakespeare/input.jsonl").read_text().splitlines()[:200]
    ]
    docs += [{"id": f"r{i}", "text": t} for i, t in enumerate(real)]
    exact = []
    for i in range(0, 60, 3):  # copies with other whitespace: exact duplicates after normalisation
        docs.append({"id": f"x{i}", "text": "  " + real[i].replace(" ", "\n ", 2) + "\n"})
        exact.append((f"r{i}", f"x{i}"))
    for i in range(4):  # short texts, each three times
        docs += [{"id": f"s{i}_{c}", "text": f"tiny text {i}"} for c in range(3)]
    rng.shuffle(docs)
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        part = docs[f::files]
        (folder / f"{f:05d}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in part), encoding="utf-8")
    return {"planted": planted, "exact": exact, "short": [f"s{i}_{c}" for i in range(4) for c in range(3)]}
