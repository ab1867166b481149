"""GPTDataset document / sample / shuffle indices, element by element against megatron-core's functions."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtools import _native
from llmtools.data import gpt_index as G

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.datasets import helpers as megatron_helpers
    from megatron.core.datasets.gpt_dataset import _build_document_index, _build_shuffle_index


def megatron_indices(lengths, beg, end, num_samples, seq, seed):
    """What GPTDataset._build_document_sample_shuffle_indices computes, with Megatron's own pieces."""
    documents = np.arange(beg, end, dtype=np.int32)
    tpe = int(np.sum(lengths[documents]))
    epochs, tokens = 1, tpe
    while tokens < num_samples * seq + 1:
        epochs += 1
        tokens += tpe
    separate = False
    if epochs > 1:
        sans = ((epochs - 1) * tpe - 1) // seq
        per_epoch = (tpe - 1) // seq
        separate = num_samples - sans < int(0.8 * per_epoch)
    rng = np.random.RandomState(seed)
    doc = _build_document_index(documents, epochs, rng, separate)
    sample = megatron_helpers.build_sample_idx(lengths, doc, seq, epochs, tpe, True, True)
    total = sample.shape[0] - 1
    shuffle = _build_shuffle_index(sans if separate else total, total, rng)
    return doc, sample, shuffle, epochs, separate


def lengths_for(seed, n, high=300):
    return np.random.RandomState(seed).randint(1, high, size=n).astype(np.int32)


def assert_same(ours: G.GPTIndices, theirs):
    doc, sample, shuffle, epochs, separate = theirs
    assert ours.num_epochs == epochs and ours.separate_final_epoch == separate
    for mine, megatron in (
        (ours.document_index, doc),
        (ours.sample_index, sample),
        (ours.shuffle_index, shuffle),
    ):
        assert mine.dtype == megatron.dtype
        np.testing.assert_array_equal(mine, megatron)


@pytest.mark.parametrize(
    "n, beg, end, num_samples, seq, seed",
    [
        (1000, 0, 1000, 100, 64, 1234),  # one epoch
        (1000, 0, 969, 2000, 128, 1234),  # two epochs, final one separate
        (1000, 969, 999, 500, 32, 7),  # a small valid split, five epochs
        (1000, 0, 1000, 1000, 150, 1234),  # exactly one epoch's worth
        (200, 10, 20, 300, 7, 1),  # many epochs of a tiny range
        (300, 0, 300, 3000, 16, 99),
    ],
)
def test_indices_equal_megatron(n, beg, end, num_samples, seq, seed):
    lengths = lengths_for(seed, n)
    assert_same(
        G.build_gpt_indices(lengths, (beg, end), num_samples, seq, seed),
        megatron_indices(lengths, beg, end, num_samples, seq, seed),
    )


def test_separate_final_epoch_both_ways():
    """Multi-epoch plans with and without the separately shuffled final epoch, all equal to Megatron."""
    lengths = lengths_for(3, 100, high=100)
    tpe = int(lengths.sum())
    seq = 32
    per_epoch = (tpe - 1) // seq
    seen = set()
    for num_samples in (per_epoch + 1, per_epoch + per_epoch // 2, 2 * per_epoch - 1, 3 * per_epoch + 3):
        ours = G.build_gpt_indices(lengths, (0, 100), num_samples, seq, 1234)
        assert ours.num_epochs > 1
        seen.add(ours.separate_final_epoch)
        assert_same(ours, megatron_indices(lengths, 0, 100, num_samples, seq, 1234))
        assert ours.num_samples >= num_samples
    assert seen == {True, False}


def test_one_epoch_when_num_samples_is_none():
    lengths = lengths_for(5, 50)
    ours = G.build_gpt_indices(lengths, (0, 50), None, 16, 1234)
    assert ours.num_epochs == 1 and not ours.separate_final_epoch
    assert ours.num_samples == (int(lengths.sum()) - 1) // 16


def test_sample_index_numpy_equals_native_and_megatron():
    lengths = lengths_for(11, 2000, high=2000)
    rng = np.random.RandomState(0)
    for seq in (2, 7, 128, 4096):
        doc = np.tile(np.arange(2000, dtype=np.int32), 2)
        rng.shuffle(doc)
        tpe = int(lengths.sum())
        n = (2 * tpe - 1) // seq
        theirs = megatron_helpers.build_sample_idx(lengths, doc, seq, 2, tpe, True, True)
        np.testing.assert_array_equal(G.sample_index_numpy(lengths, doc, seq, n), theirs)
        np.testing.assert_array_equal(G.build_sample_index(lengths, doc, seq, 2, tpe), theirs)


def test_numpy_fallback_when_no_native(monkeypatch):
    monkeypatch.setattr(_native, "_tried", True)
    monkeypatch.setattr(_native, "_lib", None)
    lengths = lengths_for(2, 400)
    assert_same(
        G.build_gpt_indices(lengths, (0, 390), 900, 50, 1234),
        megatron_indices(lengths, 0, 390, 900, 50, 1234),
    )


def test_sample_index_int64_rule():
    big = np.array([2**31], dtype=np.int64)
    assert G.sample_index_dtype(big, np.zeros(3, np.int32)) == np.int64
    assert G.sample_index_dtype(np.array([5], np.int32), np.zeros(3, np.int32)) == np.int32


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=60),
    st.integers(min_value=1, max_value=300),
    st.integers(min_value=1, max_value=2000),
    st.integers(min_value=0, max_value=2**31),
)
def test_property_equal_megatron_and_samples_cover_tokens(lengths, seq, num_samples, seed):
    lengths = np.array(lengths, dtype=np.int32)
    if int(lengths.sum()) < 2:
        return
    ours = G.build_gpt_indices(lengths, (0, len(lengths)), num_samples, seq, seed)
    assert_same(ours, megatron_indices(lengths, 0, len(lengths), num_samples, seq, seed))
    # every sample spans exactly seq + 1 tokens of the flattened document stream
    starts = np.concatenate([[0], np.cumsum(lengths[ours.document_index], dtype=np.int64)])
    flat = starts[ours.sample_index[:, 0]] + ours.sample_index[:, 1]
    np.testing.assert_array_equal(np.diff(flat), seq)
