"""A mix.json is read into one checked MixFile; opening its splits reads nothing more and writes only the
cache it rebuilds."""

from __future__ import annotations

import os

import numpy as np
import pytest

from llmtools.data import mix as M
from llmtools.data import mix_cache
from llmtools.data.dataset import BlendedGPTDataset
from llmtools.errors import InputError
from llmtools.formats.mix import MixFile

from .test_mix import write_source


@pytest.fixture()
def saved(tmp_path):
    prefixes = [write_source(tmp_path / name, 40, seed) for seed, name in enumerate(("a", "b"))]
    config = M.MixConfig(M.Blend(prefixes, [0.6, 0.4]), 16, num_samples=60, valid_samples=8, split="90,10,0")
    return M.save_plan(M.build_plan(config), tmp_path / "mix.json")


def test_every_split_opens_from_one_read(saved):
    mix = MixFile.read(saved[0])
    assert mix.seq_length == 16 and set(mix.splits) == {"train", "valid"} and mix.identity
    os.rename(saved[0], saved[0].with_suffix(".moved"))  # nothing reads the file again
    train = BlendedGPTDataset.from_mix(mix, "train")
    valid = BlendedGPTDataset.from_mix(mix, "valid")
    assert len(train) == 60 and len(valid) == mix.splits["valid"]["num_samples"]


def test_opening_over_arrays_writes_nothing(saved):
    mix = MixFile.read(saved[0])
    arrays = mix_cache.load_split(mix, "train")
    for path in saved[1:]:
        path.unlink()
    dataset = BlendedGPTDataset.from_arrays(mix, "train", arrays)
    assert len(dataset) == 60 and not any(p.exists() for p in saved[1:])
    rebuilt = mix_cache.load_split(mix, "train")  # the explicit step writes the cache back, identically
    assert all(p.exists() for p in saved[1:])
    np.testing.assert_array_equal(rebuilt["dataset_index"], arrays["dataset_index"])


def test_a_bad_mix_json_is_refused_on_read(tmp_path):
    path = tmp_path / "mix.json"
    path.write_text('{"format": "llmtools.mix", "version": 1}')
    with pytest.raises(InputError, match="seq_length"):
        MixFile.read(path)
