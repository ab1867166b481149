"""Putting tensor-parallel shards together: each sharded weight is its shards end to end along its split
dimension, the rest are read from shard 0, and meta.json's record (untrusted) is checked before use:
whatever it holds, the answer is the whole weights or one InputError, never another exception."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtools.ckpt.tensor_shards import degree, join, whole_parameters
from llmtools.errors import InputError


class Held:
    """A source as the checkpoint reader gives one: shape, dtype, load()."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor, self.shape, self.dtype = tensor, tuple(tensor.shape), tensor.dtype

    def load(self) -> torch.Tensor:
        return self.tensor


def _model(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "q.weight": torch.randn(8, 6, generator=g),
        "o.weight": torch.randn(6, 8, generator=g),
        "norm.weight": torch.randn(6, generator=g),
    }


DIMS = {"q.weight": 0, "o.weight": 1}


def _shards(whole: dict[str, torch.Tensor], n: int, sizes=None) -> list[dict[str, Held]]:
    shards = [{} for _ in range(n)]
    for name, tensor in whole.items():
        if name in DIMS:
            parts = torch.split(tensor, sizes or tensor.shape[DIMS[name]] // n, dim=DIMS[name])
        else:
            parts = [tensor] * n
        for m, part in enumerate(parts):
            shards[m][name] = Held(part.clone())
    return shards


def _record(whole, n):
    return {"degree": n, "split_dims": dict(DIMS), "shapes": {k: list(whole[k].shape) for k in DIMS}}


@pytest.mark.parametrize("n, sizes", [(2, None), (4, None), (2, [5, 3])], ids=["even2", "even4", "uneven"])
def test_shards_join_back_into_the_whole_weights(n, sizes):
    whole = _model()
    if sizes:  # uneven shards (DeepSpeed's grain sizes can make them): only q is cut unevenly here
        shards = _shards({"q.weight": whole["q.weight"], "norm.weight": whole["norm.weight"]}, n, sizes)
        record = {"degree": n, "split_dims": {"q.weight": 0}, "shapes": {"q.weight": [8, 6]}}
        whole = {"q.weight": whole["q.weight"], "norm.weight": whole["norm.weight"]}
    else:
        shards, record = _shards(whole, n), _record(whole, n)
    joined = join(shards, record, "meta.json[tensor_parallel]")
    assert set(joined) == set(whole)
    for name, tensor in whole.items():
        assert tuple(joined[name].shape) == tuple(tensor.shape)
        assert torch.equal(joined[name].load(), tensor), name


def test_the_whole_model_is_counted():
    whole = _model()
    shard0 = {k: list(v.shape) for k, v in _shards(whole, 2)[0].items()}
    assert whole_parameters(shard0, {"tensor_parallel": _record(whole, 2)}) == sum(
        t.numel() for t in whole.values()
    )
    assert whole_parameters(shard0, {}) == sum(
        torch.Size(s).numel() for s in shard0.values()
    )  # no record: as listed


VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 1 << 41), st.floats(allow_nan=True), st.text(max_size=3),
                   st.lists(st.integers(-2, 20), max_size=3), st.dictionaries(st.text(max_size=8), st.integers(-1, 3), max_size=3))  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    field=st.sampled_from(["degree", "split_dims", "shapes", "whole", "name", "dim", "shape"]),
    value=VALUES,
    shards=st.integers(1, 3),
)
def test_a_mangled_record_is_one_input_error(field, value, shards):
    """meta.json is untrusted: any value in any place of its record, and any number of shards on disk."""
    whole = _model()
    record = _record(whole, 2)
    if field in ("degree", "split_dims", "shapes"):
        record[field] = value
    elif field == "whole":
        record = value
    elif field == "name":
        record["split_dims"][str(value)] = 0
    elif field == "dim":
        record["split_dims"]["q.weight"] = value
    else:
        record["shapes"]["o.weight"] = value
    try:
        joined = join(_shards(whole, 2)[:shards] if shards <= 2 else _shards(whole, 2) * 2, record, "meta")
    except InputError:
        return
    for name, tensor in whole.items():  # what was accepted is right
        assert torch.equal(joined[name].load(), tensor)
    try:
        degree({"tensor_parallel": record})
    except InputError:
        pass
