"""Gopher's quality rules (Rae et al. 2021, appendix A1) as datatrove's `GopherQualityFilter` applies
them: the same tests in the same order, the same thresholds, the same reasons, on the same words."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from llmtools.prep.curate.quality.params import param
from llmtools.prep.curate.quality.punctuation import PUNCTUATION_SET
from llmtools.prep.curate.step import Document, Outcome
from llmtools.prep.curate.words import words

STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")

# reason -> the measured value that decided it
MEASURES = {
    "gopher_short_doc": "non_symbol_words",
    "gopher_long_doc": "non_symbol_words",
    "gopher_below_avg_threshold": "avg_word_length",
    "gopher_above_avg_threshold": "avg_word_length",
    "gopher_too_many_hashes": "hash_word_ratio",
    "gopher_too_many_ellipsis": "ellipsis_word_ratio",
    "gopher_too_many_bullets": "bullet_lines_ratio",
    "gopher_too_many_end_ellipsis": "ellipsis_lines_ratio",
    "gopher_below_alpha_threshold": "alpha_words_ratio",
    "gopher_enough_stop_words": "stop_words",
}


def _has_alpha(word: str) -> bool:
    return any(map(str.isalpha, word))


@dataclass
class GopherQuality:
    """Drops documents too short or long, of odd word lengths, symbols, bullets, ellipses or few stop words.

    Words are datatrove's (spaCy's English tokenizer); lines are `str.splitlines`."""

    name: ClassVar[str] = "gopher_quality"
    measures: ClassVar[dict[str, str]] = MEASURES

    min_doc_words: int | None = param(50, "fewest words (not counting words of punctuation only)", "int?")
    max_doc_words: int | None = param(100000, "most words (not counting words of punctuation only)", "int?")
    min_avg_word_length: int | None = param(3, "lowest mean length of those words", "int?")
    max_avg_word_length: int | None = param(10, "highest mean length of those words", "int?")
    max_symbol_word_ratio: float | None = param(
        0.1, "most '#', and most '...'/'…', per word (each tested alone)", "float?"
    )
    max_bullet_lines_ratio: float | None = param(
        0.9, "most share of lines starting with '•' or '-'", "float?"
    )
    max_ellipsis_lines_ratio: float | None = param(
        0.3, "most share of lines ending with '...' or '…'", "float?"
    )
    max_non_alpha_words_ratio: float | None = param(
        0.8, "LEAST share of words holding a letter (datatrove's name kept)", "float?"
    )
    min_stop_words: int | None = param(2, "fewest distinct stop words present", "int?")
    stop_words: tuple[str, ...] = param(STOP_WORDS, "the stop words (comma-separated)", "words")

    def __post_init__(self):
        self._stop_words = frozenset(self.stop_words)

    def __call__(self, doc: Document) -> Outcome:
        text = doc.text
        found = words(doc)
        n_words = len(found)
        lengths = [len(word) for word in found if not PUNCTUATION_SET.issuperset(word)]
        n_non_symbol = len(lengths)
        values: dict = {"non_symbol_words": n_non_symbol}

        def drop(reason: str) -> Outcome:
            return Outcome(drop=f"{self.name}.{reason}", values=values)

        if self.min_doc_words and n_non_symbol < self.min_doc_words:
            return drop("gopher_short_doc")
        if self.max_doc_words and n_non_symbol > self.max_doc_words:
            return drop("gopher_long_doc")

        # numpy's mean of no lengths is NaN, which no threshold test passes
        avg = sum(lengths) / n_non_symbol if n_non_symbol else float("nan")
        values["avg_word_length"] = avg
        if self.min_avg_word_length and avg < self.min_avg_word_length:
            return drop("gopher_below_avg_threshold")
        if self.max_avg_word_length and avg > self.max_avg_word_length:
            return drop("gopher_above_avg_threshold")

        # with no words at all datatrove divides by zero; the ratio rules then have nothing to measure
        if self.max_symbol_word_ratio and n_words:
            values["hash_word_ratio"] = ratio = text.count("#") / n_words
            if ratio > self.max_symbol_word_ratio:
                return drop("gopher_too_many_hashes")
            values["ellipsis_word_ratio"] = ratio = (text.count("...") + text.count("…")) / n_words
            if ratio > self.max_symbol_word_ratio:
                return drop("gopher_too_many_ellipsis")

        lines = text.splitlines()
        if self.max_bullet_lines_ratio and lines:
            bullets = sum(line.lstrip().startswith(("•", "-")) for line in lines)
            values["bullet_lines_ratio"] = ratio = bullets / len(lines)
            if ratio > self.max_bullet_lines_ratio:
                return drop("gopher_too_many_bullets")
        if self.max_ellipsis_lines_ratio and lines:
            ending = sum(line.rstrip().endswith(("...", "…")) for line in lines)
            values["ellipsis_lines_ratio"] = ratio = ending / len(lines)
            if ratio > self.max_ellipsis_lines_ratio:
                return drop("gopher_too_many_end_ellipsis")

        if self.max_non_alpha_words_ratio and n_words:
            values["alpha_words_ratio"] = ratio = sum(map(_has_alpha, found)) / n_words
            if ratio < self.max_non_alpha_words_ratio:
                return drop("gopher_below_alpha_threshold")

        if self.min_stop_words:
            present = set(found)
            values["stop_words"] = count = sum(1 for stop in self._stop_words if stop in present)
            if count < self.min_stop_words:
                return drop("gopher_enough_stop_words")
        return Outcome(values=values)
