"""Tokenizer loading for every kind, Megatron's vocab/EOD notions, golden ids, backends and policies."""

from __future__ import annotations

import base64
import gzip
import json
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtools.errors import InputError, UsageError
from llmtools.tokenize import load_tokenizer
from tests.conftest import shared

GPT2 = "tokenizers/gpt2"
TINY = "megatron-deepspeed-fixtures/gpt2-tiny-vocab.json"
C4_IDS = "c4-samples/c4_100_domains_5_www.theguardian.com_00000000.jsonl.gz"


@pytest.mark.parametrize(
    "spec,kind,vocab,eod,bos",
    [
        (f"{GPT2}/tokenizer.json", "hf-json", 50257, 50256, None),
        (GPT2, "hf-folder", 50257, 50256, None),
        (f"{GPT2}/vocab.json", "gpt2-bpe", 50257, 50256, None),
        (TINY, "gpt2-bpe", 5000, 4999, None),
        ("tokenizers/gpt-neox-20b/tokenizer.json", "hf-json", 50277, 0, None),
        ("tokenizers/mistral-v1/tokenizer.model", "sentencepiece", 32000, 2, 1),
        ("tokenizers/sentencepiece-test/test_model.model", "sentencepiece", 1000, 2, 1),
    ],
)
def test_load_every_kind(spec, kind, vocab, eod, bos):
    path = shared(spec)
    tok = load_tokenizer(path)
    ident = tok.identity()
    assert (ident["kind"], ident["vocab_size"], ident["eod_id"], ident["bos_id"]) == (kind, vocab, eod, bos)
    assert ident["hash"].startswith("sha256:") and len(ident["hash"]) == 71
    assert ident["source"] == str(path)
    text = "Hello world, this is a test."
    assert tok.decode(tok.encode(text)).strip() == text


def test_byte_tokenizer_needs_no_file():
    tok = load_tokenizer("byte")
    assert tok.identity()["kind"] == "byte" and tok.vocab_size == 257 and tok.eod_id == 256
    assert tok.encode("hé") == [104, 195, 169]
    assert tok.decode([104, 195, 169, 256]) == "hé<|endoftext|>"


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=60))
def test_byte_round_trip(text):
    tok = load_tokenizer("byte")
    flat, lengths = tok.encode_flat([text, text])
    assert lengths.tolist() == [len(text.encode())] * 2
    assert tok.decode(flat[: lengths[0]]) == text


def _c4_golden():
    rows = [json.loads(line) for line in gzip.open(shared(C4_IDS), "rt", encoding="utf-8")]
    ids = [np.frombuffer(base64.b64decode(r["tokens"]), dtype=">u2").astype(np.int64).tolist() for r in rows]
    return [r["text"] for r in rows], ids


@pytest.mark.parametrize("spec", [f"{GPT2}/tokenizer.json", GPT2, f"{GPT2}/vocab.json"])
@pytest.mark.parametrize("backend", ["tokenizers", "gigatoken"])
def test_c4_sample_matches_stored_gpt2_ids(spec, backend):
    texts, want = _c4_golden()
    tok = load_tokenizer(shared(spec), backend=backend)
    assert tok.backend == backend
    assert tok.encode_batch(texts) == want
    flat, lengths = tok.encode_flat(texts)
    assert flat.tolist() == [i for doc in want for i in doc] and lengths.tolist() == [len(d) for d in want]


@pytest.mark.parametrize(
    "corpus", ["lambada/lambada_test.jsonl", "tinyshakespeare/input.jsonl", "wikitext-2/valid.jsonl"]
)
def test_gigatoken_and_tokenizers_identical_on_corpora(corpus):
    texts, size = [], 0
    for line in open(shared(corpus), encoding="utf-8"):  # ~250 kB of each corpus keeps this fast
        texts.append(json.loads(line)["text"])
        size += len(line)
        if size > 250_000:
            break
    texts += [open(shared("misc-text/wagahaiwa_nekodearu.txt"), encoding="utf-8").read()[:10000]]
    spec = shared(f"{GPT2}/tokenizer.json")
    slow, fast = load_tokenizer(spec, backend="tokenizers"), load_tokenizer(spec, backend="gigatoken")
    a, la = slow.encode_flat(texts)
    b, lb = fast.encode_flat(texts)
    assert np.array_equal(la, lb) and np.array_equal(a, b.astype(np.int64))


def test_auto_backend_prefers_gigatoken_when_identical():
    assert load_tokenizer(shared(TINY)).backend == "gigatoken"
    # plain policy: gigatoken gets the tokenizer without its special added tokens, and still agrees
    assert load_tokenizer(shared(f"{GPT2}/tokenizer.json"), special_tokens="plain").backend == "gigatoken"
    # SentencePiece: no gigatoken path (it would cut out <s> and </s>, which sentencepiece treats as text)
    assert load_tokenizer(shared("tokenizers/sentencepiece-test/test_model.model")).backend == "sentencepiece"


TEXT = "a<|endoftext|>b"


@pytest.mark.parametrize(
    "spec,policy,want",
    [
        (f"{GPT2}/tokenizer.json", "auto", [64, 50256, 65]),  # HF normal call: specials are cut out
        (f"{GPT2}/tokenizer.json", "split", [64, 50256, 65]),
        (f"{GPT2}/tokenizer.json", "plain", [64, 27, 91, 437, 1659, 5239, 91, 29, 65]),
        (f"{GPT2}/vocab.json", "auto", [64, 50256, 65]),  # Megatron's GPT2BPETokenizer (transformers')
        (f"{GPT2}/vocab.json", "split", [64, 50256, 65]),
        (f"{GPT2}/vocab.json", "plain", [64, 27, 91, 437, 1659, 5239, 91, 29, 65]),  # legacy Megatron
        ("byte", "auto", list(TEXT.encode())),
        ("byte", "split", [97, 256, 98]),
    ],
)
def test_special_token_policy(spec, policy, want):
    tok = load_tokenizer(spec if spec == "byte" else shared(spec), special_tokens=policy)
    assert tok.encode(TEXT) == want


