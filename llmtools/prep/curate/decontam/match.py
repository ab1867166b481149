"""One training document against the index: which of its n-grams are evaluation n-grams, and what is left
of it once they are cut out the way lm-eval's ``Janitor.clean`` cuts them."""

from __future__ import annotations

from dataclasses import dataclass

from .index import NgramIndex
from .ngrams import Hasher, train_words, word_spans


@dataclass(frozen=True)
class Hit:
    word: int  # the position of the n-gram's first word among the document's words
    tasks: tuple[int, ...]  # ids of the tasks holding it
    ngram: str  # normalised, words joined by one space


@dataclass(frozen=True)
class CutRules:
    """lm-eval's ``Janitor`` parameters, with its defaults."""

    window: int = 200  # characters removed on each side of a contaminated n-gram (window_to_remove)
    min_chunk: int = 200  # a kept piece must be longer than this many characters (minimum_slice_length)
    too_dirty: int = 10  # a document with more contaminated n-grams than this is dropped (too_dirty_cutoff)


class Matcher:
    def __init__(self, index: NgramIndex) -> None:
        self.index = index
        self.n = index.n
        self.hasher = Hasher(index.n)

    def hits(self, text: str) -> list[Hit]:
        """Every n-gram of ``text`` that an evaluation set holds, in document order (one per occurrence)."""
        words = train_words(text)
        keys = self.hasher.keys(words)
        found = self.index.candidates(keys)
        if not len(found):
            return []
        valid = self.hasher.valid(words)
        hits = []
        for position in found.tolist():
            if not valid[position]:
                continue
            ngram = " ".join(words[position : position + self.n])
            tasks = self.index.tasks_of(int(keys[position]), ngram)
            if tasks:
                hits.append(Hit(position, tuple(tasks), ngram))
        return hits

    def spans(self, text: str, hits: list[Hit]) -> list[tuple[int, int]]:
        """Each hit's characters in ``text``: (first, last), both inclusive, as lm-eval reports them."""
        words = word_spans(text)
        return [(words[h.word][0], words[h.word + self.n - 1][1]) for h in hits]


def cut(text: str, spans: list[tuple[int, int]], rules: CutRules) -> list[str] | None:
    """The pieces of ``text`` lm-eval's ``Janitor._split_chunks`` keeps around the contaminated ``spans``
    (in document order), or None when the document is too dirty. Its arithmetic, kept exactly: a piece
    before a span ends ``window`` characters before it and is kept only when longer than ``min_chunk``;
    the next piece starts ``window`` characters after the span; the last piece starts one character
    further still (lm-eval slices ``[end + 1:]`` there) and is kept when it starts more than
    ``min_chunk`` characters before the end."""
    pieces: list[str] = []
    resume, end = 0, -1
    for count, (first, last) in enumerate(spans):
        if count >= rules.too_dirty:
            return None
        start = max(0, first - rules.window)
        end = min(len(text), last + rules.window)
        if start - resume > rules.min_chunk:
            pieces.append(text[resume:start])
        resume = end
    if end < len(text) - rules.min_chunk:
        pieces.append(text[end + 1 :])
    return pieces
