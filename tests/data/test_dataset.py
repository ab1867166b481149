"""The training dataset and the micro-batch sampler: shapes, zero copies, determinism, resume, sharding."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtools.data import mix as M
from llmtools.data.dataset import BlendedGPTDataset, MicroBatchSampler
from llmtools.errors import InputError, UsageError
from llmtools.formats.indexed import IndexedDatasetWriter


def write_source(prefix, num_docs, seed, dtype=np.uint16, max_len=150):
    rng = np.random.RandomState(seed)
    with IndexedDatasetWriter(prefix, dtype, durable=False) as writer:
        for _ in range(num_docs):
            writer.add_document(rng.randint(0, 30000, size=rng.randint(1, max_len)))
    return str(prefix)


@pytest.fixture(scope="module")
def prefixes(tmp_path_factory):
    d = tmp_path_factory.mktemp("dssrc")
    return [write_source(d / "a", 300, 1), write_source(d / "b", 100, 2, dtype=np.int32)]


@pytest.fixture(scope="module")
def dataset(prefixes):
    return BlendedGPTDataset.from_prefixes(
        prefixes, [0.6, 0.4], seq_length=32, num_samples=500, seed=1234, split="90,10"
    )


def flat_stream(part):
    """The part's tokens in document-index order, flattened: what the samples cut from."""
    return np.concatenate([part.reader[int(s)] for s in part.document_index]).astype(np.int64)


def test_every_sample_is_seq_plus_one_tokens_of_its_stream(dataset):
    assert len(dataset) == 500 and dataset.seq_length == 32
    streams = [flat_stream(p) for p in dataset.parts]
    for i in range(len(dataset)):
        sample = dataset[i]
        assert sample.shape == (33,)
        d, j, k = dataset.locate(i)
        np.testing.assert_array_equal(sample.astype(np.int64), streams[d][k * 32 : k * 32 + 33])


def test_single_document_sample_is_a_view(dataset):
    views = 0
    for i in range(len(dataset)):
        d, runs = dataset.runs(i)
        if len(runs) == 1:
            sample = dataset[i]
            assert (
                not sample.flags.owndata and not sample.flags.writeable
            )  # a view of the read-only memory map
            assert np.shares_memory(sample, dataset.parts[d].tokens)
            views += 1
    assert views > 0


def test_batch_equals_getitem(dataset):
    indices = np.random.RandomState(0).randint(0, len(dataset), size=200)
    block = dataset.batch(indices)
    assert block.dtype == np.int64 and block.shape == (200, 33)
    for row, i in zip(block, indices, strict=True):
        np.testing.assert_array_equal(row, dataset[int(i)].astype(np.int64))
    assert dataset.batch([]).shape == (0, 33)


def test_deterministic_and_same_as_from_mix(prefixes, dataset, tmp_path):
    again = BlendedGPTDataset.from_prefixes(
        prefixes, [0.6, 0.4], seq_length=32, num_samples=500, seed=1234, split="90,10"
    )
    np.testing.assert_array_equal(dataset.batch(np.arange(500)), again.batch(np.arange(500)))
    assert dataset.fingerprint == again.fingerprint
    plan = M.build_plan(M.MixConfig(M.Blend(prefixes, [0.6, 0.4]), 32, num_samples=500, split="90,10"))
    M.save_plan(plan, tmp_path / "mix.json")
    from_mix = BlendedGPTDataset.from_mix(tmp_path / "mix.json")
    np.testing.assert_array_equal(dataset.batch(np.arange(500)), from_mix.batch(np.arange(500)))
    other_seed = BlendedGPTDataset.from_prefixes(
        prefixes, [0.6, 0.4], seq_length=32, num_samples=500, seed=1, split="90,10"
    )
    assert not np.array_equal(dataset.batch(np.arange(50)), other_seed.batch(np.arange(50)))
    assert other_seed.fingerprint != dataset.fingerprint


def test_valid_split_from_prefixes_and_cache_dir(prefixes, tmp_path):
    valid = BlendedGPTDataset.from_prefixes(
        prefixes, [1, 1], 16, 40, split="90,10", split_name="valid", cache_dir=tmp_path / "cache"
    )
    assert valid.split == "valid" and len(valid) == 40
    assert any((tmp_path / "cache").glob("*-valid-dataset_index.npy"))
    lo = [c for c in valid.parts]
    assert all(
        int(p.document_index.min()) >= int(0.9 * p.reader.num_sequences) - 1 for p in lo
    )  # held-out sequences only
    with pytest.raises(InputError, match="no test split"):
        BlendedGPTDataset.from_prefixes(prefixes, [1, 1], 16, 40, split="90,10", split_name="test")


