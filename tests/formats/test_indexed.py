"""MMIDIDX reader/writer: round trips (hypothesis), Megatron-made fixtures, and corrupt files."""

from __future__ import annotations

import shutil
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmtools.errors import InputError
from llmtools.formats.indexed import (
    HEADER_SIZE,
    IndexedDatasetReader,
    IndexedDatasetWriter,
    dtype_for_vocab,
)
from tests.conftest import shared

OWT = "megatron-deepspeed-fixtures/meg-gpt2-openwebtext_text_document"
BLOOM = "megatron-deepspeed-fixtures/bloomtok_ag_news_prompt_{}_document"


def shared_prefix(relative: str):
    shared(relative + ".idx")
    return shared(relative + ".bin").with_suffix("")


DTYPES = [np.uint8, np.int8, np.int16, np.uint16, np.int32, np.int64]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    dtype=st.sampled_from(DTYPES),
    docs=st.lists(st.lists(st.integers(min_value=0, max_value=127), max_size=30), max_size=25),
    bulk=st.booleans(),
)
def test_round_trip_any_dtype(tmp_path_factory, dtype, docs, bulk):
    prefix = tmp_path_factory.mktemp("rt") / "data"
    with IndexedDatasetWriter(prefix, dtype, durable=False) as writer:
        if bulk:
            flat = np.array([t for d in docs for t in d], dtype=np.int64)
            writer.add_documents(flat, np.array([len(d) for d in docs], dtype=np.int64))
        else:
            for doc in docs:
                writer.add_document(doc)
    reader = IndexedDatasetReader(prefix)
    reader.validate()
    assert reader.dtype == np.dtype(dtype)
    assert reader.num_documents == len(docs)
    assert reader.num_sequences == sum(1 for d in docs if d)  # empty docs: an index, no sequence
    assert reader.num_tokens == sum(len(d) for d in docs)
    assert [reader.document(j).tolist() for j in range(len(docs))] == docs
    assert reader.document_lengths().tolist() == [len(d) for d in docs]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    vocab=st.sampled_from([257, 5000, 50257, 65499, 65500, 100277, 250880]),
    texts=st.lists(st.text(max_size=40), min_size=1, max_size=12),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_round_trip_vocab_sizes_then_decode(tmp_path_factory, vocab, texts, seed):
    """Random documents through writer -> reader -> decode; dtype chosen from the vocab as Megatron does."""
    from llmtools.tokenize import load_tokenizer

    tok = load_tokenizer("byte")
    rng = np.random.default_rng(seed)
    dtype = dtype_for_vocab(vocab)
    assert dtype == (np.uint16 if vocab < 65500 else np.int32)
    # byte ids for the text, plus random ids up to the vocabulary in a parallel document
    ids = [tok.encode(t) for t in texts]
    noise = [rng.integers(0, vocab, size=len(i)).tolist() for i in ids]
    prefix = tmp_path_factory.mktemp("voc") / "d"
    with IndexedDatasetWriter(prefix, dtype, durable=False) as writer:
        for a, b in zip(ids, noise, strict=True):
            writer.add_document(a)
            writer.add_document(b)
    reader = IndexedDatasetReader(prefix)
    assert [tok.decode(reader.document(2 * j)) for j in range(len(texts))] == texts
    assert [reader.document(2 * j + 1).tolist() for j in range(len(texts))] == noise


def test_writer_rejects_ids_that_do_not_fit(tmp_path):
    with pytest.raises(ValueError, match="do not fit"), IndexedDatasetWriter(tmp_path / "x", np.uint16) as w:
        w.add_documents(np.array([70000]), np.array([1]))
    assert list(tmp_path.iterdir()) == []  # nothing left behind, not even temporaries


def test_megatron_gpt2_fixture_reads():
    reader = IndexedDatasetReader(shared_prefix(OWT))
    reader.validate()
    assert reader.dtype == np.uint16 and reader.dtype_code == 8
    assert reader.num_documents == 1000 and reader.num_sequences == 1000
    assert reader.num_tokens == 1_361_845
    assert reader.document_indices.tolist() == list(range(1001))
    ends = reader.tokens()[np.cumsum(reader.sequence_lengths.astype(np.int64)) - 1]
    assert (ends == 4999).all()  # every document ends with EOD (made with --append-eod)


@pytest.mark.parametrize("key,eod", [("inputs", False), ("targets", True)])
def test_bloomtok_int32_fixtures(key, eod):
    prefix = shared_prefix(BLOOM.format(key))
    reader = IndexedDatasetReader(prefix)
    reader.validate()
    assert reader.dtype == np.int32 and reader.dtype_code == 4
    assert reader.num_documents == 100 and reader.num_sequences == 100
    assert reader.expected_bin_size() == reader.bin_file.stat().st_size
    assert (
        reader.sequence_pointers == np.concatenate([[0], np.cumsum(reader.sequence_lengths[:-1] * 4)])
    ).all()
    assert int(reader.tokens().max()) < 250880  # BLOOM's vocabulary
    ends = reader.tokens()[np.cumsum(reader.sequence_lengths.astype(np.int64)) - 1]
    if eod:  # targets: a short label then EOD (id 2 in BLOOM)
        assert (ends == 2).all() and set(reader.sequence_lengths.tolist()) == {2, 4}
    else:
        assert not (ends == 2).any() and reader.num_tokens == 5945
    for j in (0, 57, 99):
        assert reader.document(j).dtype == np.int32


# -- corrupt files ------------------------------------------------------------------------------------
@pytest.fixture
def copy_owt(tmp_path):
    src = shared_prefix(OWT)
    prefix = tmp_path / "owt"
    for suffix in (".bin", ".idx"):
        shutil.copy(f"{src}{suffix}", f"{prefix}{suffix}")
    return prefix


def _patch(path, offset, data):
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)


def test_bad_magic(copy_owt):
    _patch(f"{copy_owt}.idx", 0, b"XXXXXXX")
    with pytest.raises(InputError, match=r"owt\.idx@byte 0: bad magic"):
        IndexedDatasetReader(copy_owt)


def test_truncated_bin(copy_owt):
    with open(f"{copy_owt}.bin", "r+b") as handle:
        handle.truncate(1000)
    with pytest.raises(InputError, match=r"owt\.bin@byte 1000: .*truncated"):
        IndexedDatasetReader(copy_owt)


def test_truncated_idx(copy_owt):
    with open(f"{copy_owt}.idx", "r+b") as handle:
        handle.truncate(5000)
    with pytest.raises(InputError, match=r"owt\.idx: size 5000 bytes does not match its header"):
        IndexedDatasetReader(copy_owt)


def test_inconsistent_pointers(copy_owt):
    s = 1000
    _patch(f"{copy_owt}.idx", HEADER_SIZE + 4 * s + 8 * 10, struct.pack("<q", 12345))
    with pytest.raises(InputError, match=r"owt\.idx@byte \d+: pointer of sequence 10 is 12345"):
        IndexedDatasetReader(copy_owt)  # checked on open


def test_missing_bin(copy_owt):
    (copy_owt.parent / "owt.bin").unlink()
    with pytest.raises(InputError, match=r"owt\.bin: no such file"):
        IndexedDatasetReader(copy_owt)
