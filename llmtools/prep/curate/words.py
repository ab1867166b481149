"""Words and sentences of a text as datatrove's English word tokenizer splits them: spaCy's rule-based
`blank("en")` pipeline with a sentencizer (no model, nothing downloaded). The quality rules and MinHash see
the same words datatrove's do, so their decisions can be equal; a document is split once, whatever number
of rules read its words (`Document.cache`)."""

from __future__ import annotations

from functools import lru_cache

from llmtools.errors import InputError
from llmtools.prep.curate.step import Document

# spaCy's tokenizer refuses text holding this attribute name; datatrove removes it and splits again
_SPACY_POISON = "IS_ALPHA"


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
    nlp = _english()
    nlp.max_length = len(text) + 10
    run = nlp if sentences else nlp.make_doc
    try:
        return run(text)
    except Exception:
        if _SPACY_POISON not in text:
            raise
        return run(text.replace(_SPACY_POISON, ""))


def split_words(text: str) -> list[str]:
    """The words of `text`, stripped, empty ones left out (datatrove's `word_tokenize` for English)."""
    nlp = _english()
    with nlp.memory_zone():
        return _stripped(token.text for token in _parse(text, sentences=False))


def split_sentences(text: str) -> list[str]:
    """The sentences of `text`, stripped, empty ones left out (datatrove's `sent_tokenize` for English)."""
    nlp = _english()
    with nlp.memory_zone():
        return _stripped(sentence.text for sentence in _parse(text, sentences=True).sents)


def words(doc: Document) -> list[str]:
    """The words of a document under curation, split once and shared by every rule that reads them."""
    cached = doc.cache.get("words")
    if cached is None:
        cached = doc.cache["words"] = split_words(doc.text)
    return cached
