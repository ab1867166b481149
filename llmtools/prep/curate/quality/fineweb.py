"""FineWeb's own quality rules (Penedo et al. 2024) as datatrove's `FineWebQualityFilter` applies them:
the share of lines ending in punctuation, of short lines, of characters in repeated lines, and newlines
per word."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from llmtools.prep.curate.quality.gopher_repetition import find_duplicates
from llmtools.prep.curate.quality.params import param
from llmtools.prep.curate.quality.punctuation import TERMINAL_PUNCTUATION
from llmtools.prep.curate.step import Document, Outcome
from llmtools.prep.curate.words import words

MEASURES = {
    "line_punct_ratio": "line_punct_ratio",
    "short_line_ratio": "short_line_ratio",
    "char_dup_ratio": "char_dup_ratio",
    "list_ratio": "list_ratio",
}


@dataclass
class FineWebQuality:
    """Drops documents whose lines rarely end a sentence, are mostly short, repeat, or are one word long."""

    name: ClassVar[str] = "fineweb_quality"
    measures: ClassVar[dict[str, str]] = MEASURES

    line_punct_thr: float = param(0.12, "least share of lines ending in terminal punctuation", "float")
    line_punct_exclude_zero: bool = param(False, "keep documents where no line ends so", "bool")
    stop_chars: tuple[str, ...] | None = param(
        None, "the characters that end a line (none: datatrove's terminal punctuation)", "chars?"
    )
    short_line_thr: float = param(0.67, "most share of short lines", "float")
    short_line_length: int = param(30, "characters that make a line short (at most)", "int")
    char_duplicates_ratio: float = param(0.01, "most share of characters in repeated lines", "float")
    new_line_ratio: float = param(0.3, "most newlines per word", "float")

    def __post_init__(self):
        self._stop_chars = tuple(TERMINAL_PUNCTUATION) if self.stop_chars is None else tuple(self.stop_chars)

    def __call__(self, doc: Document) -> Outcome:
        text = doc.text
        values: dict = {}

        def drop(reason: str) -> Outcome:
            return Outcome(drop=f"{self.name}.{reason}", values=values)

        lines = [line for line in text.split("\n") if line.strip() != ""]
        if not lines:
            return drop("empty")
        values["line_punct_ratio"] = ratio = sum(
            1 for line in lines if line.endswith(self._stop_chars)
        ) / len(lines)
        if ratio < self.line_punct_thr and not (ratio == 0 and self.line_punct_exclude_zero):
            return drop("line_punct_ratio")

        values["short_line_ratio"] = ratio = sum(
            1 for line in lines if len(line) <= self.short_line_length
        ) / len(lines)
        if ratio > self.short_line_thr:
            return drop("short_line_ratio")

        values["char_dup_ratio"] = ratio = find_duplicates(lines)[1] / (len(text) - text.count("\n"))
        if ratio > self.char_duplicates_ratio:
            return drop("char_dup_ratio")

        found = words(doc)
        # a text with a line that is not blank has a word; datatrove would divide by zero otherwise
        values["list_ratio"] = ratio = text.count("\n") / len(found) if found else float("inf")
        if ratio > self.new_line_ratio:
            return drop("list_ratio")
        return Outcome(values=values)
