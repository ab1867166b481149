"""SftDataset: llm-prep sft output as fixed-shape training batches (tokens, labels, mask, positions, segments)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from llmtools.data.sft_dataset import SftDataset
from llmtools.errors import InputError
from llmtools.prep.sft import SftConfig, build_sft

CHATS = [
    {
        "messages": [
            {"role": "user", "content": "Hi" * (1 + i % 4)},
            {"role": "assistant", "content": "Yo!" * (1 + i)},
        ]
    }
    for i in range(7)
]


def _make(tmp_path, name, **kw):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(c) + "\n" for c in CHATS))
    prefix = tmp_path / name
    build_sft(
        SftConfig(
            inputs=[str(src)], tokenizer="byte", output_prefix=str(prefix), chat_template="chatml", **kw
        )
    )
    return SftDataset(prefix)


def test_unpacked_batches(tmp_path):
    ds = _make(tmp_path, "plain")
    assert len(ds) == 7 and not ds.packed
    seq = int(ds.lengths.max()) + 3  # room for padding
    b = ds.batch([0, 6], seq)
    assert {k: v.shape for k, v in b.items()} == {k: (2, seq) for k in b}
    doc = ds[0]
    n = doc["input_ids"].size
    assert (b["tokens"][0, : n - 1] == doc["input_ids"][:-1]).all()
    assert (b["labels"][0, : n - 1] == doc["input_ids"][1:]).all()
    assert (b["loss_mask"][0, : n - 1] == doc["loss_mask"][1:]).all() and b["loss_mask"][
        0, n - 1 :
    ].sum() == 0
    assert (b["position_ids"][0, :n] == np.arange(n)).all()
    short = ds.batch([6], 10)  # cut to seq_length
    assert short["tokens"].shape == (1, 10) and (short["tokens"][0] == ds[6]["input_ids"][:10]).all()


def test_packed_batches_hold_the_same_training_pairs(tmp_path):
    plain = _make(tmp_path, "plain")
    packed = _make(tmp_path, "packed", max_length=200, pack=True)
    assert packed.packed and len(packed) < len(plain)

    def pairs(ds, seq):
        """(position in sample, token, label) of every trained label, per sample, in order."""
        b = ds.batch(range(len(ds)), seq)
        out = []
        for r in range(len(ds)):
            for s in np.unique(b["segment_ids"][r][b["segment_ids"][r] > 0]):
                at = np.flatnonzero((b["segment_ids"][r] == s) & (b["loss_mask"][r] == 1))
                out.append(
                    [
                        (int(b["position_ids"][r, t]), int(b["tokens"][r, t]), int(b["labels"][r, t]))
                        for t in at
                    ]
                )
        return out

    assert pairs(packed, 200) == pairs(plain, 200)
    b = packed.batch([0], 200)
    starts = np.flatnonzero(np.diff(b["segment_ids"][0]) > 0) + 1  # where a new sample begins
    assert len(starts) >= 1
    assert (b["position_ids"][0, starts] == 0).all()
    assert (b["loss_mask"][0, starts - 1] == 0).all()  # never predict the next sample's first token


def test_misaligned_datasets_are_an_input_error(tmp_path):
    _make(tmp_path, "a")
    _make(tmp_path, "b", max_length=70)  # same count, some lengths truncated
    for suffix in (".bin", ".idx"):
        shutil.copy(tmp_path / f"b_loss_mask_document{suffix}", tmp_path / f"a_loss_mask_document{suffix}")
    with pytest.raises(InputError, match="not aligned"):
        SftDataset(tmp_path / "a")
    with pytest.raises(InputError, match="not found"):
        SftDataset(tmp_path / "missing")
