"""The two gates of ``llmtools.ckpt.safeload`` in this process: the allowlist covers what DeepSpeed writes at
ZeRO 0-3 in bf16 (fp32: tests/ckpt), DeepSpeed's own ``load_checkpoint`` reads through the safe loader
even when nothing verified the folder first, and hostile pickles stop at the first disallowed global.
"""

from __future__ import annotations

import pickle
import zipfile

import pytest

from llmtools.ckpt import safeload
from llmtools.ckpt.torchfile import load_lazy
from llmtools.errors import InputError
from tests.ckpt import worker
from tests.ckpt.conftest import ds_world  # noqa: F401 - fixture
from tests.trust.conftest import plant_payload

torch = pytest.importorskip("torch")


def _bf16_engine(zero: int):

    worker.init_dist()
    torch.manual_seed(0)
    model = worker.make_model(0.0)
    config = worker.ds_config(zero, 1)
    config["bf16"] = {"enabled": True}
    return worker.initialize(model, config)


def _bf16_step(engine) -> None:
    for micro in range(worker.GLOBAL_BATCH // worker.MICRO_BATCH):
        xs, ys = zip(
            *(worker.sample(micro * worker.MICRO_BATCH + j) for j in range(worker.MICRO_BATCH)), strict=True
        )
        out = engine(torch.stack(xs).bfloat16())
        loss = torch.nn.functional.mse_loss(out.float(), torch.stack(ys))
        engine.backward(loss)
        engine.step()


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_bf16_checkpoints_verify_and_load_through_the_safe_loader(ds_world, tmp_path, zero):  # noqa: F811
    from llmtools.ckpt.manager import CheckpointManager
    from llmtools.ckpt.verify import verify

    engine = _bf16_engine(zero)
    _bf16_step(engine)
    manager = CheckpointManager(tmp_path / "run")
    path = manager.save(engine, 1, worker.client_state(1))
    assert verify(path).ok, verify(path).problems
    for file in path.glob("*.pt"):
        assert {safeload.normalized(*g) for g in safeload.globals_in(file)} <= set(safeload.ALLOWED)
    fresh = _bf16_engine(zero)
    state = manager.load(fresh, path)
    assert state["step"] == 1 and getattr(fresh.checkpoint_engine, "_llmtools_safe", False)


def test_deepspeed_reads_through_the_safe_loader_without_verification(ds_world, tmp_path):  # noqa: F811
    """No verify before the load (meta.json's checksums not even updated): DeepSpeed's own read refuses."""
    from llmtools.ckpt.manager import CheckpointManager

    engine = worker.build_engine(2)
    worker.train_step(engine, 1)
    manager = CheckpointManager(tmp_path / "run")
    path = manager.save(engine, 1, worker.client_state(1))
    marker = tmp_path / "PAYLOAD_RAN"
    plant_payload(path / "zero_pp_rank_0_mp_rank_00_optim_states.pt", marker)
    with pytest.raises(safeload.UnsafeFileError, match=r"optim_states\.pt: refusing to load: .*os\.system"):
        manager.load(worker.build_engine(2), path)
    assert not marker.exists()


def _pickled(obj, protocol: int) -> bytes:
    return pickle.dumps(obj, protocol=protocol)


class _Reduce:
    def __init__(self, func, *args) -> None:
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _torch_file(tmp_path, data_pkl: bytes):
    """A torch.save zip whose data.pkl is ``data_pkl``."""
    path = tmp_path / "x.pt"
    torch.save({"t": torch.zeros(2)}, path)
    with zipfile.ZipFile(path) as src:
        infos = [(info, src.read(info)) for info in src.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as dst:
        for info, data in infos:
            dst.writestr(info, data_pkl if info.filename.endswith("/data.pkl") else data)
    return path


@pytest.mark.parametrize("protocol", [2, 4, 5])
@pytest.mark.parametrize(
    ("obj", "named"),
    [
        (_Reduce(eval, "1+1"), "builtins.eval"),
        (_Reduce(getattr, object, "__subclasses__"), "builtins.getattr"),
        (_Reduce(pickle.loads, b"."), "_?pickle.loads"),
        ({"a": _Reduce(__import__, "os")}, "builtins.__import__"),
    ],
    ids=["eval", "getattr", "nested-pickle", "import"],
)
def test_both_gates_name_the_first_disallowed_global(tmp_path, obj, named, protocol):
    path = _torch_file(tmp_path, _pickled(obj, protocol))
    with pytest.raises(
        safeload.UnsafeFileError, match=rf"x\.pt: refusing to load: it names the global {named}"
    ):
        load_lazy(path)
    with pytest.raises(InputError, match=rf"x\.pt: refusing to load: it names the global {named}"):
        safeload.load(path)


def test_inert_stand_ins_cannot_be_turned_into_code(tmp_path):
    """Allowed names with hostile arguments: a codec other than latin-1, a tensor over a foreign
    storage, a storage type called as a function: all refused as bad input."""
    import codecs

    for obj in (
        _Reduce(codecs.encode, "x", "zlib_codec"),
        _Reduce(torch._utils._rebuild_tensor_v2, "not a storage", 0, (1,), (1,), False, {}),
    ):
        path = _torch_file(tmp_path, _pickled(obj, 2))
        with pytest.raises(InputError, match=r"x\.pt: cannot unpickle"):
            load_lazy(path)


def test_lazy_tensors_stay_inside_their_storage(tmp_path):
    """A tensor whose size and offset claim more than its storage holds is refused, not read past."""
    path = tmp_path / "t.pt"
    base = torch.arange(10, dtype=torch.float32)
    torch.save({"t": base[2:5]}, path)
    tensor = load_lazy(path)["t"]
    tensor.shape = (9,)  # what a forged size would claim: 2 + 9 > 10 elements
    with pytest.raises(InputError, match="lies outside its storage"):
        tensor.read_flat()
