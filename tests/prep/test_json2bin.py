"""json2bin: Megatron golden files, both backends, workers, empty docs, keys, sidecar, atomicity."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from llmtools.errors import InputError, OutputExistsError, RuntimeFailure, UsageError
from llmtools.formats.indexed import IndexedDatasetReader
from llmtools.formats.sidecar import read_sidecar
from llmtools.prep.json2bin import Json2BinConfig, append_eod_ids, json2bin
from llmtools.prep.sources import ListSource
from tests.conftest import REPO, shared

FIX = "megatron-deepspeed-fixtures"


def same_bytes(a, b) -> bool:
    return open(a, "rb").read() == open(b, "rb").read()


@pytest.mark.parametrize("backend,workers", [("gigatoken", 1), ("gigatoken", 2), ("tokenizers", 2)])
def test_golden_openwebtext_byte_identical_to_megatron(tmp_path, backend, workers):
    """openwebtext-1000 + tiny GPT-2 vocab + --append-eod == Megatron's preprocess_data.py output."""
    corpus = shared(f"{FIX}/openwebtext-1000.reconstructed.jsonl")
    golden = shared(f"{FIX}/meg-gpt2-openwebtext_text_document.bin").with_suffix("")
    if backend == "tokenizers":  # the slow backend on a 200-doc prefix keeps the suite fast
        lines = corpus.read_text(encoding="utf-8").splitlines(keepends=True)[:200]
        corpus = tmp_path / "owt200.jsonl"
        corpus.write_text("".join(lines), encoding="utf-8")
    result = json2bin(
        [str(corpus)],
        str(shared(f"{FIX}/gpt2-tiny-vocab.json")),
        str(tmp_path / "owt"),
        append_eod=True,
        workers=workers,
        backend=backend,
        chunk_bytes=1 << 18,
    )
    assert result.backend == backend
    prefix = tmp_path / "owt_text_document"
    assert result.prefixes == [str(prefix)]
    if backend == "tokenizers":
        ours, theirs = IndexedDatasetReader(prefix), IndexedDatasetReader(golden)
        assert ours.num_documents == 200
        assert np.array_equal(ours.tokens(), theirs.tokens()[: ours.num_tokens])
        assert np.array_equal(ours.sequence_lengths, theirs.sequence_lengths[:200])
        return
    assert same_bytes(f"{prefix}.bin", f"{golden}.bin")
    assert same_bytes(f"{prefix}.idx", f"{golden}.idx")
    assert result.documents == 1000 and result.tokens == {"text": 1_361_845}


