"""Hugging Face datasets as json2bin input, and the lossless round trip JSONL -> bin -> HF -> bin."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llmtools.errors import InputError, OutputExistsError, UsageError
from llmtools.export.hf_export import ExportConfig, export_hf
from llmtools.formats.indexed import IndexedDatasetReader, IndexedDatasetWriter
from llmtools.prep.hf_import import Hf2BinConfig, HFDocumentSource, hf2bin
from llmtools.prep.hf_open import open_hf
from llmtools.prep.json2bin import json2bin
from tests.conftest import shared

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

TEXTS = [
    "First document.",
    "",
    "Second — with ünïcödé ✓ and a newline\n",
    "吾輩は猫である。",
    "x" * 3000,
    "  ",
]


@pytest.fixture(autouse=True)
def hf_cache(tmp_path, monkeypatch):
    """Keep `datasets`' cache inside the test folder, and never reach the network."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hfcache"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def same_files(a: str, b: str) -> bool:
    return all(open(f"{a}{s}", "rb").read() == open(f"{b}{s}", "rb").read() for s in (".bin", ".idx"))


def write_jsonl(path, texts, key="text"):
    path.write_text("".join(json.dumps({key: t}, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
    return path


def outputs(folder, prefix):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(prefix))


# -- the round trip -----------------------------------------------------------------------------------
@pytest.mark.parametrize("append_eod", [False, True])
@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_round_trip_jsonl_bin_hf_bin_is_byte_identical(tmp_path, fmt, append_eod):
    corpus = write_jsonl(tmp_path / "c.jsonl", TEXTS * 50)
    first = json2bin([str(corpus)], "byte", str(tmp_path / "a"), append_eod=append_eod, workers=1,
                     progress=False).prefixes[0]  # fmt: skip
    export_hf(ExportConfig(first, tmp_path / "hf", format=fmt, text=True, tokenizer="byte", progress=False))
    # --text gives the original texts back (without the appended EOD)
    ds = open_hf(tmp_path / "hf")
    texts = [t for batch in ds.batches(["text"]) for t in batch.column("text").to_pylist()]
    assert texts == TEXTS * 50
    # token ids are copied as they are (no tokenizer needed) ...
    result = hf2bin(
        Hf2BinConfig(str(tmp_path / "hf"), str(tmp_path / "b"), json_keys=["input_ids"], progress=False)
    )
    assert result.copied == ["input_ids"] and same_files(first, result.prefixes[0])
    side = json.loads((tmp_path / "b_input_ids_document.json").read_text())
    assert side["tokenizer"]["kind"] == "byte" and side["counts"]["documents"] == len(TEXTS) * 50
    assert side["counts"]["empty_documents"] == 50 and side["append_eod"] is append_eod
    # ... and re-tokenizing the text column gives the same bytes too
    result = hf2bin(Hf2BinConfig(str(tmp_path / "hf"), str(tmp_path / "c"), json_keys=["text"], tokenizer="byte",
                                 append_eod=append_eod, workers=1, progress=False))  # fmt: skip
    assert result.tokenized == ["text"] and same_files(first, result.prefixes[0])


def test_round_trip_real_tokenizer_with_eod(tmp_path):
    corpus = shared("c4-samples/c4-sample.01.json.gz")
    tok = str(shared("tokenizers/gpt2/tokenizer.json"))
    first = json2bin(
        [str(corpus)], tok, str(tmp_path / "a"), append_eod=True, workers=1, progress=False
    ).prefixes[0]
    export_hf(ExportConfig(first, tmp_path / "hf", format="parquet", progress=False))
    result = hf2bin(Hf2BinConfig(str(tmp_path / "hf"), str(tmp_path / "b"), progress=False))
    assert result.copied == ["input_ids"]
    assert same_files(first, result.prefixes[0])
    assert IndexedDatasetReader(result.prefixes[0]).dtype == np.uint16


def test_round_trip_megatron_fixture(tmp_path):
    prefix = str(shared("megatron-deepspeed-fixtures/meg-gpt2-openwebtext_text_document.idx"))[: -len(".idx")]
    export_hf(ExportConfig(prefix, tmp_path / "hf", progress=False))
    result = hf2bin(Hf2BinConfig(str(tmp_path / "hf"), str(tmp_path / "b"), progress=False))
    assert same_files(prefix, result.prefixes[0])


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_round_trip_keeps_sentence_boundaries_and_int32(tmp_path, fmt):
    prefix = str(tmp_path / "sent")
    with IndexedDatasetWriter(prefix, np.int32) as writer:
        writer.add_document([100_000, 2, 3, 4, 5], [2, 3])
        writer.add_document([])
        writer.add_document([7, 8, 9])
        writer.add_document(list(range(10)), [1, 4, 5])
    export_hf(ExportConfig(prefix, tmp_path / "hf", format=fmt, progress=False))
    result = hf2bin(Hf2BinConfig(str(tmp_path / "hf"), str(tmp_path / "b"), progress=False))
    assert same_files(prefix, result.prefixes[0])


# -- text columns from every kind of local dataset ------------------------------------------------------
def make_inputs(tmp_path):
    """The same texts as a Parquet file, an Arrow file, a save_to_disk DatasetDict and a data folder."""
    table = pa.table({"id": list(range(len(TEXTS))), "body": TEXTS})
    pq.write_table(table, tmp_path / "x.parquet", row_group_size=2)
    with pa.OSFile(str(tmp_path / "x.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=4)
    ds = datasets.Dataset.from_dict({"body": TEXTS})
    datasets.DatasetDict({"train": ds, "test": ds.select([0, 1])}).save_to_disk(str(tmp_path / "saved"))
    folder = tmp_path / "folder"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", TEXTS, key="body")
    write_jsonl(folder / "test.jsonl", TEXTS[:2], key="body")
    return {"parquet": tmp_path / "x.parquet", "arrow": tmp_path / "x.arrow", "saved": tmp_path / "saved",
            "folder": folder}  # fmt: skip


def test_text_from_every_kind_equals_jsonl(tmp_path):
    reference = json2bin([str(write_jsonl(tmp_path / "r.jsonl", TEXTS))], "byte", str(tmp_path / "ref"),
                         workers=1, progress=False).prefixes[0]  # fmt: skip
    for name, path in make_inputs(tmp_path).items():
        result = hf2bin(Hf2BinConfig(str(path), str(tmp_path / name), json_keys=["body"], tokenizer="byte",
                                     split="train" if name in ("saved", "folder") else None, workers=1,
                                     progress=False))  # fmt: skip
        assert same_files(reference, result.prefixes[0]), name
        side = json.loads((tmp_path / f"{name}_body_document.json").read_text())
        assert side["json_key"] == "body" and side["inputs"] and side["counts"]["documents"] == len(TEXTS)


def test_split_selection(tmp_path):
    paths = make_inputs(tmp_path)
    for name in ("saved", "folder"):
        source = HFDocumentSource(paths[name], ["body"], split="test")
        assert [t for b in source.batches() for t in b.texts["body"]] == TEXTS[:2]
        assert len(open_hf(paths[name]).batches(["body"]).__next__()) == len(TEXTS)  # default: train


def test_glob_of_parquet_shards(tmp_path):
    for i in range(3):
        pq.write_table(pa.table({"text": TEXTS[i * 2 : i * 2 + 2]}), tmp_path / f"part-{i}.parquet")
    source = HFDocumentSource(str(tmp_path / "part-*.parquet"))
    assert [t for b in source.batches() for t in b.texts["text"]] == TEXTS
    assert len(source.inputs()) == 3 and source.total_bytes > 0


def test_text_column_via_cli_workers(tmp_path):
    """Several workers: order kept, same bytes."""
    paths = make_inputs(tmp_path)
    one = hf2bin(
        Hf2BinConfig(
            str(paths["parquet"]), str(tmp_path / "w1"), ["body"], tokenizer="byte", workers=1, progress=False
        )
    )
    two = hf2bin(
        Hf2BinConfig(
            str(paths["parquet"]), str(tmp_path / "w2"), ["body"], tokenizer="byte", workers=2, progress=False
        )
    )
    assert same_files(one.prefixes[0], two.prefixes[0])


# -- token ids from foreign datasets ---------------------------------------------------------------------
def test_int64_token_lists_use_the_tokenizer_vocabulary(tmp_path):
    ids = [[1, 2, 3], [], [256, 5]]
    datasets.Dataset.from_dict({"input_ids": ids}).save_to_disk(str(tmp_path / "ds"))
    result = hf2bin(Hf2BinConfig(str(tmp_path / "ds"), str(tmp_path / "o"), tokenizer="byte", progress=False))
    reader = IndexedDatasetReader(result.prefixes[0])
    assert reader.dtype == np.uint16 and [reader.document(j).tolist() for j in range(3)] == ids
    # without a vocabulary: a type wide enough for the column (int64 -> int32)
    result = hf2bin(Hf2BinConfig(str(tmp_path / "ds"), str(tmp_path / "p"), progress=False))
    assert IndexedDatasetReader(result.prefixes[0]).dtype == np.int32
    # --append-eod adds the EOD id to non-empty documents only
    result = hf2bin(
        Hf2BinConfig(
            str(tmp_path / "ds"), str(tmp_path / "q"), tokenizer="byte", append_eod=True, progress=False
        )
    )
    reader = IndexedDatasetReader(result.prefixes[0])
    assert [reader.document(j).tolist() for j in range(3)] == [[1, 2, 3, 256], [], [256, 5, 256]]


def test_token_id_outside_vocabulary(tmp_path):
    datasets.Dataset.from_dict({"input_ids": [[1, 2], [3, 999]]}).save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(InputError, match="row 1: token id 999 is outside the vocabulary"):
        hf2bin(Hf2BinConfig(str(tmp_path / "ds"), str(tmp_path / "o"), tokenizer="byte", progress=False))
    assert outputs(tmp_path, "o_") == []


# -- bad input -------------------------------------------------------------------------------------------
def test_missing_column_names_what_exists(tmp_path):
    paths = make_inputs(tmp_path)
    for path in paths.values():
        with pytest.raises(InputError, match=r"no column 'text' \(have .*body"):
            hf2bin(
                Hf2BinConfig(
                    str(path), str(tmp_path / "o"), ["text"], tokenizer="byte", split="train", progress=False
                )
            )
    assert outputs(tmp_path, "o_") == []


def test_missing_split_names_what_exists(tmp_path):
    paths = make_inputs(tmp_path)
    for name in ("saved", "folder"):
        with pytest.raises(InputError, match=r"no split 'validation' \(have .*test"):
            open_hf(paths[name], "validation")


def test_null_text_stops_or_is_skipped(tmp_path):
    pq.write_table(pa.table({"text": ["a", None, "c"]}), tmp_path / "n.parquet")
    with pytest.raises(InputError, match=r"n.parquet: row 1: column 'text' is null"):
        hf2bin(
            Hf2BinConfig(
                str(tmp_path / "n.parquet"), str(tmp_path / "o"), tokenizer="byte", workers=1, progress=False
            )
        )
    assert outputs(tmp_path, "o_") == []
    hf2bin(Hf2BinConfig(str(tmp_path / "n.parquet"), str(tmp_path / "o"), tokenizer="byte", workers=1,
                        skip_bad=True, progress=False))  # fmt: skip
    side = json.loads((tmp_path / "o_text_document.json").read_text())
    assert side["counts"]["documents"] == 2 and side["counts"]["skipped"] == {"not_a_string": 1}


def test_text_needs_a_tokenizer_and_ids_are_not_text(tmp_path):
    pq.write_table(pa.table({"text": ["a"], "input_ids": [[1]]}), tmp_path / "t.parquet")
    with pytest.raises(UsageError, match="--tokenizer"):
        hf2bin(Hf2BinConfig(str(tmp_path / "t.parquet"), str(tmp_path / "o"), progress=False))
    with pytest.raises(InputError, match="column 'input_ids' is list<.*>, not text"):
        HFDocumentSource(tmp_path / "t.parquet", ["input_ids"])


@pytest.mark.parametrize("bad", ["missing", "corrupt-parquet", "corrupt-arrow", "script", "text-file"])
def test_unreadable_sources_are_input_errors(tmp_path, bad):
    if bad == "missing":
        path = tmp_path / "nope"
    elif bad == "corrupt-parquet":
        path = tmp_path / "c.parquet"
        path.write_bytes(b"PAR1 this is not parquet")
    elif bad == "corrupt-arrow":
        path = tmp_path / "c.arrow"
        path.write_bytes(b"\xff" * 64)
    elif bad == "script":
        path = tmp_path / "scripted"
        path.mkdir()
        (path / "scripted.py").write_text("import datasets\n")
    else:
        path = tmp_path / "x.txt"
        path.write_text("hello")
    with pytest.raises(InputError, match=str(path.name)):
        hf2bin(Hf2BinConfig(str(path), str(tmp_path / "o"), tokenizer="byte", workers=1, progress=False))
    assert outputs(tmp_path, "o_") == []


def test_existing_outputs_need_force(tmp_path):
    paths = make_inputs(tmp_path)
    (tmp_path / "o_body_document.idx").write_bytes(b"keep")
    with pytest.raises(OutputExistsError):
        hf2bin(
            Hf2BinConfig(
                str(paths["parquet"]), str(tmp_path / "o"), ["body"], tokenizer="byte", progress=False
            )
        )
    assert (tmp_path / "o_body_document.idx").read_bytes() == b"keep"
    hf2bin(Hf2BinConfig(str(paths["parquet"]), str(tmp_path / "o"), ["body"], tokenizer="byte", force=True,
                        workers=1, progress=False))  # fmt: skip
    assert IndexedDatasetReader(tmp_path / "o_body_document").num_documents == len(TEXTS)


def test_sidecars_follow_the_schema_and_unknown_tokenizers_get_none(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    from tests.conftest import REPO

    schema = json.loads((REPO / "schemas" / "sidecar.schema.json").read_text())
    corpus = write_jsonl(tmp_path / "c.jsonl", TEXTS)
    first = json2bin([str(corpus)], "byte", str(tmp_path / "a"), workers=1, progress=False).prefixes[0]
    export_hf(ExportConfig(first, tmp_path / "hf", text=True, tokenizer="byte", progress=False))
    for key in ("input_ids", "text"):
        hf2bin(
            Hf2BinConfig(
                str(tmp_path / "hf"), str(tmp_path / "b"), [key], tokenizer="byte", workers=1, progress=False
            )
        )
        jsonschema.validate(json.loads((tmp_path / f"b_{key}_document.json").read_text()), schema)
    # a foreign dataset of token ids and no --tokenizer: a plain Megatron pair, no sidecar to invent
    datasets.Dataset.from_dict({"input_ids": [[1, 2], [3]]}).save_to_disk(str(tmp_path / "foreign"))
    result = hf2bin(Hf2BinConfig(str(tmp_path / "foreign"), str(tmp_path / "f"), progress=False))
    assert [p.rsplit(".", 1)[1] for p in result.paths] == ["bin", "idx"]
    assert not (tmp_path / "f_input_ids_document.json").exists() and "no sidecar" in result.summary
