"""Compatibility with Megatron-LM's own code (megatron-core from PyPI), both ways.

* Megatron's ``IndexedDataset`` opens what our ``IndexedDatasetWriter`` and ``llm-prep json2bin`` write
  and sees the same sequences, documents and dtype; its ``IndexedDatasetBuilder`` fed the same
  documents writes byte-identical files; its ``add_index`` merges our files.
* Our reader opens the Megatron-made fixtures and agrees with Megatron's reader on every sequence.
* ``llm-prep json2bin`` equals Megatron-LM's ``tools/preprocess_data.py`` recipe run in-process: the
  script's per-line logic (json.loads, ``tokenizer(text).input_ids``, EOD after non-empty documents,
  ``add_document(ids, lengths)``, ``DType.optimal_dtype(len(tokenizer))``) with the tokenizer the newest
  Megatron-LM builds for ``GPT2BPETokenizer`` / ``HuggingFaceTokenizer`` (transformers' GPT-2 tokenizer
  from the same vocab.json/merges.txt) and megatron-core's builder.

megatron-core imports on CPU (no GPU, no Transformer Engine/Apex: it only warns); importing
``megatron.core.datasets.indexed_dataset`` runs ``megatron/core/__init__`` (torch and friends), about
6 s of CPU, so it is imported once per module.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmtools.formats.indexed import IndexedDatasetReader, IndexedDatasetWriter
from tests.conftest import shared

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed" on CPU
    from megatron.core.datasets.indexed_dataset import DType, IndexedDataset, IndexedDatasetBuilder

GPT2 = "tokenizers/gpt2"
FIXTURES = "megatron-deepspeed-fixtures"
INT_DTYPES = [np.uint8, np.int8, np.int16, np.uint16, np.int32, np.int64]


# -- helpers -----------------------------------------------------------------------------------
def megatron_view(prefix) -> dict:
    """What Megatron's reader sees: dtype, lengths, doc indices and every sequence (copied)."""
    ds = IndexedDataset(str(prefix))
    return {
        "dtype": np.dtype(ds.index.dtype),
        "lengths": np.array(ds.sequence_lengths),
        "doc_idx": np.array(ds.document_indices),
        "seqs": [np.array(ds[i]) for i in range(len(ds))],
    }


def megatron_documents(view: dict) -> list[list[int]]:
    seqs, doc_idx = view["seqs"], view["doc_idx"]
    return [
        [int(t) for k in range(doc_idx[j], doc_idx[j + 1]) for t in seqs[k]] for j in range(len(doc_idx) - 1)
    ]


def write_ours(prefix, docs: list[list[list[int]]], dtype) -> None:
    """docs: a list of documents, each a list of sequences (sentences)."""
    with IndexedDatasetWriter(prefix, dtype, durable=False) as writer:
        for doc in docs:
            flat = [t for seq in doc for t in seq]
            writer.add_document(np.array(flat, dtype=np.int64), [len(seq) for seq in doc])


def write_megatron(prefix, docs: list[list[list[int]]], dtype) -> None:
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for doc in docs:
        # Megatron's preprocess_data.py never passes empty sentences: it drops them before add_document.
        seqs = [seq for seq in doc if seq]
        builder.add_document([t for seq in seqs for t in seq], [len(seq) for seq in seqs])
    builder.finalize(f"{prefix}.idx")


def assert_same_files(a, b) -> None:
    for suffix in (".bin", ".idx"):
        left, right = Path(f"{a}{suffix}").read_bytes(), Path(f"{b}{suffix}").read_bytes()
        assert left == right, f"{suffix} differs: {len(left)} vs {len(right)} bytes"


def documents_strategy(max_id: int):
    sequence = st.lists(st.integers(0, max_id), min_size=0, max_size=12)
    return st.lists(st.lists(sequence, min_size=0, max_size=3), min_size=0, max_size=12)


