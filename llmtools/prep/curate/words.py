"""Words and sentences of a text as datatrove's English word tokenizer splits them: spaCy's rule-based
`blank("en")` pipeline with a sentencizer (no model, nothing downloaded). The quality rules and MinHash see
the same words datatrove's do, so their decisions can be equal; a document is split once, whatever number
of rules read its words (`Document.cache`).

spaCy splits a text at whitespace first and tokenizes each whitespace-free run on its own, so the words of
a text made by joining some of its lines with newlines are those lines' words, in order: a step that drops
lines (C4's) hands the next rule the words of its new text without splitting it again (`set_words`),
whether the command carries the document's cache to its new text or starts a new document."""

from __future__ import annotations

from bisect import bisect_left
from contextlib import contextmanager
from functools import lru_cache

from llmtools.errors import InputError
from llmtools.prep.curate.step import Document

# spaCy's tokenizer refuses text holding this attribute name (after it first met it); datatrove then
# removes it and splits again
_SPACY_POISON = "IS_ALPHA"
_CACHE_KEY = "words"


@lru_cache(maxsize=1)
def _english():
    try:
        import spacy
    except ImportError as exc:
        raise InputError(
            "curation needs spaCy's English word tokenizer: pip install 'llmtools[curate]'"
        ) from exc
    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    return nlp


class _Zone:
    """One spaCy memory zone over many texts. spaCy gives each word type it meets a lexeme (its lexical
    attributes computed in Python); a zone per text, as datatrove opens, builds them again for every
    document, most of the splitting's cost. A zone over a batch builds each once per batch and frees them
    at its end, so memory stays bounded. Zones must not nest: every split here goes through this one."""

    TEXTS = 2000
    CHARS = 16_000_000

    def __init__(self):
        self.context = None
        self.texts = self.chars = 0

    @contextmanager
    def open(self, size: int):
        nlp = _english()
        if self.context is None:
            if nlp.vocab.in_memory_zone:  # a zone someone else opened: work inside it
                yield nlp
                return
            self.context = nlp.memory_zone()
            self.context.__enter__()
        self.texts += 1
        self.chars += size
        try:
            yield nlp
        finally:
            if self.texts >= self.TEXTS or self.chars >= self.CHARS:
                self.close()

    def close(self) -> None:
        context, self.context = self.context, None
        self.texts = self.chars = 0
        if context is not None:
            context.__exit__(None, None, None)


_zone = _Zone()


def spacy_zone(size: int):
    """`with spacy_zone(len(text)) as nlp:` the English pipeline inside the one shared memory zone. Code
    that runs spaCy itself on this pipeline goes through here: a zone of its own would nest in ours."""
    return _zone.open(size)


def _stripped(pieces) -> list[str]:
    return [piece.strip() for piece in pieces if piece.strip()]


def _parse(text: str, sentences: bool):
    """spaCy's doc of `text` and whether the poison string was taken out first (offsets then shift).

    datatrove tries the text as it is and, when spaCy fails, again without the poison. spaCy fails on it
    in every memory zone after the first that met it, so in datatrove only the first such text of a
    process keeps the word; here it never does, whatever came before (docs/curation.md)."""
    nlp = _english()
    changed = _SPACY_POISON in text
    if changed:
        text = text.replace(_SPACY_POISON, "")
    nlp.max_length = len(text) + 10
    return (nlp(text) if sentences else nlp.make_doc(text)), changed


def split_words(text: str) -> list[str]:
    """The words of `text`, stripped, empty ones left out (datatrove's `word_tokenize` for English)."""
    with _zone.open(len(text)):
        return _stripped(token.text for token in _parse(text, sentences=False)[0])


def _split_words_at(text: str) -> tuple[list[str], list[int] | None]:
    """The words of `text` and where each starts (None when spaCy saw a changed text). A token is either
    all whitespace (stripping empties it) or holds none (spaCy cuts text at whitespace first), so the
    words are the tokens that are not whitespace, sliced from the text by spaCy's offsets and lengths
    (no Python object per token: the same words `split_words` makes, a test checks, in less time)."""
    from spacy.attrs import IDX, IS_SPACE, LENGTH

    with _zone.open(len(text)):
        parsed, changed = _parse(text, sentences=False)
        if len(parsed) == 0:
            return [], None if changed else []
        table = parsed.to_array([IDX, LENGTH, IS_SPACE])
    seen = text.replace(_SPACY_POISON, "") if changed else text
    table = table[table[:, 2] == 0]
    starts = table[:, 0].tolist()
    found = [seen[a:b] for a, b in zip(starts, (table[:, 0] + table[:, 1]).tolist(), strict=True)]
    return found, None if changed else starts


def split_sentences(text: str) -> list[str]:
    """The sentences of `text`, stripped, empty ones left out (datatrove's `sent_tokenize` for English)."""
    with _zone.open(len(text)):
        return _stripped(sentence.text for sentence in _parse(text, sentences=True)[0].sents)


def sentence_pieces(text: str) -> list[str]:
    """`text` cut at its sentence ends, whitespace kept, covering all of it (datatrove's
    `split_into_sentences`, which C4's rules count and, when not splitting lines, filter)."""
    with _zone.open(len(text)):
        ends = [sentence.end_char for sentence in _parse(text, sentences=True)[0].sents]
    return [text[a:b] for a, b in zip([0] + ends[:-1], ends[:-1] + [len(text)], strict=True)]


def count_sentences(text: str) -> int:
    """len(sentence_pieces(text)), without building the pieces."""
    with _zone.open(len(text)):
        return max(1, sum(1 for _ in _parse(text, sentences=True)[0].sents))


class _Split:
    """The words of one text, with their start offsets when known; valid only for that text."""

    __slots__ = ("text", "words", "starts")

    def __init__(self, text: str, words: list[str], starts: list[int] | None):
        self.text, self.words, self.starts = text, words, starts

    def holds(self, text: str) -> bool:
        return self.text is text or self.text == text


# The words of the last text a step handed on, for a command that gives a changed text a new Document
# (its cache empty). One slot: the next step of the same document is the only reader.
_handed_on: list[_Split] = []


def _split_of(doc: Document) -> _Split:
    cached = doc.cache.get(_CACHE_KEY)
    if isinstance(cached, _Split) and cached.holds(doc.text):
        return cached
    if _handed_on and _handed_on[0].holds(doc.text):
        cached = _handed_on.pop()
    else:
        found, starts = _split_words_at(doc.text)
        cached = _Split(doc.text, found, starts)
    doc.cache[_CACHE_KEY] = cached
    return cached


def words(doc: Document) -> list[str]:
    """The words of a document under curation, split once and shared by every rule that reads them. The
    cache remembers the text it was made from, so a step that changes the text never sees stale words."""
    return _split_of(doc).words


def words_between(doc: Document, start: int, end: int) -> list[str] | None:
    """The words of the document that start in text[start:end]; None when the document has not been split
    yet (nothing is split for this alone) or its offsets are unknown. Exact for a span bounded by
    whitespace (a line), as spaCy never joins text across whitespace."""
    split = doc.cache.get(_CACHE_KEY)
    if not isinstance(split, _Split) or split.starts is None or not split.holds(doc.text):
        return None
    return split.words[bisect_left(split.starts, start) : bisect_left(split.starts, end)]


def set_words(doc: Document, text: str, found: list[str]) -> None:
    """Record `found` as the words of `text`, the text a step is about to give the document."""
    doc.cache[_CACHE_KEY] = split = _Split(text, found, None)
    _handed_on[:] = [split]
