"""Megatron-LM's ``tools/preprocess_data.py`` command line, pasted as it is, writes Megatron's bytes.

The reference is megatron-core 0.16.1's own code: its ``build_tokenizer`` (the tokenizer system
``preprocess_data.py`` uses by default from core_v0.15 to core_v0.16.1) and ``IndexedDatasetBuilder``,
driven by the script's per-line logic (json.loads, ``tokenizer.tokenize(text)``, EOD after non-empty
documents, ``DType.optimal_dtype(tokenizer.vocab_size)``, and for ``--partitions N`` its round-robin
deal of the lines into N partitions merged with ``add_index``). The legacy system
(``--legacy-tokenizer``, megatron/training/tokenizer) is not in the megatron-core package; its ids are
checked against independent references (tiktoken's GPT-2 ``encode_ordinary`` for OpenAI's BPE code,
sentencepiece with BOS for Llama-2, transformers' ``tokenizer(text)`` for Hugging Face).
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from llmtools.formats.indexed import IndexedDatasetReader
from llmtools.formats.sidecar import read_sidecar
from tests.conftest import REPO, shared

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed" on CPU
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
    from megatron.core.tokenizers.text.utils.build_tokenizer import build_tokenizer

TOK = "tokenizers"


def megatron_args(**kw) -> argparse.Namespace:
    """preprocess_data.py's parsed arguments (tokenizer part), defaults as its argparse sets them."""
    args = dict(
        tokenizer_type=None,
        tokenizer_model=None,
        vocab_file=None,
        merge_file=None,
        tokenizer_special_tokens=None,
        tokenizer_hf_use_fast=False,
        tokenizer_hf_include_special_tokens=False,
        trust_remote_code=False,
        tokenizer_sentencepiece_legacy=False,
        tiktoken_pattern=None,
        tiktoken_num_special_tokens=1000,
        vocab_size=None,
        tokenizer_metadata=None,
    )
    args.update(kw)
    return argparse.Namespace(**args)


def megatron_preprocess(
    jsonl: Path, prefix: Path, tokenizer, keys=("text",), partitions: int = 1
) -> list[Path]:
    """preprocess_data.py with --append-eod, run in-process with megatron-core's tokenizer and builder."""
    dtype = DType.optimal_dtype(tokenizer.vocab_size)
    lines = jsonl.read_text(encoding="utf-8").splitlines(keepends=True)
    parts = [lines[p::partitions] for p in range(partitions)]  # line g -> partition g % N
    out = []
    for key in keys:
        part_prefixes = []
        for p, part in enumerate(parts):
            part_prefix = f"{prefix}_{p}_{key}_document" if partitions > 1 else f"{prefix}_{key}_document"
            builder = IndexedDatasetBuilder(f"{part_prefix}.bin", dtype=dtype)
            for line in part:
                text = json.loads(line)[key]
                ids = tokenizer.tokenize(text)
                doc, lens = (list(ids) + [tokenizer.eod], [len(ids) + 1]) if len(ids) else ([], [])
                builder.add_document(doc, lens)
            builder.finalize(f"{part_prefix}.idx")
            part_prefixes.append(part_prefix)
        if partitions > 1:
            builder = IndexedDatasetBuilder(f"{prefix}_{key}_document.bin", dtype=dtype)
            for part_prefix in part_prefixes:
                builder.add_index(part_prefix)
            builder.finalize(f"{prefix}_{key}_document.idx")
        out.append(Path(f"{prefix}_{key}_document"))
    return out


def same_files(a, b) -> bool:
    return all(Path(f"{a}{s}").read_bytes() == Path(f"{b}{s}").read_bytes() for s in (".bin", ".idx"))


def documents(prefix) -> list[list[int]]:
    reader = IndexedDatasetReader(prefix)
    return [reader.document(j).tolist() for j in range(reader.num_documents)]


