"""One reading of a checkpoint archive: every loader gets the bytes the archive check accepted, never a
second reader's idea of the file.

torch's zip reader (miniz) honours fields our check did not model: a record whose external attributes
mark it as a folder is "extracted" as nothing, and torch hands back an uninitialised buffer of the
declared size (the control below). Each hostile kind of :data:`tests.trust.zipcraft.HOSTILE` is refused,
naming the file, by every loader in this process (``safeload.load`` with and without mmap, the lazy
reader, the ``torch.load`` that DeepSpeed's tools call while it is routed, verify's CRC check) and by every
command that loads a checkpoint (verify, inspect, convert, resume, reshard, init_from: exit 2, nothing
written); and what our loader returns for a good archive is, byte for byte, what is in the file.
"""

from __future__ import annotations

import pytest

from llmtools.ckpt import safeload
from llmtools.ckpt.torchfile import load_lazy
from llmtools.errors import InputError
from tests.trust.conftest import cli, error_line, rehash, snapshot
from tests.trust.test_loader_paths import MODEL, PATHS, STEP4, _commands
from tests.trust.zipcraft import HOSTILE, plant, records_of, write

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

CANONICAL = torch.arange(1, 100_001, dtype=torch.float32)  # no allocator hands this back by chance


def _saved(tmp_path, name="w.pt"):
    path = tmp_path / name
    torch.save({"w": CANONICAL.clone(), "b": torch.full((7,), 3.0)}, path)
    return path


def test_control_torch_reads_memory_that_is_not_in_the_file(tmp_path):
    path = _saved(tmp_path)
    plant("dos-folder", path, "data/0")
    loaded = torch.load(path, weights_only=True)  # torch's own reader of the same file
    assert loaded["w"].shape == CANONICAL.shape
    assert not torch.equal(loaded["w"], CANONICAL)  # zeros or stale heap: not the bytes in the file


def _routed(path):
    with safeload.routed_torch_load():
        return torch.load(path, weights_only=False)  # what DeepSpeed's tools and engine call


LOADERS = {
    "load": lambda p: safeload.load(p),
    "load-mmap": lambda p: safeload.load(p, mmap=True),
    "lazy": load_lazy,
    "routed-torch-load": _routed,
    "verify-crcs": lambda p: safeload.check_file(p, crcs=True),
}


@pytest.mark.parametrize("loader", list(LOADERS))
@pytest.mark.parametrize("kind", HOSTILE)
def test_every_loader_refuses_every_hostile_kind(tmp_path, kind, loader):
    path = _saved(tmp_path)
    plant(kind, path)
    with pytest.raises(InputError) as caught:
        LOADERS[loader](path)
    assert str(path) in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("mmap", [False, True])
def test_a_storage_whose_crc_is_wrong_is_refused_where_it_is_read_whole(tmp_path, mmap):
    path = _saved(tmp_path)
    plant("wrong-crc", path, "data/0")
    with pytest.raises(InputError, match="CRC-32"):
        safeload.load(path, mmap=mmap)
    with pytest.raises(InputError, match="CRC-32"):
        safeload.check_file(path, crcs=True)
    # The lazy reader reads slices (no CRC of a part): what it reads is the file's bytes, nothing else.
    assert torch.equal(load_lazy(path)["w"].load(), CANONICAL)


_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int8, torch.bool]


@st.composite
def state_dicts(draw):
    """Dicts of tensors as checkpoints hold them: several dtypes and shapes, views sharing a storage,
    parameters, nested dicts and lists."""
    out, bases = {}, []
    for i in range(draw(st.integers(1, 5))):
        dtype = draw(st.sampled_from(_DTYPES))
        shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=3)))
        numel = 1
        for size in shape:
            numel *= size
        values = torch.arange(numel, dtype=torch.float64).reshape(shape) * draw(st.floats(-3, 3, width=32))
        tensor = values.to(dtype)
        bases.append(tensor)
        out[f"t{i}"] = torch.nn.Parameter(tensor) if dtype.is_floating_point and draw(st.booleans()) else tensor
    base = draw(st.sampled_from(bases))
    if base.numel() > 1:
        flat = base.view(-1)
        start = draw(st.integers(0, flat.numel() - 1))
        out["view"] = flat[start:]  # shares the storage of the tensor it is cut from
    out["nested"] = {"list": [bases[0], 3, "x"], "step": draw(st.integers(0, 1 << 40))}
    return out


