"""Gopher's repetition rules (Rae et al. 2021, table A1) as datatrove's `GopherRepetitionFilter` applies
them: duplicated paragraphs and lines (by count and by characters), the most frequent 2-4-grams and the
characters inside repeated 5-10-grams, measured on the same words as datatrove's."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from itertools import accumulate
from typing import ClassVar

from llmtools.prep.curate.quality.params import param
from llmtools.prep.curate.step import Document, Outcome
from llmtools.prep.curate.words import words

_PARAGRAPH_BREAK = re.compile(r"\n{2,}")
_LINE_BREAK = re.compile("\n+")


def find_duplicates(items: list[str]) -> tuple[int, int]:
    """How many items repeat an earlier one, and their characters."""
    seen: set[str] = set()
    count = chars = 0
    for item in items:
        if item in seen:
            count += 1
            chars += len(item)
        else:
            seen.add(item)
    return count, chars


def top_ngram_chars(found: list[str], n: int) -> int | None:
    """Characters of the most frequent n-gram (words joined by spaces) times its count; the first seen
    wins a tie, as in `Counter.most_common`. None when the text has fewer than n words."""
    if len(found) < n:
        return None
    spaced = " ".join(found)
    starts = [0, *accumulate(len(word) + 1 for word in found)]
    grams = Counter(spaced[starts[i] : starts[i + n] - 1] for i in range(len(found) - n + 1))
    gram, count = grams.most_common(1)[0]
    return len(gram) * count


def repeated_ngram_chars(found: list[str], n: int) -> int:
    """Characters of n-grams (words joined with nothing between) that repeat an earlier one, skipping
    past each repeat, as datatrove's `find_all_duplicate` walks."""
    joined = "".join(found)
    ends = [0, *accumulate(map(len, found))]
    seen: set[str] = set()
    repeated = idx = 0
    last = len(found) - n + 1
    while idx < last:
        gram = joined[ends[idx] : ends[idx + n]]
        if gram in seen:
            repeated += len(gram)
            idx += n
        else:
            seen.add(gram)
            idx += 1
    return repeated


@dataclass
class GopherRepetition:
    """Drops documents made of repeated paragraphs, lines or n-grams."""

    name: ClassVar[str] = "gopher_repetition"

    dup_line_frac: float | None = param(0.3, "most share of lines that repeat an earlier line", "float?")
    dup_para_frac: float | None = param(0.3, "most share of paragraphs that repeat an earlier one", "float?")
    dup_line_char_frac: float | None = param(0.2, "most share of characters in repeated lines", "float?")
    dup_para_char_frac: float | None = param(0.2, "most share of characters in repeated paragraphs", "float?")
    top_n_grams: tuple[tuple[int, float], ...] = param(
        ((2, 0.2), (3, 0.18), (4, 0.16)),
        "N:MOST share of characters in the most frequent N-gram, for each N",
        "pairs",
    )
    dup_n_grams: tuple[tuple[int, float], ...] = param(
        ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10)),
        "N:MOST share of characters in repeated N-grams, for each N",
        "pairs",
    )

    @property
    def measures(self) -> dict[str, str]:
        """reason -> the measured value that decided it (the same name)."""
        reasons = ["dup_para_frac", "dup_para_char_frac", "dup_line_frac", "dup_line_char_frac"]
        reasons += [f"top_{n}_gram" for n, _ in self.top_n_grams]
        reasons += [f"duplicated_{n}_n_grams" for n, _ in self.dup_n_grams]
        return {reason: reason for reason in reasons}

    def __call__(self, doc: Document) -> Outcome:
        text = doc.text
        values: dict = {}

        def drop(reason: str) -> Outcome:
            return Outcome(drop=f"{self.name}.{reason}", values=values)

        if not text:
            return drop("empty")
        size = len(text)

        paragraphs = _PARAGRAPH_BREAK.split(text.strip())
        count, chars = find_duplicates(paragraphs)
        values["dup_para_frac"] = ratio = count / len(paragraphs)
        if self.dup_para_frac and ratio > self.dup_para_frac:
            return drop("dup_para_frac")
        values["dup_para_char_frac"] = ratio = chars / size
        if self.dup_para_char_frac and ratio > self.dup_para_char_frac:
            return drop("dup_para_char_frac")

        lines = _LINE_BREAK.split(text)
        count, chars = find_duplicates(lines)
        values["dup_line_frac"] = ratio = count / len(lines)
        if self.dup_line_frac and ratio > self.dup_line_frac:
            return drop("dup_line_frac")
        values["dup_line_char_frac"] = ratio = chars / size
        if self.dup_line_char_frac and ratio > self.dup_line_char_frac:
            return drop("dup_line_char_frac")

        found = words(doc)
        for n, most in self.top_n_grams:
            top = top_ngram_chars(found, n)
            if top is None:
                continue
            values[f"top_{n}_gram"] = ratio = top / size
            if ratio > most:
                return drop(f"top_{n}_gram")

        for n, most in self.dup_n_grams:
            values[f"duplicated_{n}_n_grams"] = ratio = repeated_ngram_chars(found, n) / size
            if ratio > most:
                return drop(f"duplicated_{n}_n_grams")
        return Outcome(values=values)