def prep(args, env, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llmtools.cli.prep", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        cwd=cwd or REPO,
        timeout=300,
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Real text, two keys, empty documents, and the literal special-token strings of every tokenizer here."""
    rows = []
    with open(shared("lambada/lambada_test.jsonl"), encoding="utf-8") as handle:
        for i, line in zip(range(60), handle, strict=False):
            text = json.loads(line)["text"]
            rows.append({"text": text, "title": text[:30] if i % 4 else ""})
    rows += [
        {"text": "", "title": "empty"},
        {"text": "a literal <|endoftext|> and <s> and </s> and <unk> inside", "title": "<|endoftext|>"},
        {"text": "tabs\tand\r\nCRLF  runs    of spaces 😀 caf\u00e9 \u4e2d\u6587", "title": " "},
    ]
    path = tmp_path_factory.mktemp("meg") / "corpus.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A folder holding ``gpt2/`` (megatron-core's GPT2BPETokenizer calls AutoTokenizer.from_pretrained
    ("gpt2"): run from here, nothing is downloaded), an HF folder whose post-processor adds a BOS, and a
    TikTokenizer vocabulary in Megatron's JSON format (GPT-2's merges, single bytes first)."""
    folder = tmp_path_factory.mktemp("megatron-tokenizers")
    gpt2 = folder / "gpt2"
    gpt2.mkdir()
    for name in ("vocab.json", "merges.txt"):
        (gpt2 / name).write_bytes((shared(TOK) / "gpt2" / name).read_bytes())
    (gpt2 / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GPT2Tokenizer"}))
    bos = folder / "neox-bos"
    bos.mkdir()
    spec = json.loads(shared(f"{TOK}/gpt-neox-20b/tokenizer.json").read_text(encoding="utf-8"))
    eot = {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [eot, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [eot, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}},
    }
    (bos / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
    }
    (bos / "tokenizer_config.json").write_text(json.dumps(config))
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(gpt2 / "merges.txt"), encoder_json_file=str(gpt2 / "vocab.json")
    )
    tokens = [bytes([i]) for i in range(256)] + [
        t for t, _ in sorted(ranks.items(), key=lambda kv: kv[1]) if len(t) > 1
    ]
    vocab = [
        {"rank": i, "token_bytes": base64.b64encode(t).decode(), "token_str": t.decode("utf-8", "replace")}
        for i, t in enumerate(tokens)
    ]
    (folder / "tik.json").write_text(json.dumps(vocab))
    return folder


@pytest.fixture
def env(cli_env):
    return dict(cli_env, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


def gpt2_flags() -> list[str]:
    folder = shared(TOK) / "gpt2"
    return [
        "--tokenizer-type",
        "GPT2BPETokenizer",
        "--vocab-file",
        folder / "vocab.json",
        "--merge-file",
        folder / "merges.txt",
    ]


# -- megatron-core's tokenizer system (the default) ------------------------------------------------
def test_gpt2_two_keys_megatron_spelling(tmp_path, corpus, work, env, monkeypatch):
    args = ["json2bin", "--input", corpus, "--output-prefix", tmp_path / "ours", *gpt2_flags()]
    args += ["--json-keys", "text", "title", "--append-eod", "--workers", "2", "--log-interval", "20"]
    result = prep(args, env)
    assert result.returncode == 0, result.stderr
    assert "Processed " in result.stderr and " documents (" in result.stderr  # Megatron's progress lines
    monkeypatch.chdir(work)
    folder = shared(TOK) / "gpt2"
    theirs = build_tokenizer(
        megatron_args(
            tokenizer_type="GPT2BPETokenizer",
            vocab_file=str(folder / "vocab.json"),
            merge_file=str(folder / "merges.txt"),
        )
    )
    for key, their_prefix in zip(
        ("text", "title"),
        megatron_preprocess(corpus, tmp_path / "theirs", theirs, ("text", "title")),
        strict=True,
    ):
        assert same_files(tmp_path / f"ours_{key}_document", their_prefix), key
    side = read_sidecar(tmp_path / "ours_text_document")
    assert (
        side["megatron"]["tokenizer_type"] == "GPT2BPETokenizer"
        and side["megatron"]["legacy_tokenizer"] is False
    )
    assert "core_v0.16" in side["megatron"]["reproduces"] and side["special_tokens"] == "auto"
    assert [50256] in [d[i : i + 1] for d in documents(tmp_path / "ours_title_document") for i in range(1)]


@pytest.mark.parametrize("include", [False, True], ids=["default", "include-special-tokens"])
def test_huggingface_folder_with_bos(tmp_path, corpus, work, env, include):
    """megatron-core calls tokenize(text): no BOS unless --tokenizer-hf-include-special-tokens."""
    flags = ["--tokenizer-hf-include-special-tokens"] if include else []
    args = ["json2bin", "--input", corpus, "--output-prefix", tmp_path / "ours", "--tokenizer-type"]
    args += [
        "HuggingFaceTokenizer",
        "--tokenizer-model",
        work / "neox-bos",
        "--append-eod",
        "--workers",
        "2",
        *flags,
    ]
    result = prep(args, env)
    assert result.returncode == 0, result.stderr
    theirs = build_tokenizer(
        megatron_args(
            tokenizer_type="HuggingFaceTokenizer",
            tokenizer_model=str(work / "neox-bos"),
            tokenizer_hf_include_special_tokens=include,
        )
    )
    their_prefix = megatron_preprocess(corpus, tmp_path / "theirs", theirs)[0]
    assert same_files(tmp_path / "ours_text_document", their_prefix)
    first = documents(tmp_path / "ours_text_document")[0]
    assert (first[0] == 0) is include  # the BOS the post-processor adds


@pytest.mark.parametrize("kind", ["Llama2Tokenizer", "SentencePieceTokenizer", "GPTSentencePieceTokenizer"])
def test_sentencepiece_types(tmp_path, corpus, env, kind):
    model = shared(f"{TOK}/mistral-v1/tokenizer.model")
    args = ["json2bin", "--input", corpus, "--output-prefix", tmp_path / "ours", "--tokenizer-type", kind]
    result = prep([*args, "--tokenizer-model", model, "--append-eod", "--workers", "1"], env)
    assert result.returncode == 0, result.stderr
    theirs = build_tokenizer(megatron_args(tokenizer_type=kind, tokenizer_model=str(model)))
    assert same_files(
        tmp_path / "ours_text_document", megatron_preprocess(corpus, tmp_path / "theirs", theirs)[0]
    )


def test_tiktokenizer(tmp_path, corpus, work, env):
    vocab = work / "tik.json"
    size = len(json.loads(vocab.read_text())) + 1000
    args = [
        "json2bin",
        "--input",
        corpus,
        "--output-prefix",
        tmp_path / "ours",
        "--tokenizer-type",
        "TikTokenizer",
    ]
    args += ["--tokenizer-model", vocab, "--vocab-size", size, "--append-eod", "--workers", "2"]
    result = prep(args, env)
    assert result.returncode == 0, result.stderr
    theirs = build_tokenizer(
        megatron_args(tokenizer_type="TikTokenizer", tokenizer_model=str(vocab), vocab_size=size)
    )
    assert same_files(
        tmp_path / "ours_text_document", megatron_preprocess(corpus, tmp_path / "theirs", theirs)[0]
    )
    assert read_sidecar(tmp_path / "ours_text_document")["tokenizer"]["kind"] == "tiktoken"
    wrong = prep([*args[: args.index("--vocab-size") + 1], size + 5, "--force"], env)
    assert wrong.returncode == 2 and f"pass --vocab-size {size}" in wrong.stderr


def test_partitions_reproduce_megatrons_document_order(tmp_path, corpus, work, env, monkeypatch):
    def run(name, *flags):
        args = [
            "json2bin",
            "--input",
            corpus,
            "--output-prefix",
            tmp_path / name,
            *gpt2_flags(),
            "--append-eod",
        ]
        result = prep([*args, *flags], env)
        assert result.returncode == 0, result.stderr

    run("ours", "--partitions", "3", "--workers", "2")  # workers % partitions != 0 is fine here
    run("seq", "--partitions", "3", "--keep-sequential-samples")
    run("plain")
    monkeypatch.chdir(work)
    folder = shared(TOK) / "gpt2"
    theirs = build_tokenizer(
        megatron_args(
            tokenizer_type="GPT2BPETokenizer",
            vocab_file=str(folder / "vocab.json"),
            merge_file=str(folder / "merges.txt"),
        )
    )
    assert same_files(
        tmp_path / "ours_text_document",
        megatron_preprocess(corpus, tmp_path / "theirs", theirs, partitions=3)[0],
    )
    assert same_files(
        tmp_path / "seq_text_document", tmp_path / "plain_text_document"
    )  # contiguous: input order
    assert not same_files(tmp_path / "ours_text_document", tmp_path / "plain_text_document")
    assert read_sidecar(tmp_path / "ours_text_document")["partitions"]["count"] == 3
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []  # the partitions' folder is gone


# -- the legacy system (--legacy-tokenizer) --------------------------------------------------------
def test_legacy_tokenizers(tmp_path, corpus, work, env):
    texts = [json.loads(line)["text"] for line in corpus.read_text(encoding="utf-8").splitlines()]
    folder = shared(TOK) / "gpt2"

    def ours(*flags) -> list[list[int]]:
        prefix = tmp_path / f"legacy{len(list(tmp_path.iterdir()))}"
        result = prep(
            ["json2bin", "--input", corpus, "--output-prefix", prefix, "--legacy-tokenizer", *flags], env
        )
        assert result.returncode == 0, result.stderr
        return documents(f"{prefix}_text_document")

    # GPT-2: OpenAI's BPE code, where a literal <|endoftext|> is ordinary text (tiktoken's encode_ordinary)
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    pattern = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(folder / "merges.txt"), encoder_json_file=str(folder / "vocab.json")
    )
    openai = tiktoken.Encoding(
        "gpt2-local", pat_str=pattern, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256}
    )
    expected = [openai.encode_ordinary(t) for t in texts]
    assert ours(*gpt2_flags(), "--append-eod") == [ids + [50256] if ids else [] for ids in expected]
    assert 50256 not in expected[-2]  # the literal stayed text
    # Llama-2: BOS first (so an empty text is [BOS, EOD])
    import sentencepiece

    model = shared(f"{TOK}/mistral-v1/tokenizer.model")
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model))
    got = ours("--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", model, "--append-eod")
    assert got == [[sp.bos_id(), *sp.encode(t), sp.eos_id()] for t in texts]
    # Hugging Face: tokenizer(text).input_ids, the post-processor's BOS included
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(work / "neox-bos"), local_files_only=True)
    got = ours("--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", work / "neox-bos")
    assert got == [hf(t).input_ids for t in texts]
    # TikTokenizer: everything ordinary text (ids of megatron-core's encoding, specials not split)
    vocab = work / "tik.json"
    size = len(json.loads(vocab.read_text())) + 1000
    core = build_tokenizer(
        megatron_args(tokenizer_type="TikTokenizer", tokenizer_model=str(vocab), vocab_size=size)
    )
    flags = [
        "--tokenizer-type",
        "TikTokenizer",
        "--tokenizer-model",
        vocab,
        "--vocab-size",
        size,
        "--tiktoken-pattern",
        "v2",
    ]
    assert ours(*flags) == [core._tokenizer.tokenizer.encode_ordinary(t) for t in texts]


