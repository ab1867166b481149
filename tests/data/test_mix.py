"""Whole plans against megatron-core's BlendedMegatronDatasetBuilder: every array and every sample."""

from __future__ import annotations

import json
import os
import tempfile
import warnings

import numpy as np
import pytest

from llmtools.data import mix as M
from llmtools.data.dataset import BlendedGPTDataset
from llmtools.errors import InputError, UsageError
from llmtools.formats.indexed import IndexedDatasetWriter
from llmtools.formats.mix import read_mix
from llmtools.formats.sidecar import write_sidecar

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig


def write_source(prefix, num_docs, seed, dtype=np.uint16, max_len=200, tokenizer_hash=None, vocab=50000):
    rng = np.random.RandomState(seed)
    with IndexedDatasetWriter(prefix, dtype, durable=False) as writer:
        for _ in range(num_docs):
            writer.add_document(rng.randint(0, vocab, size=rng.randint(1, max_len)))
    if tokenizer_hash is not None:
        write_sidecar(
            prefix,
            {
                "format": "llmtools.indexed-sidecar",
                "version": 1,
                "tokenizer": {
                    "kind": "byte",
                    "source": "byte",
                    "name": "byte-test",
                    "hash": tokenizer_hash,
                    "vocab_size": vocab,
                    "eod_id": 0,
                    "bos_id": None,
                },
            },
        )
    return str(prefix)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    d = tmp_path_factory.mktemp("mixsrc")
    return [write_source(d / "a", 400, 1), write_source(d / "b", 150, 2), write_source(d / "c", 60, 3)]


class _Tok:
    vocab_size = 50000
    eod = 0
    pad = -1
    special_tokens_dict: dict = {}
    unique_identifiers = {"name": "test"}


def megatron_build(sizes, seq, seed, blend=None, split=None, blend_per_split=None):
    # megatron-core caches its index arrays beside the data unless told otherwise, and the data may be the
    # read-only shared fixtures: give it a cache of its own (the arrays stay mapped after the folder goes).
    # With a cache path megatron-core asks torch.distributed for the rank: a one-process group, no port.
    import torch.distributed as tdist

    own_group = not tdist.is_initialized()
    if own_group:
        tdist.init_process_group("gloo", store=tdist.HashStore(), rank=0, world_size=1)
    try:
        with tempfile.TemporaryDirectory(prefix="megatron-cache-") as cache:
            return _megatron_build(sizes, seq, seed, blend, split, blend_per_split, cache)
    finally:
        if own_group:
            tdist.destroy_process_group()