def test_sentencepiece_split_policy():
    spec = shared("tokenizers/sentencepiece-test/test_model.model")
    assert 2 not in load_tokenizer(spec).encode("x </s> y")
    assert 2 in load_tokenizer(spec, special_tokens="split").encode("x </s> y")


def test_hf_folder_uses_its_config(tmp_path):
    """A saved transformers folder: EOS/BOS from tokenizer_config.json, len(tokenizer) with added tokens."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(shared(f"{GPT2}/tokenizer.json")),
        eos_token="<|endoftext|>",
        bos_token="<|endoftext|>",
    )
    hf.add_special_tokens({"additional_special_tokens": ["<|pad|>"]})
    hf.save_pretrained(tmp_path / "tok")
    tok = load_tokenizer(tmp_path / "tok")
    assert tok.identity()["kind"] == "hf-folder"
    assert (tok.vocab_size, tok.eod_id, tok.bos_id) == (len(hf), 50256, 50256) == (50258, 50256, 50256)
    assert tok.encode("x<|pad|>") == hf("x<|pad|>").input_ids


@pytest.mark.parametrize("spec", [TINY, "tokenizers/sentencepiece-test/test_model.model", "byte"])
def test_tokenizer_pickles_for_spawned_workers(spec):
    tok = load_tokenizer(spec if spec == "byte" else shared(spec), special_tokens="split")
    again = pickle.loads(pickle.dumps(tok))
    assert again.identity() == tok.identity() and again.policy == "split"
    assert again.encode("hello <|endoftext|> there") == tok.encode("hello <|endoftext|> there")


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda p: p / "missing.json", "no such tokenizer"),
        (lambda p: (p / "bad.json").write_text("{not json") and p / "bad.json", "not a valid JSON tokenizer"),
        (lambda p: (p / "x.json").write_text('{"a": [1]}') and p / "x.json", "neither a Hugging Face"),
        (lambda p: (p / "x.model").write_bytes(b"junk") and p / "x.model", "cannot load as a SentencePiece"),
        (lambda p: (p / "vocab.json").write_text('{"a": 0}') and p / "vocab.json", "needs its merges file"),
        (lambda p: p, "folder has no tokenizer.json"),
    ],
)
def test_bad_tokenizer_specs(tmp_path, make, message):
    with pytest.raises(InputError, match=message):
        load_tokenizer(make(tmp_path))


def test_bad_policy_and_backend():
    with pytest.raises(UsageError, match="--special-tokens"):
        load_tokenizer("byte", special_tokens="nope")
    with pytest.raises(UsageError, match="--backend"):
        load_tokenizer("byte", backend="nope")


def test_deferred_probe_settles_before_the_first_encode():
    """defer_probe (json2bin): gigatoken's probe runs in a thread; backend and encoding wait for it."""
    spec = shared(f"{GPT2}/vocab.json")
    texts = ["Hello world", "<|endoftext|> and more", ""]
    eager = load_tokenizer(spec, backend="tokenizers")
    lazy = load_tokenizer(spec, defer_probe=True)
    assert lazy.parallel_in_process
    assert lazy.encode_batch(texts) == eager.encode_batch(texts)
    assert lazy.backend == "gigatoken" and lazy.fallback_reason is None


# Each kind of tokenizer file, copied under a folder whose name is not UTF-8 (and under a plain one):
# (files to copy from ../shared/data, what to load, relative to the copy).
ODD_PATH_KINDS = {
    "gpt2-folder": ([f"{GPT2}/vocab.json", f"{GPT2}/merges.txt"], ""),
    "gpt2-vocab": ([f"{GPT2}/vocab.json", f"{GPT2}/merges.txt"], "vocab.json"),
    "hf-json": ([f"{GPT2}/tokenizer.json"], "tokenizer.json"),
    "hf-folder": ([f"{GPT2}/tokenizer.json"], ""),
    "sentencepiece": (["tokenizers/sentencepiece-test/test_model.model"], "test_model.model"),
}


@pytest.mark.parametrize("kind", sorted(ODD_PATH_KINDS))
def test_every_kind_loads_from_a_path_that_is_not_utf8(kind, tmp_path):
    """A path is any bytes the filesystem allows: every tokenizer kind loads from under a non-UTF-8 name
    and encodes as the same files under a plain name do (the libraries behind them take names as text)."""
    import os
    import shutil

    files, target = ODD_PATH_KINDS[kind]
    loaded = []
    for name in (b"plain", b"odd\xff\xfe"):
        folder = os.path.join(os.fsencode(tmp_path), name)
        os.mkdir(folder)
        for file in files:
            shutil.copyfile(shared(file), os.path.join(folder, os.fsencode(os.path.basename(file))))
        spec = os.fsdecode(os.path.join(folder, os.fsencode(target))) if target else os.fsdecode(folder)
        loaded.append(load_tokenizer(spec, backend="tokenizers"))
    plain, odd = loaded
    text = "Hello, world! <|endoftext|> 123 ünïcödé"
    assert odd.encode(text) == plain.encode(text)
    assert odd.vocab_size == plain.vocab_size and odd.eod_id == plain.eod_id