def test_from_mix_missing_split(prefixes, tmp_path):
    M.save_plan(
        M.build_plan(M.MixConfig(M.Blend(prefixes, [1, 1]), 16, num_samples=20)), tmp_path / "mix.json"
    )
    with pytest.raises(InputError, match="no valid split"):
        BlendedGPTDataset.from_mix(tmp_path / "mix.json", split="valid")
    with pytest.raises(UsageError):
        BlendedGPTDataset.from_mix(tmp_path / "mix.json", split="dev")
    with pytest.raises(InputError, match="no such file"):
        BlendedGPTDataset.from_mix(tmp_path / "nope.json")


def test_pickles_without_copying_the_tokens(dataset):
    import pickle

    blob = pickle.dumps(dataset)
    assert len(blob) < sum(p.tokens.nbytes for p in dataset.parts)  # the .bin is reopened, not shipped
    clone = pickle.loads(blob)
    np.testing.assert_array_equal(clone.batch(np.arange(len(clone))), dataset.batch(np.arange(len(dataset))))
    assert clone.fingerprint == dataset.fingerprint


def test_index_errors(dataset):
    with pytest.raises(IndexError):
        dataset[len(dataset)]
    np.testing.assert_array_equal(dataset[-1], dataset[len(dataset) - 1])


# -- sampler --------------------------------------------------------------------------------------------
def collect(num_samples, micro, global_batch, world, consumed=0):
    return [
        list(MicroBatchSampler(num_samples, micro, global_batch, r, world, consumed)) for r in range(world)
    ]


@settings(max_examples=80, deadline=None)
@given(
    st.integers(min_value=1, max_value=4),  # micro batch
    st.integers(min_value=1, max_value=4),  # world size
    st.integers(min_value=1, max_value=4),  # gradient accumulation
    st.integers(min_value=0, max_value=300),
)
def test_shards_partition_each_global_batch(micro, world, gas, num_samples):
    global_batch = micro * world * gas
    shards = collect(num_samples, micro, global_batch, world)
    assert len({len(s) for s in shards}) == 1
    steps = len(shards[0]) // gas
    for g in range(steps):
        got = sorted(i for rank in shards for mb in rank[g * gas : (g + 1) * gas] for i in mb)
        assert got == list(range(g * global_batch, (g + 1) * global_batch))  # no overlap, nothing missing
    for rank in shards:
        assert all(len(mb) == micro for mb in rank)


@settings(max_examples=80, deadline=None)
@given(
    st.integers(min_value=1, max_value=3),
    st.integers(min_value=1, max_value=3),
    st.integers(min_value=1, max_value=3),
    st.integers(min_value=1, max_value=40),
    st.data(),
)
def test_resume_continues_the_same_sequence(micro, world, gas, steps, data):
    global_batch = micro * world * gas
    num_samples = steps * global_batch
    full = collect(num_samples, micro, global_batch, world)
    done = data.draw(st.integers(min_value=0, max_value=steps))  # resume after `done` global batches
    resumed = collect(num_samples, micro, global_batch, world, consumed=done * global_batch)
    for rank in range(world):
        assert resumed[rank] == full[rank][done * gas :]


def test_resume_from_any_count_keeps_global_order():
    full = [i for mb in MicroBatchSampler(100, 1, 1, 0, 1) for i in mb]
    for consumed in (0, 1, 37, 99, 100):
        assert [i for mb in MicroBatchSampler(100, 1, 1, 0, 1, consumed) for i in mb] == full[consumed:]


def test_resumed_dataset_samples_identical(dataset):
    sampler = MicroBatchSampler(len(dataset), 2, 8, 1, 2)
    batches = [dataset.batch(mb) for mb in sampler]
    resumed = [
        dataset.batch(mb) for mb in MicroBatchSampler(len(dataset), 2, 8, 1, 2, consumed_samples=8 * 10)
    ]
    skipped = 10 * 8 // (2 * 2)  # 10 global batches of 8 = 20 micro-batches of 2 on each of 2 ranks
    assert len(resumed) == len(batches) - skipped
    for a, b in zip(batches[skipped:], resumed, strict=True):
        np.testing.assert_array_equal(a, b)


def test_sampler_errors():
    with pytest.raises(UsageError, match="multiple"):
        MicroBatchSampler(10, 2, 6, 0, 2)
    with pytest.raises(UsageError, match="rank"):
        MicroBatchSampler(10, 1, 2, 2, 2)
    with pytest.raises(UsageError):
        MicroBatchSampler(10, 0, 2, 0, 1)
    assert len(MicroBatchSampler(10, 2, 4, 0, 2)) == 2