def _megatron_build(sizes, seq, seed, blend, split, blend_per_split, cache):
    config = GPTDatasetConfig(
        random_seed=seed,
        sequence_length=seq,
        blend=blend,
        split=split,
        blend_per_split=blend_per_split,
        tokenizer=_Tok(),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        path_to_cache=cache,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()


def assert_split_equal(ours: BlendedGPTDataset, theirs, check_samples=True):
    if hasattr(theirs, "dataset_index"):  # BlendedDataset
        np.testing.assert_array_equal(ours.dataset_index, theirs.dataset_index)
        np.testing.assert_array_equal(ours.dataset_sample_index, theirs.dataset_sample_index)
        assert len(ours) == len(theirs)
        subs = theirs.datasets
    else:  # one GPTDataset: our blend is the identity over exactly num_samples samples
        subs = [theirs]
        assert len(ours) == theirs.num_samples
    assert len(ours.parts) == len(subs)
    for part, sub in zip(ours.parts, subs, strict=True):
        for name in ("document_index", "sample_index", "shuffle_index"):
            mine, megatron = getattr(part, name), getattr(sub, name)
            assert mine.dtype == megatron.dtype, name
            np.testing.assert_array_equal(mine, megatron, err_msg=name)
    if check_samples:
        for i in range(len(ours)):
            text = ours[i]
            assert text.shape == (ours.seq_length + 1,)
            item = theirs[i]
            np.testing.assert_array_equal(item["tokens"].numpy(), text[:-1].astype(np.int64))
            np.testing.assert_array_equal(item["labels"].numpy(), text[1:].astype(np.int64))


@pytest.mark.parametrize(
    "weights, seq, sizes, split, seed",
    [
        ([0.7, 0.3], 64, [800, 40, 10], "90,8,2", 1234),  # 2 sources
        ([0.5, 0.3, 0.2], 64, [1000, 50, 10], "90,8,2", 1234),  # 3 sources, several epochs
        ([0.001, 0.999], 32, [3000, 0, 0], "98,1,1", 1234),  # extreme weights
        ([0.999, 0.001], 32, [3000, 0, 0], "98,1,1", 42),
        ([2, 1, 1], 128, [300, 30, 0], "80,20", 5),  # unnormalised weights, 2-part split
    ],
)
def test_plan_equals_megatron(sources, tmp_path, weights, seq, sizes, split, seed):
    prefixes = sources[: len(weights)]
    config = M.MixConfig(
        M.Blend(prefixes, weights),
        seq,
        num_samples=sizes[0],
        valid_samples=sizes[1],
        test_samples=sizes[2],
        seed=seed,
        split=split,
    )
    plan = M.build_plan(config)
    M.save_plan(plan, tmp_path / "mix.json")
    theirs = megatron_build(sizes, seq, seed, blend=(prefixes, weights), split=split)
    for i, name in enumerate(("train", "valid", "test")):
        if sizes[i] == 0:
            assert name not in plan.splits
            continue
        assert_split_equal(
            BlendedGPTDataset.from_mix(tmp_path / "mix.json", split=name), theirs[i], check_samples=i == 0
        )


def test_weights_from_sizes_equal_megatron(sources):
    """Prefixes without weights: one epoch each, weighed by their lengths (Megatron's 'weights is None')."""
    config = M.MixConfig(M.Blend(sources, None), 64, num_samples=500, split="80,10,10")
    plan = M.build_plan(config)
    theirs = megatron_build([500, 0, 0], 64, 1234, blend=(sources, None), split="80,10,10")
    assert_split_equal(BlendedGPTDataset.from_plan(plan, "train"), theirs[0])


def test_single_prefix_equals_megatron_gpt_dataset(sources):
    config = M.MixConfig(M.Blend(sources[:1], None), 64, num_samples=700, split="98,1,1")
    plan = M.build_plan(config)
    theirs = megatron_build([700, 0, 0], 64, 1234, blend=(sources[:1], None), split="98,1,1")
    assert_split_equal(BlendedGPTDataset.from_plan(plan, "train"), theirs[0])


def test_per_split_blends_equal_megatron(sources):
    per_split = {
        "train": M.Blend(sources[:2], [0.6, 0.4]),
        "valid": M.Blend(sources[1:], [1.0, 3.0]),
        "test": M.Blend(sources[2:], [1.0]),  # a lone weighted prefix: Megatron reads it without a blend
    }
    config = M.MixConfig(
        None, 64, num_samples=600, valid_samples=80, test_samples=15, blend_per_split=per_split
    )
    plan = M.build_plan(config)
    theirs = megatron_build(
        [600, 80, 15],
        64,
        1234,
        blend_per_split=[(sources[:2], [0.6, 0.4]), (sources[1:], [1.0, 3.0]), (sources[2:], [1.0])],
    )
    for i, name in enumerate(("train", "valid", "test")):
        assert_split_equal(BlendedGPTDataset.from_plan(plan, name), theirs[i])


def test_split_sizes_must_match_blends(sources):
    with pytest.raises(UsageError, match="no --valid-data-path"):
        M.build_plan(
            M.MixConfig(
                None, 16, num_samples=5, valid_samples=5, blend_per_split={"train": M.Blend(sources[:1])}
            )
        )
    with pytest.raises(UsageError, match="--valid-samples is 0"):
        M.build_plan(
            M.MixConfig(
                None,
                16,
                num_samples=5,
                blend_per_split={"train": M.Blend(sources[:1]), "valid": M.Blend(sources[1:2])},
            )
        )
    with pytest.raises(UsageError, match="gives the test split no data"):
        M.build_plan(M.MixConfig(M.Blend(sources[:1]), 16, num_samples=5, test_samples=5, split="90,10"))


def test_mix_json_contents(sources, tmp_path):
    config = M.MixConfig(
        M.Blend(sources[:2], [0.7, 0.3]), 64, tokens=64 * 500, valid_samples=10, split="90,8,2"
    )
    plan = M.build_plan(config)
    written = M.save_plan(plan, tmp_path / "mix.json")
    data = read_mix(tmp_path / "mix.json")
    assert written[0] == tmp_path / "mix.json" and all(p.exists() for p in written)
    assert data["seq_length"] == 64 and data["seed"] == 1234 and data["split"] == "90,8,2"
    assert (
        data["splits"]["train"]["requested_samples"] == 500 and data["splits"]["train"]["num_samples"] == 500
    )
    src = data["sources"][0]
    for key in (
        "prefix",
        "weight",
        "normalized_weight",
        "documents",
        "tokens",
        "samples_drawn",
        "epochs",
        "realized_share",
    ):
        assert key in src
    # shares computed in float64 from integer counts: default rel=1e-6 is far above their ulps
    assert src["normalized_weight"] == pytest.approx(0.7) and src["realized_share"] == pytest.approx(
        0.7, abs=1 / 500
    )
    assert data["cache"]["hash"] == plan.hash
    for name in data["cache"]["files"]["train"].values():
        assert name.startswith(f"mix.cache/{plan.hash}") and (tmp_path / name).exists()  # one folder
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]  # atomic writes leave nothing behind
    # schema check when jsonschema is around (it is a test dependency)
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((M.Path(__file__).resolve().parents[2] / "schemas" / "mix.schema.json").read_text())
    jsonschema.validate(data, schema)


