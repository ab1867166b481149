"""llm-export hf, the library side: every format and mode read back with `datasets` equals the indexed reader."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from llmtools.errors import InputError, OutputExistsError, UsageError
from llmtools.export.hf_export import ExportConfig, export_hf, narrowest_dtype, parse_size
from llmtools.formats.indexed import IndexedDatasetReader, IndexedDatasetWriter
from llmtools.formats.sidecar import write_sidecar
from tests.conftest import shared

datasets = pytest.importorskip("datasets")

FORMATS = ["arrow", "parquet"]


def make_prefix(folder, name="src", docs=None, dtype=np.uint16, sidecar=None, seed=0):
    """A small prefix with empty documents at the start, middle and end."""
    rng = np.random.default_rng(seed)
    if docs is None:
        docs = [rng.integers(0, 5000, int(rng.integers(1, 200))) for _ in range(600)]
        docs[0] = docs[300] = docs[-1] = np.empty(0, dtype=np.int64)
    prefix = folder / name
    with IndexedDatasetWriter(prefix, dtype) as writer:
        for doc in docs:
            writer.add_document(doc)
    if sidecar is not None:
        write_sidecar(prefix, sidecar)
    return prefix


def load(out, fmt, tmp_path, split="train"):
    if fmt == "arrow":
        return datasets.load_from_disk(str(out))
    files = sorted(str(p) for p in (out / "data").glob("*.parquet"))
    return datasets.load_dataset("parquet", data_files=files, cache_dir=str(tmp_path / "hfcache"))["train"]


def no_leftovers(folder):
    return [p.name for p in folder.iterdir() if ".tmp-" in p.name or ".old-" in p.name] == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_documents_equal_indexed_reader(tmp_path, fmt):
    prefix = make_prefix(tmp_path)
    out = tmp_path / "out"
    result = export_hf(
        ExportConfig(prefix, out, format=fmt, progress=False, shard_size=20_000, batch_rows=64)
    )
    reader = IndexedDatasetReader(prefix)
    ds = load(out, fmt, tmp_path)
    assert result.rows == len(ds) == reader.num_documents == 600
    assert result.tokens == reader.num_tokens
    assert ds.column_names == ["input_ids"]
    assert ds.features["input_ids"].feature.dtype == "uint16"
    table = ds.data.table if hasattr(ds.data, "table") else ds.data
    for j in range(reader.num_documents):
        assert ds[j]["input_ids"] == reader.document(j).tolist(), j
    shards = [f for f in result.files if f.endswith(("arrow", "parquet"))]
    assert len(shards) > 1, "a small --shard-size must give several shards"
    assert table.num_rows == 600
    assert no_leftovers(tmp_path)


@pytest.mark.parametrize("fmt", FORMATS)
def test_packed_blocks_follow_group_texts(tmp_path, fmt):
    prefix = make_prefix(tmp_path)
    reader = IndexedDatasetReader(prefix)
    flat = reader.tokens()
    n = 100
    out = tmp_path / "packed"
    result = export_hf(
        ExportConfig(prefix, out, format=fmt, packed=True, seq_length=n, progress=False, batch_rows=7)
    )
    ds = load(out, fmt, tmp_path)
    assert len(ds) == reader.num_tokens // n == result.rows
    assert ds.column_names == ["input_ids", "labels"]
    rows = np.array(ds["input_ids"])
    assert rows.shape == (len(ds), n)
    np.testing.assert_array_equal(rows.reshape(-1), flat[: len(ds) * n])
    assert ds["labels"] == ds["input_ids"]
    manifest = json.loads((out / "llmtools.json").read_text())
    assert manifest["dropped_tokens"] == reader.num_tokens % n


@pytest.mark.parametrize("fmt", FORMATS)
def test_split_sentence_documents_keep_sequence_lengths(tmp_path, fmt):
    prefix = tmp_path / "sent"
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        writer.add_document([1, 2, 3, 4, 5], [2, 3])
        writer.add_document([])
        writer.add_document([7, 8, 9])
        writer.add_document(list(range(10)), [1, 4, 5])
    out = tmp_path / "out"
    export_hf(ExportConfig(prefix, out, format=fmt, progress=False))
    ds = load(out, fmt, tmp_path)
    assert ds["input_ids"] == [[1, 2, 3, 4, 5], [], [7, 8, 9], list(range(10))]
    assert ds["sequence_lengths"] == [[2, 3], [], [3], [1, 4, 5]]


def test_megatron_fixture_uint16(tmp_path):
    prefix = str(shared("megatron-deepspeed-fixtures/meg-gpt2-openwebtext_text_document.idx"))[: -len(".idx")]
    out = tmp_path / "owt"
    result = export_hf(ExportConfig(prefix, out, progress=False))
    reader = IndexedDatasetReader(prefix)
    ds = datasets.load_from_disk(str(out))
    assert result.tokens == reader.num_tokens == 1_361_845
    assert ds.features["input_ids"].feature.dtype == "uint16"
    for j in (0, 1, 499, 999):
        assert ds[j]["input_ids"] == reader.document(j).tolist()
        assert ds[j]["input_ids"][-1] == 4999  # every document ends with EOD
    assert "no llmtools sidecar recorded it" in (out / "README.md").read_text()


@pytest.mark.parametrize("fmt", FORMATS)
def test_int32_fixture_stays_int32(tmp_path, fmt):
    prefix = str(shared("megatron-deepspeed-fixtures/bloomtok_ag_news_prompt_inputs_document.idx"))[
        : -len(".idx")
    ]
    out = tmp_path / "bloom"
    export_hf(ExportConfig(prefix, out, format=fmt, progress=False))
    reader = IndexedDatasetReader(prefix)
    ds = load(out, fmt, tmp_path)
    assert ds.features["input_ids"].feature.dtype == "int32"
    assert len(ds) == reader.num_documents == 100
    for j in range(100):
        assert ds[j]["input_ids"] == reader.document(j).tolist()


def test_sidecar_vocabulary_picks_the_narrowest_type(tmp_path):
    docs = [np.array([1, 2, 199]), np.array([5])]
    sidecar = {
        "format": "llmtools.indexed-sidecar",
        "tokenizer": {"vocab_size": 200, "name": "tiny", "hash": "sha256:ab"},
    }
    prefix = make_prefix(tmp_path, docs=docs, sidecar=sidecar)
    out = tmp_path / "out"
    export_hf(ExportConfig(prefix, out, progress=False))
    ds = datasets.load_from_disk(str(out))
    assert ds.features["input_ids"].feature.dtype == "uint8"
    assert ds["input_ids"] == [[1, 2, 199], [5]]
    card = (out / "README.md").read_text()
    assert "vocab_size: `200`" in card and "rows | 2" in card


def test_narrowest_dtype():
    assert narrowest_dtype(256, np.int32) == np.uint8
    assert narrowest_dtype(257, np.int32) == np.uint16
    assert narrowest_dtype(65536, np.int32) == np.uint16
    assert narrowest_dtype(65537, np.uint16) == np.int32
    assert narrowest_dtype(None, np.uint16) == np.uint16


def test_sidecar_vocabulary_too_small_is_an_input_error(tmp_path):
    prefix = make_prefix(tmp_path, docs=[np.array([1, 300])], sidecar={"tokenizer": {"vocab_size": 256}})
    with pytest.raises(InputError, match="300 does not fit uint8"):
        export_hf(ExportConfig(prefix, tmp_path / "out", progress=False))
    assert not (tmp_path / "out").exists() and no_leftovers(tmp_path)


@pytest.mark.parametrize("fmt", FORMATS)
def test_text_column_reproduces_texts_with_byte_tokenizer(tmp_path, fmt):
    from llmtools.tokenize import load_tokenizer

    tok = load_tokenizer("byte")
    texts = ["Hello, world!", "", "naïve café — ünïcödé ✓", "吾輩は猫である。", "line\nbreaks\n\n"]
    docs = [np.array(ids + ([tok.eod_id] if ids else []), dtype=np.int64) for ids in tok.encode_batch(texts)]
    sidecar = {"tokenizer": tok.identity(), "append_eod": True}
    prefix = make_prefix(tmp_path, docs=docs, sidecar=sidecar)
    out = tmp_path / "out"
    export_hf(ExportConfig(prefix, out, format=fmt, text=True, tokenizer="byte", progress=False))
    ds = load(out, fmt, tmp_path)
    assert ds["text"] == texts
    assert ds["input_ids"] == [d.tolist() for d in docs]


def test_text_with_a_different_tokenizer_is_refused(tmp_path):
    sidecar = {
        "tokenizer": {"kind": "hf-json", "name": "gpt2", "hash": "sha256:" + "0" * 64, "vocab_size": 50257}
    }
    prefix = make_prefix(tmp_path, docs=[np.array([1, 2])], sidecar=sidecar)
    with pytest.raises(InputError, match="differs from the source's tokenizer"):
        export_hf(ExportConfig(prefix, tmp_path / "out", text=True, tokenizer="byte", progress=False))
    assert not (tmp_path / "out").exists()


def test_empty_source_gives_an_empty_dataset(tmp_path):
    prefix = make_prefix(tmp_path, docs=[])
    out = tmp_path / "out"
    export_hf(ExportConfig(prefix, out, progress=False))
    ds = datasets.load_from_disk(str(out))
    assert len(ds) == 0 and ds.column_names == ["input_ids"]


def test_existing_output_needs_force(tmp_path):
    prefix = make_prefix(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(OutputExistsError):
        export_hf(ExportConfig(prefix, out, progress=False))
    assert (out / "keep.txt").exists()
    export_hf(ExportConfig(prefix, out, progress=False, force=True))
    assert not (out / "keep.txt").exists()
    assert len(datasets.load_from_disk(str(out))) == 600
    assert no_leftovers(tmp_path)


def corrupt_copy(tmp_path, how):
    prefix = make_prefix(tmp_path)
    idx = tmp_path / "src.idx"
    data = bytearray(idx.read_bytes())
    reader = IndexedDatasetReader(prefix)
    s = reader.num_sequences
    del reader
    if how == "pointer":
        at = 34 + 4 * s + 8 * 400  # byte pointer of sequence 400
        data[at : at + 8] = (12345).to_bytes(8, "little")
    elif how == "truncated-idx":
        data = data[:-5]
    elif how == "magic":
        data[:4] = b"JUNK"
    idx.write_bytes(bytes(data))
    if how == "truncated-bin":
        binf = tmp_path / "src.bin"
        binf.write_bytes(binf.read_bytes()[:-10])
    return prefix


@pytest.mark.parametrize("how", ["pointer", "truncated-idx", "magic", "truncated-bin"])
@pytest.mark.parametrize("packed", [False, True])
def test_corrupt_source_is_an_input_error_and_leaves_nothing(tmp_path, how, packed):
    prefix = corrupt_copy(tmp_path, how)
    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"src\.(idx|bin)"):
        export_hf(ExportConfig(prefix, out, packed=packed, seq_length=64 if packed else None, progress=False))
    assert not out.exists()
    assert no_leftovers(tmp_path)


def test_missing_source(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        export_hf(ExportConfig(tmp_path / "nope", tmp_path / "out", progress=False))
    with pytest.raises(InputError, match="no such file"):
        export_hf(ExportConfig(tmp_path / "nope.json", tmp_path / "out", packed=True, progress=False))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "kwargs, flag",
    [
        ({"format": "csv"}, "--format"),
        ({"text": True}, "--tokenizer"),
        ({"packed": True}, "--seq-length"),
        ({"seq_length": 8}, "--seq-length"),
        ({"packed": True, "seq_length": 0}, "--seq-length"),
        ({"split": "../x"}, "--split"),
    ],
)
def test_config_names_the_flag(tmp_path, kwargs, flag):
    with pytest.raises(UsageError, match=flag):
        ExportConfig(tmp_path / "src", tmp_path / "out", **kwargs)


def test_parse_size():
    assert parse_size("500MB") == 500_000_000
    assert parse_size("1GiB") == 2**30
    assert parse_size("2.5 gb") == 2_500_000_000
    assert parse_size("4096") == 4096
    for bad in ("", "12XB", "-1MB", "0"):
        with pytest.raises(UsageError, match="--shard-size"):
            parse_size(bad)


def test_arrow_layout_is_save_to_disk(tmp_path):
    """Same files and state keys as `Dataset.save_to_disk`, so any `datasets` tool accepts it."""
    prefix = make_prefix(tmp_path)
    out = tmp_path / "ours"
    export_hf(ExportConfig(prefix, out, progress=False))
    ref = tmp_path / "ref"
    datasets.load_from_disk(str(out)).save_to_disk(str(ref))
    ours = {p.name for p in out.iterdir()} - {"README.md", "llmtools.json"}
    assert ours == {p.name for p in ref.iterdir()}
    assert (
        json.loads((out / "state.json").read_text()).keys()
        == json.loads((ref / "state.json").read_text()).keys()
    )
    assert datasets.load_from_disk(str(ref))["input_ids"] == datasets.load_from_disk(str(out))["input_ids"]


def test_parquet_folder_loads_by_its_card(tmp_path):
    prefix = make_prefix(tmp_path)
    out = tmp_path / "pq"
    export_hf(ExportConfig(prefix, out, format="parquet", progress=False))
    dd = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "hfcache"))
    assert list(dd) == ["train"] and len(dd["train"]) == 600


def make_mix(tmp_path, dtypes=(np.uint16, np.uint16), sidecar=None):
    from llmtools.data.mix import build_plan, save_plan
    from llmtools.data.mix_config import Blend, MixConfig

    rng = np.random.default_rng(1)
    prefixes = []
    for k, dtype in enumerate(dtypes):
        prefix = tmp_path / f"part{k}"
        with IndexedDatasetWriter(prefix, dtype) as writer:
            for _ in range(200):
                writer.add_document(rng.integers(0, 5000, int(rng.integers(1, 90))))
        if sidecar is not None:
            write_sidecar(prefix, sidecar)
        prefixes.append(str(prefix))
    weights = [0.7, 0.3][: len(prefixes)]
    plan = build_plan(MixConfig(Blend(prefixes, weights), seq_length=24, num_samples=300, valid_samples=30))
    save_plan(plan, tmp_path / "mix.json")
    return tmp_path / "mix.json"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("split", ["train", "valid"])
def test_mix_export_equals_training_samples_row_for_row(tmp_path, fmt, split):
    from llmtools.data.dataset import BlendedGPTDataset

    mix = make_mix(tmp_path)
    out = tmp_path / "hf"
    result = export_hf(ExportConfig(mix, out, format=fmt, split=split, progress=False, batch_rows=16))
    training = BlendedGPTDataset.from_mix(mix, split=split)
    ds = load(out, fmt, tmp_path)
    assert result.mode == "packed" and len(ds) == len(training) == result.rows
    assert ds.features["input_ids"].feature.dtype == "uint16"
    for i in range(len(training)):
        row = ds[i]
        assert row["input_ids"] == training[i].tolist() == row["labels"], i
    manifest = json.loads((out / "llmtools.json").read_text())
    assert manifest["source"]["kind"] == "mix" and manifest["row_length"] == training.seq_length + 1
    if fmt == "parquet":
        assert (out / "data" / f"{split}-00000-of-00001.parquet").exists()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("same_names", [False, True])
def test_mix_export_names_the_source_of_every_sample(tmp_path, fmt, same_names):
    """The blend can be checked from the dataset: each row's source is the mix source the training
    dataset draws that sample from, by its unique name in the mix.json (two files of one name too)."""
    from collections import Counter

    from llmtools.data.dataset import BlendedGPTDataset

    mix = make_mix(tmp_path)
    if same_names:  # the same file name in two folders
        for k in (0, 1):
            (tmp_path / f"d{k}").mkdir()
            for ext in ("bin", "idx"):
                (tmp_path / f"part{k}.{ext}").rename(tmp_path / f"d{k}" / f"part.{ext}")
        from llmtools.data.mix import build_plan, save_plan
        from llmtools.data.mix_config import Blend, MixConfig

        prefixes = [str(tmp_path / "d0" / "part"), str(tmp_path / "d1" / "part")]
        plan = build_plan(MixConfig(Blend(prefixes, [0.7, 0.3]), seq_length=24, num_samples=300, valid_samples=30))
        save_plan(plan, mix)
    plan = json.loads(mix.read_text())
    names = [s["name"] for s in plan["sources"]]
    assert len(set(names)) == 2
    out = tmp_path / "hf"
    export_hf(ExportConfig(mix, out, format=fmt, progress=False, batch_rows=16))
    ds = load(out, fmt, tmp_path)
    training = BlendedGPTDataset.from_mix(mix, split="train")
    assert ds["source"] == [names[int(d)] for d in training.dataset_index]
    assert Counter(ds["source"]) == {name: s["samples_drawn"] for name, s in zip(names, plan["sources"], strict=True)}
    manifest = json.loads((out / "llmtools.json").read_text())
    assert manifest["features"]["source"]["dtype"] == "string"
    assert "`source` (string)" in (out / "README.md").read_text()


def test_mix_with_int32_and_uint16_sources_and_vocabulary(tmp_path):
    mix = make_mix(tmp_path, dtypes=(np.uint16, np.int32))
    export_hf(ExportConfig(mix, tmp_path / "hf", progress=False))
    ds = datasets.load_from_disk(str(tmp_path / "hf"))
    assert ds.features["input_ids"].feature.dtype == "int32"


def test_mix_seq_length_must_match(tmp_path):
    mix = make_mix(tmp_path)
    with pytest.raises(UsageError, match="--seq-length 99 differs"):
        export_hf(ExportConfig(mix, tmp_path / "hf", seq_length=99, progress=False))
    with pytest.raises(InputError, match="no test split"):
        export_hf(ExportConfig(mix, tmp_path / "hf", split="test", progress=False))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="bad.json"):
        export_hf(ExportConfig(bad, tmp_path / "hf", progress=False))
    assert not (tmp_path / "hf").exists() and no_leftovers(tmp_path)


def test_manifest_follows_its_schema(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    from tests.conftest import REPO

    schema = json.loads((REPO / "schemas" / "hf-export.schema.json").read_text())
    prefix = make_prefix(tmp_path, sidecar={"tokenizer": {"vocab_size": 5000, "name": "t"}})
    (tmp_path / "m").mkdir()
    mix = make_mix(tmp_path / "m")
    configs = [
        ExportConfig(prefix, tmp_path / "docs", progress=False),
        ExportConfig(
            prefix, tmp_path / "packed", format="parquet", packed=True, seq_length=50, progress=False
        ),
        ExportConfig(mix, tmp_path / "mix", progress=False),
    ]
    for config in configs:
        export_hf(config)
        jsonschema.validate(json.loads((config.output / "llmtools.json").read_text()), schema)
