"""The lazy torch.save reader: same tensors as torch.load, slices read without loading the rest."""

from __future__ import annotations

import pytest

from llmtools.ckpt.torchfile import LazyTensor, load_lazy
from llmtools.errors import InputError

torch = pytest.importorskip("torch")


def test_round_trip_dtypes_views_and_nesting(tmp_path):
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(40, generator=gen)
    obj = {
        "f32": torch.randn(3, 5, generator=gen),
        "bf16": torch.randn(7, generator=gen).bfloat16(),
        "i64": torch.arange(11),
        "view": base[10:30],  # a view: shares the storage, starts at an offset
        "param": torch.nn.Parameter(torch.ones(2, 2)),
        "nested": [{"x": base}, (1, "two", None)],
        "size": torch.Size([4, 5]),
        "scalar": torch.tensor(3.5),
    }
    path = tmp_path / "obj.pt"
    torch.save(obj, path)
    lazy = load_lazy(path)
    assert isinstance(lazy["f32"], LazyTensor) and lazy["f32"].shape == (3, 5)
    for key in ("f32", "bf16", "i64", "view", "param", "scalar"):
        assert torch.equal(lazy[key].load(), obj[key].detach()), key
    assert torch.equal(lazy["nested"][0]["x"].load(), base)
    assert lazy["nested"][1] == (1, "two", None) and lazy["size"] == torch.Size([4, 5])
    assert torch.equal(lazy["view"].read_flat(5, 3), base[15:18])


def test_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a zip")
    with pytest.raises(InputError, match="bad.pt: not a readable torch zip file"):
        load_lazy(bad)
    path = tmp_path / "t.pt"
    torch.save({"t": torch.arange(10).reshape(2, 5).t()}, path)
    with pytest.raises(InputError, match="non-contiguous"):
        load_lazy(path)["t"].read_flat()
    torch.save({"t": torch.arange(10)}, path)
    lazy = load_lazy(path)["t"]
    with pytest.raises(InputError, match=r"slice \[8, 12\) out of a tensor of 10"):
        lazy.read_flat(8, 4)
    size = path.stat().st_size
    with open(path, "r+b") as handle:  # cut the tensor bytes short
        handle.truncate(size - 200)
    with pytest.raises(InputError):
        load_lazy(path)["t"].read_flat()