def test_backends_and_worker_counts_give_identical_files(tmp_path):
    lines = shared("lambada/lambada_test.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)[:1200]
    corpus = tmp_path / "lambada1200.jsonl"
    corpus.write_text(
        "".join(lines) + '{"text": ""}\n' + '{"text": "tail <|endoftext|> text"}\n', encoding="utf-8"
    )
    corpus = str(corpus)
    tok = str(shared("tokenizers/gpt2/tokenizer.json"))
    runs = [("tokenizers", 2), ("gigatoken", 1), ("gigatoken", 3)]
    for backend, workers in runs:
        json2bin(
            [corpus],
            tok,
            str(tmp_path / f"{backend}{workers}"),
            backend=backend,
            workers=workers,
            append_eod=True,
            chunk_bytes=50_000,
        )
    first = tmp_path / "tokenizers2_text_document"
    for backend, workers in runs[1:]:
        other = tmp_path / f"{backend}{workers}_text_document"
        assert same_bytes(f"{first}.bin", f"{other}.bin") and same_bytes(f"{first}.idx", f"{other}.idx")
    assert IndexedDatasetReader(first).num_documents == 1202


def test_c4_gz_inputs_extra_keys_and_stored_ids(tmp_path):
    """Three .gz inputs into one output, in order; the C4 file with stored GPT-2 ids matches exactly."""
    import base64

    files = [shared(f"c4-samples/c4-sample.0{i}.json.gz") for i in (1, 2, 3)]
    golden = shared("c4-samples/c4_100_domains_5_www.theguardian.com_00000000.jsonl.gz")
    result = json2bin(
        [str(f) for f in files] + [str(golden)],
        str(shared("tokenizers/gpt2/vocab.json")),
        str(tmp_path / "c4"),
        workers=2,
    )
    reader = IndexedDatasetReader(tmp_path / "c4_text_document")
    assert reader.num_documents == 40 == result.documents
    rows = [json.loads(line) for line in gzip.open(golden, "rt", encoding="utf-8")]
    for j, row in enumerate(rows):
        want = np.frombuffer(base64.b64decode(row["tokens"]), dtype=">u2")
        assert reader.document(30 + j).tolist() == want.tolist()
    sidecar = read_sidecar(tmp_path / "c4_text_document")
    assert [i["path"] for i in sidecar["inputs"]] == [str(f) for f in files] + [str(golden)]
    assert sidecar["inputs"][0]["size"] == files[0].stat().st_size


def test_empty_documents_and_append_eod_like_megatron(tmp_path):
    texts = ["ab", "", "c", "", ""]
    json2bin(
        source=ListSource(texts),
        tokenizer="byte",
        output_prefix=str(tmp_path / "e"),
        append_eod=True,
        workers=1,
    )
    reader = IndexedDatasetReader(tmp_path / "e_text_document")
    assert reader.document_indices.tolist() == [0, 1, 1, 2, 2, 2]  # empty docs: an index, no sequence
    assert reader.sequence_lengths.tolist() == [3, 2]  # EOD only on non-empty documents
    assert reader.tokens().tolist() == [97, 98, 256, 99, 256]
    sidecar = read_sidecar(tmp_path / "e_text_document")
    assert sidecar["counts"] == {
        "documents": 5,
        "sequences": 2,
        "tokens": 5,
        "empty_documents": 3,
        "skipped": {},
    }


def test_append_eod_ids_vectorized():
    flat, lengths = append_eod_ids(np.array([1, 2, 3]), np.array([0, 2, 0, 1, 0]), 9)
    assert flat.tolist() == [1, 2, 9, 3, 9] and lengths.tolist() == [0, 3, 0, 2, 0]


def test_several_json_keys_and_sidecar_schema(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    src = tmp_path / "qa.jsonl"
    src.write_text("".join(json.dumps({"q": f"question {i}", "a": "x" * i}) + "\n" for i in range(20)))
    result = json2bin(
        [str(src)],
        "byte",
        str(tmp_path / "qa"),
        json_keys=["q", "a"],
        append_eod=True,
        workers=2,
        chunk_bytes=64,
    )
    assert result.prefixes == [str(tmp_path / "qa_q_document"), str(tmp_path / "qa_a_document")]
    assert len(result.paths) == 6
    schema = json.loads((REPO / "schemas" / "sidecar.schema.json").read_text())
    for key, prefix in zip(("q", "a"), result.prefixes, strict=True):
        sidecar = read_sidecar(prefix)
        jsonschema.validate(sidecar, schema)
        assert sidecar["json_key"] == key and sidecar["append_eod"] is True and sidecar["dtype"] == "uint16"
        assert sidecar["tokenizer"]["kind"] == "byte"
    a = IndexedDatasetReader(result.prefixes[1])
    assert a.document_lengths().tolist() == [0] + [i + 1 for i in range(1, 20)]  # "" stays empty, no EOD


def test_skip_bad_counts_by_kind_in_sidecar(tmp_path):
    src = tmp_path / "mixed.jsonl"
    src.write_bytes(b'{"text": "a"}\nnot json\n{"x": 1}\n{"text": 3}\n\n{"text": "\xff"}\n{"text": "b"}\n')
    result = json2bin([str(src)], "byte", str(tmp_path / "m"), skip_bad=True, workers=1)
    assert result.documents == 2
    skipped = read_sidecar(tmp_path / "m_text_document")["counts"]["skipped"]
    assert skipped == {
        "blank_line": 1,
        "invalid_utf8": 1,
        "malformed_json": 1,
        "missing_key": 1,
        "not_a_string": 1,
    }
    assert "5 skipped" in result.summary() or "skipped (" in result.summary()


@pytest.mark.parametrize("workers", [1, 2])
def test_bad_input_stops_and_leaves_nothing(tmp_path, workers):
    good = "".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(500))
    src = tmp_path / "in.jsonl"
    src.write_text(good + '{"text": oops}\n' + good)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(InputError, match=r"in\.jsonl:501: malformed JSON"):
        json2bin([str(src)], "byte", str(out / "x"), workers=workers, chunk_bytes=512)
    assert list(out.iterdir()) == []  # no .bin/.idx/.json, no temporaries


def test_existing_outputs_need_force(tmp_path):
    src = tmp_path / "a.jsonl"
    src.write_text('{"text": "hello"}\n')
    json2bin([str(src)], "byte", str(tmp_path / "a"), workers=1)
    with pytest.raises(OutputExistsError, match=r"a_text_document\.bin: already exists"):
        json2bin([str(src)], "byte", str(tmp_path / "a"), workers=1)
    src.write_text('{"text": "bye"}\n')
    json2bin([str(src)], "byte", str(tmp_path / "a"), workers=1, force=True)
    assert (
        IndexedDatasetReader(tmp_path / "a_text_document").tokens().tobytes().decode("latin1")
        == "\x00".join("bye") + "\x00"
    )


class _Exploding(ListSource):
    def batches(self):
        yield from list(super().batches())[:2]
        raise RuntimeError("disk on fire")


def test_failure_midway_leaves_no_complete_looking_files(tmp_path):
    with pytest.raises(RuntimeFailure, match="disk on fire"):
        json2bin(
            source=_Exploding(["x"] * 100, batch_size=10),
            tokenizer="byte",
            output_prefix=str(tmp_path / "k"),
            workers=1,
        )
    assert list(tmp_path.iterdir()) == []


def test_config_validates_flags():
    with pytest.raises(UsageError, match="--workers"):
        Json2BinConfig(output_prefix="x", workers=0)
    with pytest.raises(UsageError, match="--json-keys: duplicate"):
        Json2BinConfig(output_prefix="x", json_keys=["a", "a"])
    with pytest.raises(UsageError, match="--output"):
        Json2BinConfig()


def test_append_eod_needs_an_eod(tmp_path):
    src = tmp_path / "a.jsonl"
    src.write_text('{"text": "hello"}\n')
    tok = tmp_path / "tok.json"
    from tokenizers import Tokenizer, models, pre_tokenizers

    raw = Tokenizer(models.WordLevel({"hello": 0, "[UNK]": 1}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.save(str(tok))
    with pytest.raises(UsageError, match="--append-eod: tokenizer .* has no end-of-document token"):
        json2bin([str(src)], str(tok), str(tmp_path / "o"), append_eod=True, workers=1)
    json2bin([str(src)], str(tok), str(tmp_path / "o"), workers=1)
    assert IndexedDatasetReader(tmp_path / "o_text_document").tokens().tolist() == [0]


def test_custom_document_source_through_worker_processes(tmp_path):
    """Any DocumentSource plugs in (e.g. an HF dataset reader): DocBatches travel to the workers."""
    texts = {"text": [f"doc {i} " * (i % 5) for i in range(300)], "title": [f"t{i}" for i in range(300)]}
    for workers in (1, 2):
        result = json2bin(
            source=ListSource(texts, name="mem", batch_size=16),
            tokenizer="byte",
            output_prefix=str(tmp_path / f"w{workers}"),
            json_keys=["text", "title"],
            workers=workers,
        )
        assert result.documents == 300 and result.empty_documents == {"text": 60, "title": 0}
    for key in ("text", "title"):
        a, b = tmp_path / f"w1_{key}_document", tmp_path / f"w2_{key}_document"
        assert same_bytes(f"{a}.bin", f"{b}.bin") and same_bytes(f"{a}.idx", f"{b}.idx")
    reader = IndexedDatasetReader(tmp_path / "w2_title_document")
    assert bytes(reader.document(299).astype(np.uint8)) == b"t299"
    with pytest.raises(InputError, match="mem: no column 'body'"):
        json2bin(
            source=ListSource(texts, name="mem"),
            tokenizer="byte",
            output_prefix=str(tmp_path / "x"),
            json_keys=["body"],
            workers=1,
        )


class _Killer:
    """A work item whose worker process dies, as under the OOM killer."""

    def parse(self, keys, skip_bad=False):
        import os

        os._exit(9)


class _KillerSource(ListSource):
    def batches(self):
        yield from super().batches()
        yield _Killer()


def test_dead_worker_is_a_runtime_failure_not_a_hang(tmp_path):
    with pytest.raises(RuntimeFailure, match="a worker process died"):
        json2bin(
            source=_KillerSource(["x"] * 50, batch_size=10),
            tokenizer="byte",
            output_prefix=str(tmp_path / "d"),
            workers=2,
        )
    assert list(tmp_path.iterdir()) == []


# Megatron-LM tools/preprocess_data.py (newest, transformers-based GPT2BPETokenizer; run once on CPU outside
# the repo with the GPT-2 vocab.json/merges.txt and --append-eod) wrote exactly these documents:
MEGATRON_SPECIALS = [
    ("Hello <|endoftext|> world", [15496, 220, 50256, 995, 50256]),
    ("", []),
    ("plain text é 中文", [25638, 2420, 38251, 220, 40792, 23877, 229, 50256]),
    ("<|endoftext|>", [50256, 50256]),
    ("  spaces  ", [220, 9029, 220, 220, 50256]),
    ("x", [87, 50256]),
]


@pytest.mark.parametrize("spec", ["tokenizers/gpt2/vocab.json", "tokenizers/gpt2"])
def test_literal_special_tokens_and_empty_docs_like_megatron(tmp_path, spec):
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t, _ in MEGATRON_SPECIALS))
    json2bin([str(src)], str(shared(spec)), str(tmp_path / "s"), append_eod=True, workers=1)
    reader = IndexedDatasetReader(tmp_path / "s_text_document")
    assert [reader.document(j).tolist() for j in range(reader.num_documents)] == [
        ids for _, ids in MEGATRON_SPECIALS
    ]
    assert reader.document_indices.tolist() == [0, 1, 1, 2, 3, 4, 5]


def test_threaded_gigatoken_pipeline_bad_input_and_skip_bad(tmp_path):
    """gigatoken with workers > 1 encodes in threads of one process (its thread pool does not survive
    fork): the first bad line still stops the run with file:line and leaves nothing, and --skip-bad
    gives the same files and counts as the worker-process path of the tokenizers backend."""
    spec = shared("tokenizers/gpt2/vocab.json")
    good = "".join(json.dumps({"text": f"doc {i} <|endoftext|> é"}) + "\n" for i in range(3000))
    src = tmp_path / "in.jsonl"
    src.write_text(good + '{"text": oops}\n' + good + '{"text": 5}\n\n' + good)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(InputError, match=r"in\.jsonl:3001: malformed JSON"):
        json2bin([str(src)], spec, str(out / "x"), backend="gigatoken", workers=2, chunk_bytes=4096)
    assert list(out.iterdir()) == []
    runs = {}
    for backend in ("gigatoken", "tokenizers"):
        runs[backend] = json2bin(
            [str(src)],
            spec,
            str(tmp_path / backend),
            backend=backend,
            workers=2,
            skip_bad=True,
            append_eod=True,
            chunk_bytes=4096,
        )
        assert runs[backend].backend == backend
    assert (
        runs["gigatoken"].skipped
        == runs["tokenizers"].skipped
        == {
            "blank_line": 1,
            "malformed_json": 1,
            "not_a_string": 1,
        }
    )
    for suffix in (".bin", ".idx"):
        assert same_bytes(
            tmp_path / f"gigatoken_text_document{suffix}", tmp_path / f"tokenizers_text_document{suffix}"
        )