# -- our writer -> Megatron's reader (and Megatron's writer -> the same bytes) -------------------
@pytest.mark.parametrize("dtype", INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_megatron_reads_our_writer(tmp_path, dtype):
    info = np.iinfo(dtype)
    docs = [
        [[1, 2, 3]],
        [],  # empty document: a document index, no sequence
        [[info.max, info.min, 0]],
        [[5], [6, 7], [8, 9, 10]],  # one document of three sentences
        [[4] * 1000],
        [],
    ]
    write_ours(tmp_path / "ours", docs, dtype)
    view = megatron_view(tmp_path / "ours")
    assert view["dtype"] == np.dtype(dtype)
    assert view["lengths"].tolist() == [3, 3, 1, 2, 3, 1000]
    assert view["doc_idx"].tolist() == [0, 1, 1, 2, 5, 6, 6]
    assert [s.tolist() for s in view["seqs"][:3]] == [[1, 2, 3], [info.max, info.min, 0], [5]]
    assert all(s.dtype == np.dtype(dtype) for s in view["seqs"])
    assert megatron_documents(view) == [[t for seq in doc for t in seq] for doc in docs]
    # Megatron's own builder, same documents: byte for byte the same pair.
    write_megatron(tmp_path / "theirs", docs, dtype)
    assert_same_files(tmp_path / "ours", tmp_path / "theirs")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=documents_strategy(65535), wide=st.booleans())
def test_property_both_writers_agree_and_both_readers_agree(tmp_path_factory, docs, wide):
    dtype = np.int32 if wide else np.uint16
    if wide:
        docs = [[[t * 32_768 for t in seq] for seq in doc] for doc in docs]  # ids beyond uint16, within int32
    folder = tmp_path_factory.mktemp("prop")
    write_ours(folder / "ours", docs, dtype)
    write_megatron(folder / "theirs", docs, dtype)
    assert_same_files(folder / "ours", folder / "theirs")
    ours = IndexedDatasetReader(folder / "theirs")
    expected = [[t for seq in doc for t in seq] for doc in docs]
    assert [ours.document(j).tolist() for j in range(ours.num_documents)] == expected
    assert ours.dtype == np.dtype(dtype)
    if any(expected):  # Megatron's reader cannot mmap a 0-byte .bin (its own included): see below
        view = megatron_view(folder / "ours")
        assert megatron_documents(view) == expected
        assert view["dtype"] == np.dtype(dtype)


def test_writer_rejects_ids_that_do_not_fit(tmp_path):
    # Megatron's builder raises OverflowError here; ours must not wrap silently either.
    for dtype, bad in ((np.uint16, 70_000), (np.uint16, -1), (np.int32, 2**31)):
        with pytest.raises(ValueError, match="do not fit"):
            write_ours(tmp_path / "bad", [[[1, bad]]], dtype)
        assert not (tmp_path / "bad.bin").exists() and not (tmp_path / "bad.idx").exists()


def test_megatron_add_index_merges_our_files(tmp_path):
    write_ours(tmp_path / "a", [[[1, 2]], [], [[3]]], np.uint16)
    write_ours(tmp_path / "b", [[[4, 5, 6]], [[7], [8]]], np.uint16)
    builder = IndexedDatasetBuilder(str(tmp_path / "merged.bin"), dtype=np.uint16)
    builder.add_index(str(tmp_path / "a"))
    builder.add_index(str(tmp_path / "b"))
    builder.finalize(str(tmp_path / "merged.idx"))
    merged = IndexedDatasetReader(tmp_path / "merged")
    assert [merged.document(j).tolist() for j in range(merged.num_documents)] == [
        [1, 2],
        [],
        [3],
        [4, 5, 6],
        [7, 8],
    ]


# Megatron's failed constructor then trips over its own __del__ (an "exception ignored" warning).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_dataset_without_tokens_matches_megatron_bytes(tmp_path):
    """Only empty documents: the same bytes as Megatron's builder. Megatron's *reader* cannot open such a
    pair (numpy.memmap of a 0-byte .bin raises "cannot mmap an empty file", its own output included);
    ours can."""
    write_ours(tmp_path / "ours", [[], []], np.uint16)
    write_megatron(tmp_path / "theirs", [[], []], np.uint16)
    assert_same_files(tmp_path / "ours", tmp_path / "theirs")
    ours = IndexedDatasetReader(tmp_path / "theirs")
    assert len(ours) == 0 and ours.document_indices.tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="empty file"):
        IndexedDataset(str(tmp_path / "theirs"))


