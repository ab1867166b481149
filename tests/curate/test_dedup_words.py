"""MinHash's text normalisation and words equal datatrove's `simplify_text` and English word tokenizer,
on real text and on every special case of spaCy's English tokenizer (the shortcut that skips spaCy for
tokens of plain letters must split "cannot", "dont", "gonna" as spaCy does)."""

from __future__ import annotations

import json

import pytest

from llmtools.prep.curate.dedup.normalise import TextNorm, WordSplitter, simplify_text
from tests.conftest import shared

pytest.importorskip("datatrove")
pytest.importorskip("spacy")


def _reference():
    from datatrove.utils.text import TextNormConfig
    from datatrove.utils.text import simplify_text as theirs
    from datatrove.utils.word_tokenizers import load_word_tokenizer

    return theirs, TextNormConfig, load_word_tokenizer("en")


def test_special_cases_and_odd_tokens_split_as_spacy_does():
    from llmtools.prep.curate.words import _english

    simplify, _, tokenizer = _reference()
    keys = sorted(k for k in _english().tokenizer.rules if k.isascii() and k.isalpha() and k.islower())
    assert "cannot" in keys and len(keys) > 100
    odd = "0km 00am 0th naïve café ½ ² ٣ x0 ×0 €0 ©0 e0e a0b  tab\there 㐀文字 ﬁne ǅemal ʼn"
    for text in [" ".join(keys), *keys, odd, "", "one", "IS_ALPHA is alpha"]:
        simple = simplify(text)
        assert WordSplitter()(simple) == tokenizer.word_tokenize(simple), text[:40]
        assert simplify_text(text) == simple


@pytest.mark.slow
@pytest.mark.parametrize("weekdays", [False, True])
def test_real_text_simplifies_and_splits_as_datatrove(weekdays):
    simplify, config, tokenizer = _reference()
    texts = []
    for name in ("wikitext-2/valid.jsonl", "lambada/lambada_test.jsonl"):
        texts += [json.loads(line)["text"] for line in shared(name).read_text().splitlines()[:60]]
    texts.append(shared("misc-text/wagahaiwa_nekodearu.txt").read_text()[:20000])
    ours_norm = TextNorm(norm_weekdays=weekdays, norm_monthnames=weekdays)
    their_norm = config(norm_weekdays=weekdays, norm_monthnames=weekdays)
    splitter = WordSplitter(limit=500)  # small: the memory is emptied and refilled along the way
    for text in texts:
        simple = simplify(text, their_norm)
        assert simplify_text(text, ours_norm) == simple
        assert splitter(simple) == tokenizer.word_tokenize(simple)
