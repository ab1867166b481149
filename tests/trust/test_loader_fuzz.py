"""Whatever a ``.pt`` file holds, the loaders either return or raise one :class:`InputError` naming the
file (one line: exit 2 in every command), never another exception (an internal error).

In this process, for breadth: ``data.pkl`` mutated (bytes flipped, cut, inserted, repeated) and crafted
(random sequences of the opcodes a pickle is made of, with the globals our allowlist has and some it has
not, persistent ids, memo references, integers that hash alike), and whole archives with bytes flipped,
through ``safeload.load`` (with and without mmap) and the lazy reader. Then a few crafted files through
the real ``llm-ckpt verify`` and ``llm-train --resume`` (DeepSpeed's engine reads through
``safeload.load``).
"""

from __future__ import annotations

import struct

import pytest

from llmtools.ckpt import safeload
from llmtools.ckpt.torchfile import load_lazy
from llmtools.errors import InputError
from tests.trust.conftest import cli, error_line, rehash
from tests.trust.zipcraft import records_of, write

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _text(value: str) -> bytes:
    raw = value.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


_PERSISTENT = b"(" + _text("storage") + _global("torch", "FloatStorage") + _text("0") + _text("cpu") + b"K\x02tQ"
_MODULUS = (1 << 61) - 1

SNIPPETS = [
    b"}", b"]", b")", b"(", b"s", b"u", b"a", b"e", b"t", b"\x85", b"\x86", b"\x87", b"R", b"b", b"\x81",
    b"0", b"2", b"N", b"\x88", b"\x89", b"K\x05", b"J\xff\xff\xff\xff", b"G" + struct.pack(">d", 1.5),
    b"\x8a\x09" + (_MODULUS * 3).to_bytes(9, "little"), b"\x8a\x01\x07", _text("a"), _text("data"),
    b"C\x02ab", b"q\x00", b"q\x01", b"h\x00", b"h\x01", b"\x94", b"Q", b"\x8f", b"\x90", b"\x91", b"l",
    b"d", b"\x92", b"o", b"i__builtin__\nset\n", _PERSISTENT,
    _global("collections", "OrderedDict"), _global("torch._utils", "_rebuild_tensor_v2"),
    _global("torch._utils", "_rebuild_parameter"), _global("torch._utils", "_rebuild_parameter_with_state"),
    _global("torch._tensor", "_rebuild_from_type_v2"), _global("torch", "Tensor"),
    _global("torch", "FloatStorage"), _global("torch", "Size"), _global("__builtin__", "set"),
    _global("_codecs", "encode"), _global("numpy.core.multiarray", "_reconstruct"), _global("numpy", "ndarray"),
    _global("numpy", "dtype"), _global("builtins", "getattr"), _global("os", "system"),
]  # fmt: skip


def _archive(path, pkl: bytes) -> None:
    write(
        path,
        [
            ("archive/data.pkl", pkl),
            ("archive/byteorder", b"little"),
            ("archive/data/0", struct.pack("<2f", 1.0, 2.0)),
            ("archive/version", b"3\n"),
        ],
    )


def _loads_or_refuses(path) -> None:
    for load in (safeload.load, lambda p: safeload.load(p, mmap=True), load_lazy):
        try:
            load(path)
        except InputError as error:
            message = str(error)
            assert str(path) in message and "\n" not in message, message


@pytest.fixture(scope="module")
def base_pickle(tmp_path_factory):
    """data.pkl of a state like DeepSpeed's: module weights, a parameter, a set, ints, floats, nesting."""
    from collections import OrderedDict

    path = tmp_path_factory.mktemp("fuzzbase") / "base.pt"
    weights = OrderedDict(w=torch.arange(6.0).view(2, 3), b=torch.ones(3, dtype=torch.bfloat16))
    state = {
        "module": weights,
        "param": torch.nn.Parameter(torch.zeros(2)),
        "names": {"a", "b"},
        "optimizer": {"state": {0: {"step": 3}}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]},
        "shape": torch.Size([2, 3]),
        "step": 4,
    }
    torch.save(state, path)
    return path


_EDITS = st.lists(
    st.tuples(st.sampled_from(["flip", "cut", "insert", "repeat"]), st.integers(0, 1 << 20), st.binary(min_size=1, max_size=8)),
    min_size=1,
    max_size=4,
)