# -- Megatron-made fixtures -> our reader ----------------------------------------------------------
@pytest.mark.parametrize(
    "name, dtype, docs, eod",
    [
        ("meg-gpt2-openwebtext_text_document", np.uint16, 1000, 4999),
        ("bloomtok_ag_news_prompt_inputs_document", np.int32, 100, None),
        ("bloomtok_ag_news_prompt_targets_document", np.int32, 100, None),
    ],
)
def test_our_reader_matches_megatron_on_fixtures(name, dtype, docs, eod):
    prefix = shared(f"{FIXTURES}/{name}.idx").with_suffix("")
    ours = IndexedDatasetReader(prefix)
    ours.validate()
    view = megatron_view(prefix)
    assert ours.dtype == view["dtype"] == np.dtype(dtype)
    assert ours.num_documents == docs == len(view["doc_idx"]) - 1
    assert np.array_equal(ours.sequence_lengths, view["lengths"])
    assert np.array_equal(ours.document_indices, view["doc_idx"])
    for i, seq in enumerate(view["seqs"]):
        assert np.array_equal(ours[i], seq), f"sequence {i} differs"
    if eod is not None:
        assert all(int(ours.document(j)[-1]) == eod for j in range(ours.num_documents))
    if name == "meg-gpt2-openwebtext_text_document":
        assert ours.num_tokens == 1_361_845


# -- llm-prep json2bin vs Megatron-LM's preprocess_data.py recipe -----------------------------------
def megatron_preprocess(jsonl: Path, prefix: Path, tokenizer, keys=("text",), append_eod=True) -> list[Path]:
    """preprocess_data.py's per-line logic, run with megatron-core's builder and the given tokenizer.

    ``tokenizer`` is a transformers tokenizer, called as Megatron's HuggingFaceTokenizer calls it:
    ``tokenizer(text).input_ids`` (include_special_tokens=True, its default), EOD = eos_token_id.
    """
    dtype = DType.optimal_dtype(len(tokenizer))
    builders = {key: IndexedDatasetBuilder(f"{prefix}_{key}_document.bin", dtype=dtype) for key in keys}
    with open(jsonl, encoding="utf-8") as handle:
        for line in handle:
            data = json.loads(line)
            for key in keys:
                text = data[key]
                doc, lens = [], []
                for sentence in text if isinstance(text, list) else [text]:
                    ids = tokenizer(sentence).input_ids
                    if ids:
                        doc.extend(ids)
                        lens.append(len(ids))
                if doc and append_eod:
                    doc.append(tokenizer.eos_token_id)
                    lens[-1] += 1
                builders[key].add_document(doc, lens)
    for key in keys:
        builders[key].finalize(f"{prefix}_{key}_document.idx")
    return [Path(f"{prefix}_{key}_document") for key in keys]


