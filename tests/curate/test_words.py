"""The words a document is split into once, for every rule: datatrove's words, with offsets, under one
spaCy memory zone per batch of texts, handed from a step that changes the text to the next."""

from __future__ import annotations

import pytest

pytest.importorskip("spacy")

from llmtools.prep.curate import words as w  # noqa: E402
from llmtools.prep.curate.step import Document  # noqa: E402
from tests.curate.quality_docs import adversarial, real_texts, settle_datatrove  # noqa: E402


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return real_texts(8) + adversarial(80, seed=11)


def test_fast_split_is_datatrove_s_words_with_their_offsets(texts):
    datatrove_text = pytest.importorskip("datatrove.utils.text")
    settle_datatrove()
    for text in texts:
        found, starts = w._split_words_at(text)
        assert found == w.split_words(text) == datatrove_text.split_into_words(text), text[:200]
        if starts is not None:  # None where spaCy saw the text without the poison
            assert [text[a : a + len(word)] for a, word in zip(starts, found, strict=True)] == found


def test_sentences_are_datatrove_s(texts):
    datatrove_text = pytest.importorskip("datatrove.utils.text")
    for text in texts[:40] + ["", " ", "One. Two! Three?", "Dr. Smith.  . ."]:
        assert w.sentence_pieces(text) == datatrove_text.split_into_sentences(text)
        assert w.count_sentences(text) == len(datatrove_text.split_into_sentences(text))


def test_the_words_survive_the_memory_zone_closing(texts, monkeypatch):
    before = [w.split_words(text) for text in texts[:30]]
    monkeypatch.setattr(w._Zone, "TEXTS", 3)
    w._zone.close()
    assert [w.split_words(text) for text in texts[:30]] == before
    kept = [w.words(Document(text)) for text in texts[:30]]
    w._zone.close()
    assert kept == before


def test_a_document_is_split_once_and_never_read_stale(monkeypatch):
    calls = []
    real = w._split_words_at
    monkeypatch.setattr(w, "_split_words_at", lambda text: calls.append(text) or real(text))
    doc = Document("The cat sat. On the mat.")
    assert w.words(doc) == w.words(doc) == ["The", "cat", "sat", ".", "On", "the", "mat", "."]
    assert len(calls) == 1
    doc.text = "Another text entirely"
    assert w.words(doc) == ["Another", "text", "entirely"] and len(calls) == 2


def test_words_handed_on_reach_a_new_document_of_that_text(monkeypatch):
    doc = Document("first line here\nsecond line")
    w.words(doc)
    w.set_words(doc, "first line here", ["first", "line", "here"])
    calls = []
    monkeypatch.setattr(w, "_split_words_at", lambda text: calls.append(text) or ([], []))
    assert w.words(Document("first line here")) == ["first", "line", "here"] and not calls
    w.words(Document("some other text"))
    assert calls == ["some other text"]


def test_the_spacy_poison_is_always_taken_out():
    """datatrove keeps "IS_ALPHA" in the first text of a process only (spaCy fails on it afterwards, and
    datatrove splits again without it); here it is taken out every time, whatever came before."""
    text = "IS_ALPHA is odd. And IS_ALPHA again."
    expected = ["is", "odd", ".", "And", "again", "."]
    assert w.split_words(text) == w.split_words(text) == expected
    found, starts = w._split_words_at(text)
    assert found == expected and starts is None
    assert w.count_sentences(text) == 2


def test_a_zone_opened_elsewhere_is_worked_in_not_nested():
    w._zone.close()
    nlp = w._english()
    with nlp.memory_zone():
        assert w.split_words("Inside a zone of its own.") == ["Inside", "a", "zone", "of", "its", "own", "."]
        assert w._zone.context is None
    with w.spacy_zone(10) as shared:
        assert shared is nlp and nlp.vocab.in_memory_zone and w._zone.context is not None
    w._zone.close()
    assert not nlp.vocab.in_memory_zone