def test_hash_is_content_not_path(sources, tmp_path):
    config = M.MixConfig(M.Blend(sources[:2], [0.7, 0.3]), 64, num_samples=100)
    same = M.MixConfig(M.Blend(sources[:2], [0.7, 0.3]), 64, num_samples=100)
    other = M.MixConfig(M.Blend(sources[:2], [0.7, 0.3]), 64, num_samples=100, seed=1)
    assert M.build_plan(config).hash == M.build_plan(same).hash != M.build_plan(other).hash


def test_config_errors(sources):
    with pytest.raises(UsageError, match="2 weight"):
        M.Blend(sources, [0.5, 0.5])
    with pytest.raises(UsageError, match="exactly one of"):
        M.MixConfig(M.Blend(sources[:1]), 64)
    with pytest.raises(UsageError, match="exactly one of"):
        M.MixConfig(M.Blend(sources[:1]), 64, num_samples=5, tokens=5)
    with pytest.raises(UsageError, match="--seq-length"):
        M.MixConfig(M.Blend(sources[:1]), 0, num_samples=5)
    with pytest.raises(UsageError, match="--num-samples"):
        M.MixConfig(M.Blend(sources[:1]), 8, num_samples=-1)
    with pytest.raises(InputError, match="--split"):
        M.MixConfig(M.Blend(sources[:1]), 8, num_samples=5, split="90,-10")


def test_source_errors(sources, tmp_path):
    def plan(prefixes, **kw):
        return M.build_plan(M.MixConfig(M.Blend(prefixes, None), 16, num_samples=10, **kw))

    with pytest.raises(InputError, match="no such dataset"):
        plan([str(tmp_path / "missing")])
    empty = tmp_path / "empty"
    with IndexedDatasetWriter(empty, np.uint16, durable=False) as w:
        w.add_documents(np.array([], np.uint16), np.array([0, 0]))
    with pytest.raises(InputError, match="empty"):
        plan([str(empty)])
    corrupt = tmp_path / "corrupt"
    write_source(corrupt, 10, 0)
    with open(f"{corrupt}.idx", "r+b") as handle:
        handle.truncate(40)
    with pytest.raises(InputError, match="corrupt.idx"):
        plan([str(corrupt)])
    truncated = tmp_path / "truncated"
    write_source(truncated, 10, 0)
    with open(f"{truncated}.bin", "r+b") as handle:
        handle.truncate(8)
    with pytest.raises(InputError, match="truncated"):
        plan([str(truncated)])
    with pytest.raises(InputError, match="split is empty"):
        plan(sources[2:], valid_samples=5, split="999,1")  # 60 sequences: round(0.999*60) == 60