def _mutate(data: bytes, edits) -> bytes:
    out = bytearray(data)
    for kind, where, blob in edits:
        at = where % max(1, len(out))
        if kind == "flip":
            out[at : at + len(blob)] = bytes(b ^ x for b, x in zip(out[at : at + len(blob)], blob, strict=False))
        elif kind == "cut":
            del out[at : at + len(blob) * 7]
        elif kind == "insert":
            out[at:at] = blob
        else:
            out[at:at] = out[at : at + len(blob) * 5]
    return bytes(out)


@FUZZ
@given(edits=_EDITS)
def test_mutated_pickles(tmp_path, base_pickle, edits):
    records = records_of(base_pickle)
    path = tmp_path / "mutated.pt"
    write(path, [(n, _mutate(d, edits) if n.endswith("/data.pkl") else d) for n, d in records])
    _loads_or_refuses(path)


@FUZZ
@given(ops=st.lists(st.sampled_from(SNIPPETS), max_size=40), stop=st.booleans())
def test_crafted_pickles(tmp_path, ops, stop):
    path = tmp_path / "crafted.pt"
    _archive(path, b"\x80\x02" + b"".join(ops) + (b"." if stop else b""))
    _loads_or_refuses(path)


@FUZZ
@given(edits=_EDITS)
def test_mutated_archives(tmp_path, base_pickle, edits):
    path = tmp_path / "archive.pt"
    path.write_bytes(_mutate(base_pickle.read_bytes(), edits))
    _loads_or_refuses(path)


# Found by the generators above before every failure was an InputError: each made safeload.load raise
# something else (IndexError, TypeError, AttributeError from torch's unpickler and loader).
CRAFTED = {
    "empty": b"\x80\x02.",
    "size-of-an-int": b"\x80\x02" + _global("torch", "Size") + b"K\x05\x85R.",
    "set-of-an-int": b"\x80\x02" + _global("__builtin__", "set") + b"K\x05\x85R.",
    "reduce-with-none": b"\x80\x02" + _global("collections", "OrderedDict") + b"NR.",
    "tensor-of-a-string": b"\x80\x02" + _global("torch._utils", "_rebuild_tensor_v2") + b"(" + _text("x")
    + b"K\x00K\x02\x85K\x01\x85\x89NtR.",
    "numel-a-string": b"\x80\x02(" + _text("storage") + _global("torch", "FloatStorage") + _text("0")
    + _text("cpu") + _text("2") + b"tQ.",
}  # fmt: skip


@pytest.mark.parametrize("name", list(CRAFTED))
def test_crafted_pickles_in_process(tmp_path, name):
    path = tmp_path / "crafted.pt"
    _archive(path, CRAFTED[name])
    with pytest.raises(InputError) as caught:
        safeload.load(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


STEP4 = "checkpoints/step_00000004"
MODEL = f"{STEP4}/mp_rank_00_model_states.pt"
# One more item in the model-states pickle that the full loader refuses (a call with arguments the real
# function or class does not take): the structure check refuses it as well, so a checkpoint that
# verifies is one that loads, and a resume stops (exit 2) instead of trying the step before.
ITEMS = {
    "fragment-address": _global("deepspeed.utils.tensor_fragment", "fragment_address") + b"N\x85R",
    "parameter-without-flags": _global("torch._utils", "_rebuild_parameter") + b"N\x85R",
}


@pytest.mark.parametrize("name", list(ITEMS))
def test_crafted_items_are_refused_by_verify_and_resume(run, env, train_files, name):
    records = records_of(run / MODEL)
    item = _text("crafted") + ITEMS[name] + b"s."
    write(run / MODEL, [(n, d[:-1] + item if n.endswith("/data.pkl") else d) for n, d in records])
    rehash(run / STEP4)
    config, ds = train_files
    verify = cli("ckpt", "verify", run / STEP4, env=env, timeout=600)
    assert verify.returncode == 2, verify.stderr[-3000:]
    assert str(run / MODEL) in error_line(verify)
    resume = cli("train", config, "--deepspeed", ds, "-o", run, "--resume", "auto", env=env, timeout=600)
    assert resume.returncode == 2, resume.stderr[-3000:]
    assert str(run / MODEL) in error_line(resume)