# -- what cannot be honoured is refused ----------------------------------------------------------------
REFUSED = [
    (["--split-sentences"], "needs NLTK's punkt"),
    (["--trust-remote-code"], "never run"),
    (["--tokenizer-metadata", "meta.json"], "--tokenizer-metadata"),
    (["-t", "byte"], "either -t/--tokenizer or Megatron's --tokenizer-type"),
    (["--special-tokens", "plain"], "--special-tokens with --tokenizer-type"),
    (["--tokenizer-type", "BertWordPieceCase"], "BERT WordPiece"),
    (["--tokenizer-type", "NoSuchTokenizer"], "unknown type 'NoSuchTokenizer'"),
    (["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "v.json"], "nothing is downloaded"),
    (
        ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "meta-llama/Llama-2-7b-hf"],
        "nothing is downloaded",
    ),
    (
        ["--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model", "x.model", "--legacy-tokenizer"],
        "BERT/T5 wrapper",
    ),
    (
        ["--tokenizer-type", "TikTokenizer", "--tokenizer-model", "t.json", "--legacy-tokenizer"],
        "--tiktoken-pattern v1|v2 is required",
    ),
]


@pytest.mark.parametrize("flags, words", REFUSED, ids=[" ".join(map(str, f))[:40] for f, _ in REFUSED])
def test_refused_flags(tmp_path, corpus, env, flags, words):
    base = ["json2bin", "--input", corpus, "--output-prefix", tmp_path / "out", "--workers", "1"]
    if "--tokenizer-type" not in flags:
        base += gpt2_flags()
    result = prep([*base, *flags], env, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert words in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not any(p.name.startswith("out") and p.suffix != ".lock" for p in tmp_path.iterdir())


def test_json_keys_spellings_agree(tmp_path, corpus, env):
    """--json-keys text title (Megatron), text,title, and the flag repeated: one meaning."""
    outs = []
    for k, spelling in enumerate(
        (
            ["--json-keys", "text", "title"],
            ["--json-keys", "text,title"],
            ["--json-keys", "text", "--json-keys", "title"],
        )
    ):
        prefix = tmp_path / f"k{k}"
        result = prep(["json2bin", *spelling, corpus, "-t", "byte", "-o", prefix, "-q"], env)
        assert result.returncode == 0, result.stderr
        outs.append([Path(f"{prefix}_{key}_document.bin").read_bytes() for key in ("text", "title")])
    assert outs[0] == outs[1] == outs[2]
    assert np.frombuffer(outs[0][1], dtype=np.uint16).size > 0