def test_mixed_tokenizers(tmp_path):
    a = write_source(tmp_path / "a", 30, 1, tokenizer_hash="sha256:aaa")
    b = write_source(tmp_path / "b", 30, 2, tokenizer_hash="sha256:bbb")
    c = write_source(tmp_path / "c", 30, 3, tokenizer_hash="sha256:aaa")
    bare = write_source(tmp_path / "bare", 30, 4)
    with pytest.raises(InputError, match="different tokenizers"):
        M.build_plan(M.MixConfig(M.Blend([a, b], [1, 1]), 16, num_samples=10))
    plan = M.build_plan(M.MixConfig(M.Blend([a, b], [1, 1]), 16, num_samples=10, allow_mixed_tokenizers=True))
    assert plan.tokenizer is None and any("mixed" in n for n in plan.notes)
    plan = M.build_plan(M.MixConfig(M.Blend([a, c, bare], [1, 1, 1]), 16, num_samples=10))
    assert plan.tokenizer["hash"] == "sha256:aaa"
    assert any("bare" in n and "no sidecar" in n for n in plan.notes)
    ds = BlendedGPTDataset.from_plan(plan)
    assert ds.vocab_size == 50000 and ds.tokenizer["name"] == "byte-test"


def test_zero_and_tiny_weights_warn(sources):
    plan = M.build_plan(M.MixConfig(M.Blend(sources, [1.0, 0.0, 1e-9]), 16, num_samples=50))
    assert any("weight 0" in w for w in plan.warnings)
    assert [c.source for c in plan.splits["train"].components] == [0, 2]
    text = M.explain(plan)
    assert "requested" in text and "realized" in text


def test_epoch_warnings(sources):
    plan = M.build_plan(M.MixConfig(M.Blend(sources, [0.2, 0.2, 0.6]), 64, num_samples=2000, max_epochs=2))
    assert any("repeated" in w and "more than 2" in w for w in plan.warnings)


def test_cache_rebuilt_when_deleted(sources, tmp_path):
    config = M.MixConfig(M.Blend(sources[:2], [0.7, 0.3]), 32, num_samples=300)
    written = M.save_plan(M.build_plan(config), tmp_path / "mix.json")
    before = BlendedGPTDataset.from_mix(tmp_path / "mix.json").batch(np.arange(300))
    for path in written[1:]:
        path.unlink()
    after = BlendedGPTDataset.from_mix(tmp_path / "mix.json").batch(np.arange(300))
    np.testing.assert_array_equal(before, after)
    assert all(p.exists() for p in written)  # and written back


def test_changed_source_is_detected(tmp_path):
    a = write_source(tmp_path / "a", 50, 1)
    b = write_source(tmp_path / "b", 50, 2)
    written = M.save_plan(
        M.build_plan(M.MixConfig(M.Blend([a, b], [1, 1]), 16, num_samples=20)), tmp_path / "mix.json"
    )
    write_source(tmp_path / "a", 51, 1)
    with pytest.raises(InputError, match="changed"):
        BlendedGPTDataset.from_mix(tmp_path / "mix.json")
    for path in written[1:]:
        path.unlink()
    with pytest.raises(InputError, match="changed"):
        BlendedGPTDataset.from_mix(tmp_path / "mix.json")


@pytest.mark.parametrize(
    "text, message",
    [
        ("{", "not a valid mix.json"),
        ("[]", "JSON object"),
        ('{"format": "other"}', "format"),
        ('{"format": "llmtools.mix", "version": 1}', "seq_length"),
        (
            '{"format": "llmtools.mix", "version": 2, "seq_length": 8, "seed": 1, "sources": [], "splits": {}, "cache": {}}',
            "version",
        ),
    ],
)
def test_bad_mix_json(tmp_path, text, message):
    path = tmp_path / "mix.json"
    path.write_text(text)
    with pytest.raises(InputError, match=message):
        read_mix(path)
    with pytest.raises(InputError):
        BlendedGPTDataset.from_mix(path)


def test_no_weights_caps_at_one_epoch_with_a_warning(sources):
    plan = M.build_plan(M.MixConfig(M.Blend(sources[:2], None), 64, num_samples=10**6))
    train = plan.splits["train"]
    assert train.size == sum(c.indices.num_samples for c in train.components) < 10**6
    assert all(c.indices.num_epochs == 1 for c in train.components)
    assert any("one epoch" in w for w in plan.warnings)


