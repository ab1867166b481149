"""C4's bad-words rule as datatrove's `C4BadWordsFilter` applies it, with the list read from a local file
the user names (one word or phrase a line, e.g. a copy of the LDNOOBW list); nothing is downloaded."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from llmtools.errors import InputError, UsageError
from llmtools.prep.curate.quality.params import param
from llmtools.prep.curate.step import Document, Outcome

MAX_LIST_BYTES = 16 << 20
# datatrove takes these out of every list: common pieces of words in languages written without spaces
_ALLOWLIST = ({"sm", "グロ", "女の子"}, {"性"})
_UNSPACED = ("ja", "th", "zh")


def read_badwords(path: str) -> list[str]:
    """The entries of a bad-words list as datatrove reads one (text mode: lines end at \\n, \\r or \\r\\n;
    each stripped). A blank line is an empty entry, which matches nearly any document, as in datatrove."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_LIST_BYTES + 1)
    except OSError as exc:
        raise InputError(f"{path}: cannot read the bad-words list ({exc.strerror or exc})") from None
    if len(data) > MAX_LIST_BYTES:
        raise InputError(f"{path}: the bad-words list is over {MAX_LIST_BYTES >> 20} MiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(f"{path}:{line}: the bad-words list is not UTF-8") from None
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.strip() for line in lines]


def badwords_pattern(entries: list[str], language: str) -> re.Pattern:
    badwords = set(entries)
    for allowed in _ALLOWLIST:
        badwords -= allowed
    # sorted: a found document names the same word on every run
    alternatives = "|".join(re.escape(word) for word in sorted(badwords))
    if language in _UNSPACED:
        return re.compile(alternatives)
    return re.compile(rf"(?:\W|^)({alternatives})(?:\W|$)")


@dataclass
class C4BadWords:
    """Drops documents holding an entry of a local bad-words list (C4's rule), or keeps a share at random.

    An entry matches between non-word characters, except in Japanese, Thai and Chinese."""

    name: ClassVar[str] = "c4_badwords"
    measures: ClassVar[dict[str, str]] = {"document_removed_with_badwords": "badword"}

    badwords_file: str | None = param(
        None, "the local list, one entry a line (required by this rule)", "path?"
    )
    language: str = param("en", "the list's language (ja, th, zh: matched without word boundaries)", "str")
    default_language: str = param("en", "language of documents whose metadata names none", "str")
    keep_fraction: float = param(
        0.0, "share of documents with a bad word kept anyway, drawn at random", "float"
    )
    seed: int | None = param(None, "seed of that draw (none: a fresh one each run)", "int?")

    def __post_init__(self):
        if not self.badwords_file:
            raise UsageError(
                f"{self.name}.badwords_file: name a local bad-words list (nothing is downloaded)"
            )
        self._pattern = badwords_pattern(read_badwords(self.badwords_file), self.language)
        self._uniform = None

    def _draw(self) -> float:
        if self._uniform is None:
            from numpy.random import default_rng

            self._uniform = default_rng(self.seed).uniform
        return self._uniform()

    def __call__(self, doc: Document) -> Outcome:
        language = doc.meta.get("language", self.default_language)
        if language != self.language:
            return Outcome(values={"badwords_language_missing": language})
        found = self._pattern.search(doc.text.lower())
        if found is None:
            return Outcome()
        values = {"badword": found.group(1) if found.groups() else found.group(0)}
        if self.keep_fraction > 0.0 and self._draw() < self.keep_fraction:
            return Outcome(values=values)
        return Outcome(drop=f"{self.name}.document_removed_with_badwords", values=values)