@pytest.fixture(scope="module")
def gpt2_hf():
    """The tokenizer the newest Megatron-LM builds for GPT2BPETokenizer with --vocab-file/--merge-file."""
    from transformers import GPT2Tokenizer

    # Megatron calls AutoTokenizer.from_pretrained("gpt2", vocab_file=..., merges_file=...): with the
    # transformers installed here (5.x) that is this class reading vocab.json + merges.txt.
    tokenizer = GPT2Tokenizer.from_pretrained(str(shared(GPT2)), local_files_only=True)
    assert len(tokenizer) == 50257 and tokenizer.eos_token_id == 50256
    return tokenizer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Real text, several JSON keys, empty and whitespace-only documents, multi-byte UTF-8, CRLF."""
    rows = []
    with open(shared("lambada/lambada_test.jsonl"), encoding="utf-8") as handle:
        for i, line in zip(range(250), handle, strict=False):
            text = json.loads(line)["text"]
            rows.append({"text": text, "title": text[:40] if i % 3 else ""})
    for path in sorted(shared("c4-samples").glob("c4-sample.0*.json.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            rows += [{"text": json.loads(line)["text"], "title": json.loads(line)["url"]} for line in handle]
    japanese = shared("misc-text/wagahaiwa_nekodearu.txt").read_text(encoding="utf-8")[:3000]
    rows += [
        {"text": "", "title": "empty text"},
        {"text": "   ", "title": " "},
        {"text": japanese, "title": "吾輩は猫である"},
        {"text": "tabs\tand\r\nCRLF lines\u00a0nbsp 😀👍🏽", "title": "x"},
        {"text": "runs of    spaces\n\n\n    and a combining e\u0301 (NFC: \u00e9)", "title": "  x  "},
    ]
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


def run_json2bin(cli_env, inputs, tokenizer, prefix, *extra) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "llmtools.cli.prep",
        "json2bin",
        *map(str, inputs),
        "--tokenizer",
        str(tokenizer),
        "-o",
        str(prefix),
        "-q",
        *extra,
    ]
    result = subprocess.run(cmd, env=cli_env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result


@pytest.mark.parametrize(
    "spec, backend",
    [("vocab.json", "tokenizers"), ("vocab.json", "gigatoken"), ("folder", "auto")],
)
def test_json2bin_equals_megatron_recipe(tmp_path, cli_env, gpt2_hf, corpus, spec, backend):
    folder = shared(GPT2)
    tokenizer = folder / "vocab.json" if spec == "vocab.json" else folder
    result = run_json2bin(
        cli_env,
        [corpus],
        tokenizer,
        tmp_path / "ours",
        "--append-eod",
        "--workers",
        "2",
        "--json-keys",
        "text",
        "--json-keys",
        "title",
        "--backend",
        backend,
    )
    theirs = megatron_preprocess(corpus, tmp_path / "theirs", gpt2_hf, keys=("text", "title"))
    for key, their_prefix in zip(("text", "title"), theirs, strict=True):
        our_prefix = tmp_path / f"ours_{key}_document"
        assert f"{our_prefix}.bin" in result.stdout
        assert_same_files(our_prefix, their_prefix)
        view = megatron_view(our_prefix)  # and Megatron's reader opens ours
        assert view["dtype"] == np.uint16
        assert len(view["doc_idx"]) - 1 == sum(1 for _ in open(corpus, encoding="utf-8"))


def test_json2bin_equals_megatron_recipe_hf_folder_neox(tmp_path, cli_env, corpus):
    """Megatron's --tokenizer-type HuggingFaceTokenizer on an HF folder: AutoTokenizer(folder), called as
    tokenizer(text). GPT-NeoX-20B: NFC normalizer, non-special added tokens (whitespace runs), 50,277 ids."""
    from transformers import AutoTokenizer

    folder = tmp_path / "neox"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(shared("tokenizers/gpt-neox-20b/tokenizer.json").read_bytes())
    eot = "<|endoftext|>"
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": eot,
        "eos_token": eot,
        "unk_token": eot,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    hf = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    assert len(hf) == 50277 and hf.eos_token_id == 0
    run_json2bin(cli_env, [corpus], folder, tmp_path / "ours", "--append-eod", "--workers", "2")
    theirs = megatron_preprocess(corpus, tmp_path / "theirs", hf)[0]
    assert_same_files(tmp_path / "ours_text_document", theirs)
    assert megatron_view(theirs)["dtype"] == np.uint16


def test_json2bin_literal_special_token_as_megatron(tmp_path, cli_env, gpt2_hf):
    """A literal '<|endoftext|>' in the text: the newest Megatron-LM (transformers' GPT-2 tokenizer,
    called as tokenizer(text)) turns it into id 50256; the default policy must do the same."""
    path = tmp_path / "special.jsonl"
    path.write_text(json.dumps({"text": "hello <|endoftext|> world"}) + "\n", encoding="utf-8")
    assert gpt2_hf("hello <|endoftext|> world").input_ids == [31373, 220, 50256, 995]
    for spec in ("vocab.json", "folder"):
        tokenizer = shared(GPT2) / "vocab.json" if spec == "vocab.json" else shared(GPT2)
        run_json2bin(cli_env, [path], tokenizer, tmp_path / spec, "--append-eod", "--workers", "1")
        theirs = megatron_preprocess(path, tmp_path / f"theirs_{spec}", gpt2_hf)[0]
        view = megatron_view(tmp_path / f"{spec}_text_document")
        assert [s.tolist() for s in view["seqs"]] == [[31373, 220, 50256, 995, 50256]], spec
        assert_same_files(tmp_path / f"{spec}_text_document", theirs)


def test_json2bin_golden_fixture_read_by_megatron(tmp_path, cli_env):
    """The reconstructed OpenWebText JSONL + tiny GPT-2 vocab: Megatron's reader sees the fixture's data."""
    fixtures = shared(FIXTURES)
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    (tiny / "vocab.json").write_bytes((fixtures / "gpt2-tiny-vocab.json").read_bytes())
    (tiny / "merges.txt").write_bytes((fixtures / "gpt2-tiny-merges.txt").read_bytes())
    run_json2bin(
        cli_env,
        [fixtures / "openwebtext-1000.reconstructed.jsonl"],
        tiny / "vocab.json",
        tmp_path / "owt",
        "--append-eod",
        "--workers",
        "2",
    )
    ours = tmp_path / "owt_text_document"
    golden = fixtures / "meg-gpt2-openwebtext_text_document"
    assert_same_files(ours, golden)
    view = megatron_view(ours)
    assert view["dtype"] == np.uint16 and len(view["seqs"]) == 1000
    assert view["lengths"].sum() == 1_361_845
