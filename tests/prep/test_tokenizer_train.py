"""Training a byte-level BPE tokenizer with an EOD special token."""

from __future__ import annotations

import json

import pytest

from llmtools.errors import OutputExistsError, UsageError
from llmtools.prep.tokenizer_train import TrainConfig, train_tokenizer
from llmtools.tokenize import load_tokenizer
from tests.conftest import shared


def test_train_writes_loadable_tokenizer(tmp_path):
    corpus = shared("tinyshakespeare/input.jsonl")
    out = tmp_path / "tok" / "tokenizer.json"
    summary = train_tokenizer([str(corpus)], out, TrainConfig(vocab_size=800, special_tokens=["<|pad|>"]))
    assert summary == {
        "path": str(out),
        "vocab_size": 800,
        "eod_token": "<|endoftext|>",
        "eod_id": 0,
        "special_tokens": {"<|endoftext|>": 0, "<|pad|>": 1},
    }
    tok = load_tokenizer(out)
    assert (tok.vocab_size, tok.eod_id) == (800, 0)
    text = json.loads(open(corpus, encoding="utf-8").readline())["text"]
    ids = tok.encode(text)
    assert len(ids) < len(text.encode()) / 2  # it learned merges
    assert tok.decode(ids) == text
    assert tok.encode("x<|endoftext|>") == tok.encode("x") + [0]
    assert tok.decode(tok.encode("日本語 ü")) == "日本語 ü"  # byte level: nothing is unknown


def test_train_is_deterministic(tmp_path):
    corpus = str(shared("tinystories/tinystories_sample.jsonl"))
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    train_tokenizer([corpus], a, TrainConfig(vocab_size=300))
    train_tokenizer([corpus], b, TrainConfig(vocab_size=300))
    assert a.read_bytes() == b.read_bytes()
    with pytest.raises(OutputExistsError):
        train_tokenizer([corpus], a, TrainConfig(vocab_size=300))


def test_train_config_validates():
    with pytest.raises(UsageError, match="--vocab-size: must be at least 257"):
        TrainConfig(vocab_size=100)
    with pytest.raises(UsageError, match="--min-frequency"):
        TrainConfig(vocab_size=1000, min_frequency=0)
