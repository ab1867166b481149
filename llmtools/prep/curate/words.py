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
from functools import lru_cache

from llmtools.errors import InputError
from llmtools.prep.curate.step import Document

# spaCy's tokenizer refuses text holding this attribute name; datatrove removes it and splits again
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


def _stripped(pieces) -> list[str]:
    return [piece.strip() for piece in pieces if piece.strip()]


def _parse(text: str, sentences: bool):
    """spaCy's doc of `text` and whether the poison string had to be taken out (offsets then shift)."""
    nlp = _english()
    nlp.max_length = len(text) + 10
    run = nlp if sentences else nlp.make_doc
    try:
        return run(text), False
    except Exception:
        if _SPACY_POISON not in text:
            raise
        return run(text.replace(_SPACY_POISON, "")), True


def split_words(text: str) -> list[str]:
    """The words of `text`, stripped, empty ones left out (datatrove's `word_tokenize` for English)."""
    nlp = _english()
    with nlp.memory_zone():
        return _stripped(token.text for token in _parse(text, sentences=False)[0])


def _split_words_at(text: str) -> tuple[list[str], list[int] | None]:
    """The words of `text` and where each starts (None when spaCy saw a changed text)."""
    from spacy.attrs import IDX

    nlp = _english()
    with nlp.memory_zone():
        parsed, changed = _parse(text, sentences=False)
        tokens = [token.text for token in parsed]
        offsets = parsed.to_array(IDX).tolist() if tokens else []
    found: list[str] = []
    starts: list[int] = []
    for token, start in zip(tokens, offsets, strict=True):
        word = token.strip()
        if word:
            found.append(word)
            starts.append(start)
    return found, None if changed else starts


def split_sentences(text: str) -> list[str]:
    """The sentences of `text`, stripped, empty ones left out (datatrove's `sent_tokenize` for English)."""
    nlp = _english()
    with nlp.memory_zone():
        return _stripped(sentence.text for sentence in _parse(text, sentences=True)[0].sents)


def sentence_pieces(text: str) -> list[str]:
    """`text` cut at its sentence ends, whitespace kept, covering all of it (datatrove's
    `split_into_sentences`, which C4's rules count and, when not splitting lines, filter)."""
    nlp = _english()
    with nlp.memory_zone():
        ends = [sentence.end_char for sentence in _parse(text, sentences=True)[0].sents]
    return [text[a:b] for a, b in zip([0] + ends[:-1], ends[:-1] + [len(text)], strict=True)]


def count_sentences(text: str) -> int:
    """len(sentence_pieces(text)), without building the pieces."""
    nlp = _english()
    with nlp.memory_zone():
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