def _same(got, want) -> None:
    assert type(got) is type(want)
    if isinstance(want, torch.Tensor):
        assert (got.dtype, got.shape, got.stride(), got.storage_offset()) == (
            want.dtype, want.shape, want.stride(), want.storage_offset(),
        )  # fmt: skip
        assert bytes(got.untyped_storage()) == bytes(want.untyped_storage())
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for key in want:
            _same(got[key], want[key])
    elif isinstance(want, list):
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            _same(a, b)
    else:
        assert got == want


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(state=state_dicts(), mmap=st.booleans(), rewrite=st.booleans())
def test_loads_equal_the_bytes_in_the_file(tmp_path, state, mmap, rewrite):
    import tempfile
    from pathlib import Path

    handle, name = tempfile.mkstemp(suffix=".pt", dir=tmp_path)  # a new file: an old one may be mapped
    path = Path(name)
    with open(handle, "wb") as file:
        torch.save(state, file)
    if rewrite:  # the same records in another writer's layout (zipcraft: data descriptors, padding)
        write(path, records_of(path))
    want = torch.load(path, weights_only=True)
    got = safeload.load(path, mmap=mmap)
    _same(got, want)
    shared = [k for k in want if isinstance(want[k], torch.Tensor) and k != "view"]
    if "view" in want:  # a view and the tensor it was cut from share one storage, as torch's loader gives
        owners = [k for k in shared if want[k].untyped_storage().data_ptr() == want["view"].untyped_storage().data_ptr()]
        assert all(
            got[k].untyped_storage().data_ptr() == got["view"].untyped_storage().data_ptr() for k in owners
        )


# ------------------------------------------------------------------------------- through the commands
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", HOSTILE)
def test_every_command_refuses_every_hostile_kind(run, env, train_files, tmp_path, kind, path):
    plant(kind, run / MODEL)
    rehash(run / STEP4)  # whoever supplies the file can sign it: only the archive check stands
    out = tmp_path / "out"
    out.mkdir()
    before = snapshot(run / "checkpoints")
    proc = cli(*_commands(run, out, train_files)[path], env=env, timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert str(run / MODEL) in error_line(proc)
    assert snapshot(run / "checkpoints") == before
    assert list(out.iterdir()) == []


OPTIM = f"{STEP4}/zero_pp_rank_0_mp_rank_00_optim_states.pt"


@pytest.mark.parametrize("path", ["verify", "convert-hf", "resume-auto"])
def test_optimizer_moments_marked_as_a_folder_are_refused(run, env, train_files, tmp_path, path):
    """The optimizer file's largest storage (fp32 master weights or Adam's moments), marked as a folder:
    torch would resume from uninitialised moments and exit 0."""
    plant("dos-folder", run / OPTIM)
    rehash(run / STEP4)
    out = tmp_path / "out"
    out.mkdir()
    proc = cli(*_commands(run, out, train_files)[path], env=env, timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert str(run / OPTIM) in error_line(proc)


@pytest.fixture
def hf_bin_folder(run, env, tmp_path):
    """A Hugging Face folder of the run's last step whose weights are an older ``pytorch_model.bin``."""
    from safetensors.torch import load_file

    folder = tmp_path / "hf"
    proc = cli("ckpt", "convert", run / STEP4, "--to", "hf", "-o", folder, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    weights = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save(weights, folder / "pytorch_model.bin")
    return folder, weights


@pytest.mark.parametrize("kind", [None, *HOSTILE])
def test_import_hf_reads_a_weights_bin_through_the_checked_loader(hf_bin_folder, env, tmp_path, kind):
    from llmtools.ckpt.reader import CheckpointReader

    folder, weights = hf_bin_folder
    if kind is not None:
        plant(kind, folder / "pytorch_model.bin")
    proc = cli("ckpt", "import-hf", folder, "-o", tmp_path / "ckpt", env=env)
    if kind is None:
        assert proc.returncode == 0, proc.stderr[-3000:]
        with CheckpointReader(tmp_path / "ckpt") as reader:
            got = {name: source.load() for name, source in reader.sources().items()}
        assert all(torch.equal(got[name], weights[name].float()) for name in weights if name in got)
        return
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert str(folder / "pytorch_model.bin") in error_line(proc)
    assert not (tmp_path / "ckpt").exists()