def test_real_megatron_made_sources_equal_megatron(tmp_path, shared_data):
    """Files that Megatron's preprocess_data.py wrote (no sidecars): uint16 OpenWebText + int32 AG News."""
    shared = shared_data
    owt = str(shared("megatron-deepspeed-fixtures/meg-gpt2-openwebtext_text_document.bin"))[: -len(".bin")]
    ag = str(shared("megatron-deepspeed-fixtures/bloomtok_ag_news_prompt_inputs_document.bin"))[
        : -len(".bin")
    ]
    config = M.MixConfig(M.Blend([owt, ag], [0.9, 0.1]), 256, num_samples=1500, split="98,1,1")
    plan = M.build_plan(config)
    assert sum("no sidecar" in note for note in plan.notes) == 2 and plan.tokenizer is None
    M.save_plan(plan, tmp_path / "mix.json")
    ours = BlendedGPTDataset.from_mix(tmp_path / "mix.json")
    assert [p.tokens.dtype for p in ours.parts] == [np.uint16, np.int32]
    assert (
        ours.parts[1].reader.num_sequences == 100
        and plan.splits["train"].components[1].indices.num_epochs > 1
    )
    theirs = megatron_build([1500, 0, 0], 256, 1234, blend=([owt, ag], [0.9, 0.1]), split="98,1,1")[0]
    assert_split_equal(ours, theirs, check_samples=False)
    for i in range(0, len(ours), 7):
        np.testing.assert_array_equal(theirs[i]["tokens"].numpy(), ours[i][:-1].astype(np.int64))


@pytest.mark.parametrize("name", ["mix.json", "plan.v2.json", "blend"])
def test_the_index_cache_lives_in_one_folder_beside_the_mix_and_comes_back_there(sources, tmp_path, name):
    """NAME.json's cache is NAME.cache/ (nothing else beside the mix.json); deleted, the next open rebuilds
    it there with the same bytes; a mix.json written with its cache beside it (the older layout) still
    reads and is restored beside it; a failed save leaves no cache folder."""
    import shutil

    from llmtools.data.dataset import BlendedGPTDataset

    plan = M.build_plan(M.MixConfig(M.Blend(sources[:2], [0.6, 0.4]), 32, num_samples=200, valid_samples=10))
    mix = tmp_path / name
    M.save_plan(plan, mix)
    cache = tmp_path / (name.removesuffix(".json") + ".cache")
    assert sorted(os.listdir(tmp_path)) == sorted([mix.name, cache.name])
    before = {p.name: p.read_bytes() for p in cache.iterdir()}
    first = BlendedGPTDataset.from_mix(mix)[3].tolist()
    shutil.rmtree(cache)
    assert BlendedGPTDataset.from_mix(mix)[3].tolist() == first
    assert {p.name: p.read_bytes() for p in cache.iterdir()} == before  # rebuilt in its folder, identically

    # the older layout: the files beside the mix.json, named so in cache.files
    data = json.loads(mix.read_text())
    for split, names in data["cache"]["files"].items():
        data["cache"]["files"][split] = {k: v.split("/", 1)[1] for k, v in names.items()}
    old = tmp_path / "old"
    old.mkdir()
    for file in cache.iterdir():
        shutil.copyfile(file, old / file.name)
    (old / "mix.json").write_text(json.dumps(data))
    assert BlendedGPTDataset.from_mix(old / "mix.json")[3].tolist() == first
    for file in list(old.glob("*.npy")):
        file.unlink()
    assert BlendedGPTDataset.from_mix(old / "mix.json")[3].tolist() == first
    assert sorted(p.name for p in old.glob("*.npy")) == sorted(before) and not (old / "mix.cache").exists()


def test_a_failed_save_leaves_no_cache_folder(sources, tmp_path, monkeypatch):
    plan = M.build_plan(M.MixConfig(M.Blend(sources[:1]), 32, num_samples=50))

    def broken(*args, **kwargs):
        raise OSError("disk gone")

    monkeypatch.setattr(M, "mix_text", broken)
    with pytest.raises(OSError, match="disk gone"):
        M.save_plan(plan, tmp_path / "mix.json")
    assert os.listdir(tmp_path) == []
