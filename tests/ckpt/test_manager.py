"""CheckpointManager with a real DeepSpeed engine in this process: layout, exact resume, resolve, prune."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest

from llmtools.ckpt import layout
from llmtools.ckpt.manager import CheckpointManager
from llmtools.ckpt.verify import check, read_meta, verify
from llmtools.errors import InputError, UsageError
from tests.ckpt import worker

REPO = Path(__file__).resolve().parents[2]


def _steps(run) -> list[int]:
    return [step for step, _ in layout.list_checkpoints(layout.checkpoints_dir(run))]


def test_save_layout_meta_and_latest(saved_run):
    ckpt_dir = saved_run / "checkpoints"
    assert _steps(saved_run) == [2, 4, 6]
    assert (ckpt_dir / "latest").read_text().strip() == "step_00000006"
    assert not layout.leftovers(ckpt_dir)
    folder = ckpt_dir / "step_00000004"
    meta = read_meta(folder)
    assert meta["step"] == 4 and meta["complete"] is True
    assert meta["consumed_samples"] == 16 and meta["data"]["fingerprint"] == "sin3x"
    assert meta["world_size"] == 1 and meta["zero_stage"] == 1 and meta["precision"] == "fp32"
    assert meta["rng"]["files"] == ["rng_rank0000.pt"]
    assert set(meta["files"]) == {p.name for p in folder.iterdir() if p.name != "meta.json"}
    assert meta["param_shapes"]["inp.weight"] == [worker.HIDDEN, worker.DIM]
    assert meta["num_parameters"] == worker.DIM * worker.HIDDEN * 2 + worker.DIM + worker.HIDDEN
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((REPO / "schemas" / "checkpoint-meta.schema.json").read_text())
    jsonschema.validate(meta, schema)
    assert verify(folder).ok


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_exact_resume_in_process(tmp_path, ds_world, zero):
    import numpy as np
    import torch

    reference = worker.build_engine(zero)
    manager = CheckpointManager(tmp_path / "run")
    losses = []
    for step in range(1, 7):
        losses.append(worker.train_step(reference, step))
        if step == 3:
            manager.save(reference, 3, worker.client_state(3))
    expected = worker.full_weights(reference)

    resumed = worker.build_engine(zero, seed=999)  # different init: everything must come from the checkpoint
    random.seed(1), np.random.seed(1), torch.manual_seed(1)  # and the RNG must be restored, not left
    path = manager.resolve("auto")
    state = manager.load(resumed, path)
    assert path.name == "step_00000003" and state["step"] == 3 and state["consumed_samples"] == 12
    again = [worker.train_step(resumed, step) for step in range(4, 7)]
    assert again == losses[3:]
    got = worker.full_weights(resumed)
    assert all(torch.equal(got[name], expected[name]) for name in expected)


def test_resolve_specs(saved_run):
    manager = CheckpointManager(saved_run)
    ckpt_dir = saved_run / "checkpoints"
    assert manager.resolve("auto") == ckpt_dir / "step_00000006"
    assert manager.resolve("latest") == ckpt_dir / "step_00000006"
    with pytest.raises(UsageError, match=r"step 4 is older .*\(later steps: 6\).*--rollback"):
        manager.resolve("4")  # older than the newest: would overwrite step 6
    assert manager.resolve("4", rollback=True) == ckpt_dir / "step_00000004"
    assert not list(ckpt_dir.glob("abandoned-*"))  # resolving moves nothing: the caller does, once loaded
    manager.abandon_after(ckpt_dir / "step_00000004")
    (abandoned,) = ckpt_dir.glob("abandoned-*")
    assert [p.name for p in abandoned.iterdir()] == ["step_00000006"]  # moved, not deleted
    assert manager.resolve("auto") == manager.resolve("latest") == ckpt_dir / "step_00000004"
    assert manager.resolve(str(ckpt_dir / "step_00000002"), rollback=True) == ckpt_dir / "step_00000002"
    manager.abandon_after(ckpt_dir / "step_00000002")
    assert manager.resolve("auto") == ckpt_dir / "step_00000002"  # auto never jumps forward to 4 or 6


@pytest.mark.parametrize("spec", ["2", "4", "latest"])
def test_a_rollback_acts_only_once_the_chosen_state_loaded(saved_run, spec):
    """A resume whose load fails (here: a ZeRO-2 engine, a ZeRO-1 checkpoint, no --reshard) leaves the
    run folder byte for byte as it was, --rollback or not; once a load succeeds the newer checkpoints
    are moved aside."""
    from llmtools.ckpt.request import ResumeRequest
    from llmtools.train import checkpointing
    from tests.folder_snapshot import changes, snapshot

    manager = CheckpointManager(saved_run)
    request = ResumeRequest.parse(spec, rollback=True)
    options = checkpointing.ReviewOptions()
    before = snapshot(saved_run)
    chosen = checkpointing.choose(manager, request, {}, options)
    assert changes(before, snapshot(saved_run)) == []
    with pytest.raises(InputError, match="ZeRO-1, this run uses ZeRO-2"):
        checkpointing.resume(manager, worker.build_engine(2), chosen, request, {}, options)
    assert changes(before, snapshot(saved_run)) == []
    accepted, state = checkpointing.resume(manager, worker.build_engine(1), chosen, request, {}, options)
    assert accepted.path == chosen.path and state["step"] == accepted.step
    later = [p.name for p in chosen.path.parent.glob("step_*") if p.name > chosen.path.name]
    assert later == [] and (list(saved_run.glob("checkpoints/abandoned-*")) != []) == (spec != "latest")


def test_resolve_auto_on_fresh_run_is_none(tmp_path):
    assert CheckpointManager(tmp_path / "fresh").resolve("auto") is None


def test_resolve_errors_name_the_problem(saved_run, tmp_path):
    manager = CheckpointManager(saved_run)
    with pytest.raises(InputError, match=r"no checkpoint for step 5 \(steps saved: 2, 4, 6\)"):
        manager.resolve("5")
    with pytest.raises(InputError, match="no such checkpoint"):
        manager.resolve(str(tmp_path / "nowhere"))
    with pytest.raises(InputError, match="not a checkpoint folder"):
        manager.resolve(str(tmp_path))
    with pytest.raises(InputError, match="latest: missing"):
        CheckpointManager(tmp_path / "fresh").resolve("latest")


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, message",
    [
        ("flip", "sha256 differs"),
        ("truncate", "truncated"),
        ("no-meta", "meta.json: missing"),
        ("incomplete", "complete]: not true"),
        ("bad-json", "not valid JSON"),
        ("missing-file", "missing"),
        ("shape", "shape"),
    ],
)
def test_auto_skips_a_broken_newest_checkpoint(saved_run, damage, message):
    newest = saved_run / "checkpoints" / "step_00000006"
    optim = newest / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    meta_path = newest / "meta.json"
    if damage == "flip":
        _flip_byte(optim)
    elif damage == "truncate":
        optim.write_bytes(optim.read_bytes()[:100])
    elif damage == "no-meta":
        meta_path.unlink()
    elif damage == "incomplete":
        meta = json.loads(meta_path.read_text())
        meta["complete"] = False
        meta_path.write_text(json.dumps(meta))
    elif damage == "bad-json":
        meta_path.write_text(meta_path.read_text()[:50])
    elif damage == "missing-file":
        (newest / "rng_rank0000.pt").unlink()
    elif damage == "shape":
        meta = json.loads(meta_path.read_text())
        meta["param_shapes"]["inp.weight"] = [3, 3]
        meta_path.write_text(json.dumps(meta))
    warnings = []
    manager = CheckpointManager(saved_run, warn=warnings.append)
    assert manager.resolve("auto") == saved_run / "checkpoints" / "step_00000004"
    assert len(warnings) == 1 and "step_00000006" in warnings[0] and message in warnings[0]
    # the explicit specs do not fall back: they fail and say why
    with pytest.raises(InputError, match=message.replace("]", r"\]").replace("(", r"\(")):
        manager.resolve("latest")
    with pytest.raises(InputError):
        manager.resolve("6")
    with pytest.raises(InputError):
        check(newest)


def test_a_killed_save_leaves_the_previous_state(saved_run, ds_world):
    """Whatever a kill leaves behind (a .tmp- folder at any stage) is ignored, then cleaned by the next save."""
    ckpt_dir = saved_run / "checkpoints"
    partial = ckpt_dir / layout.tmp_name(8)
    shutil.copytree(ckpt_dir / "step_00000006", partial)  # even one with a complete-looking meta.json
    (ckpt_dir / "step_00000010.tmp-delete").mkdir()
    manager = CheckpointManager(saved_run)
    assert manager.resolve("auto") == ckpt_dir / "step_00000006"
    assert _steps(saved_run) == [2, 4, 6]
    engine = worker.build_engine(1)
    manager.save(engine, 8, worker.client_state(8))
    assert not layout.leftovers(ckpt_dir)
    assert _steps(saved_run) == [2, 4, 6, 8]
    assert manager.resolve("auto") == ckpt_dir / "step_00000008"


def test_prune_keep_last_and_keep_every(saved_run):
    removed = CheckpointManager(saved_run, keep_last=1, keep_every=4).prune()
    assert [p.name for p in removed] == ["step_00000002"]
    assert _steps(saved_run) == [4, 6]
    assert not layout.leftovers(saved_run / "checkpoints")


def test_prune_never_removes_the_newest_verified(saved_run):
    ckpt_dir = saved_run / "checkpoints"
    _flip_byte(ckpt_dir / "step_00000006" / "mp_rank_00_model_states.pt")
    CheckpointManager(saved_run, keep_last=1).prune()
    # step 6 is the newest complete one (kept by keep_last), step 4 the newest that verifies (kept too)
    assert _steps(saved_run) == [4, 6]
    assert CheckpointManager(saved_run, warn=lambda _m: None).resolve("auto") == ckpt_dir / "step_00000004"


def test_save_prunes_as_it_goes(tmp_path, ds_world):
    engine = worker.build_engine(0)
    manager = CheckpointManager(tmp_path / "run", keep_last=2, keep_every=3)
    for step in range(1, 8):
        worker.train_step(engine, step)
        manager.save(engine, step, worker.client_state(step))
    assert _steps(tmp_path / "run") == [3, 6, 7]


def test_saving_the_same_step_again_replaces_it(saved_run, ds_world):
    engine = worker.build_engine(1)
    manager = CheckpointManager(saved_run)
    before = read_meta(saved_run / "checkpoints" / "step_00000006")["time"]
    manager.save(engine, 6, worker.client_state(6))
    assert read_meta(saved_run / "checkpoints" / "step_00000006")["time"] >= before
    assert _steps(saved_run) == [2, 4, 6] and not layout.leftovers(saved_run / "checkpoints")


def test_refuses_another_model_shape_or_tokenizer(saved_run):
    path = saved_run / "checkpoints" / "step_00000006"
    CheckpointManager.check_compatible(path, {"hidden_size": worker.HIDDEN}, None)
    with pytest.raises(
        InputError, match=rf"model.hidden_size\]: checkpoint has {worker.HIDDEN}, the config has 32"
    ):
        CheckpointManager.check_compatible(path, {"hidden_size": 32, "vocab_size": worker.DIM}, None)
    meta_path = path / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["tokenizer"] = {"hash": "sha256:" + "a" * 64, "vocab_size": 8, "eod_id": 0}
    meta_path.write_text(json.dumps(meta))
    other = {"hash": "sha256:" + "b" * 64, "vocab_size": 8, "eod_id": 0}
    with pytest.raises(
        InputError, match=r"tokenizer.hash\]: checkpoint has 'sha256:a+', the data has 'sha256:b+'"
    ):
        CheckpointManager.check_compatible(path, None, other)


@pytest.mark.parametrize(
    "kwargs, flag", [({"keep_last": 0}, "keep_last"), ({"keep_every": -1}, "keep_every")]
)
def test_bad_keep_options(tmp_path, kwargs, flag):
    with pytest.raises(UsageError, match=flag):
        CheckpointManager(tmp_path, **kwargs)


def test_meta_written_last_and_durably(saved_run):
    """meta.json is newer than every file it describes (it is written after them)."""
    folder = saved_run / "checkpoints" / "step_00000002"
    meta_mtime = os.stat(folder / "meta.json").st_mtime_ns
    assert all(os.stat(p).st_mtime_ns <= meta_mtime for p in folder.iterdir())


def test_refuses_another_zero_stage(saved_run, ds_world):
    engine = worker.build_engine(2)  # saved_run was written by ZeRO-1
    with pytest.raises(
        InputError, match=r"zero_stage\]: the checkpoint was saved with ZeRO-1, this run uses ZeRO-2"
    ):
        CheckpointManager(saved_run).load(engine, saved_run / "checkpoints" / "step_00000006")


def test_stop_requested_by_signal_and_restored():
    import signal

    from llmtools.ckpt.signals import StopRequested, resume_command

    before = signal.getsignal(signal.SIGTERM)
    with StopRequested(announce=False) as stop:
        assert not stop and not stop.should_stop()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.should_stop() and stop.signal_name == "SIGTERM"
        assert stop.resume_hint("llm-train c.yaml", "run/checkpoints/step_00000007") == (
            "stopped by SIGTERM: saved run/checkpoints/step_00000007; resume with: llm-train c.yaml --resume auto"
        )
    assert signal.getsignal(signal.SIGTERM) is before
    with StopRequested(announce=False) as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signal_name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C aborts at once
            os.kill(os.getpid(), signal.SIGINT)
    argv = ["/x/bin/llm-train", "c.yaml", "--resume", "3", "--force", "-o", "run dir", "--reset-data"]
    assert resume_command(argv) == "llm-train c.yaml -o 'run dir' --resume auto"


# ---------------------------------------------------------------------------------------- background saves
@pytest.mark.parametrize("zero", [1, 3])
def test_a_background_save_equals_a_synchronous_one(tmp_path, ds_world, zero):
    """The staged copy is the state at the save, even though training changes the live tensors right away:
    every file of the background checkpoint holds what the synchronous one holds."""
    import torch

    # No dropout: two engines in one process draw from one RNG stream.
    sync_engine, async_engine = (worker.build_engine(zero, dropout=0.0) for _ in range(2))
    sync = CheckpointManager(tmp_path / "sync")
    background = CheckpointManager(tmp_path / "async", async_save=True)
    for step in range(1, 7):
        worker.train_step(sync_engine, step)
        worker.train_step(async_engine, step)
        if step % 2 == 0:
            sync.save(sync_engine, step, worker.client_state(step))
            folder = background.save(async_engine, step, worker.client_state(step))
            assert background.in_flight == folder and not folder.exists()  # not committed yet
        else:
            background.poll()
    assert background.wait() == tmp_path / "async" / "checkpoints" / "step_00000006"
    assert background.in_flight is None and not layout.leftovers(tmp_path / "async" / "checkpoints")
    for step in (2, 4, 6):
        a, b = (
            root / "checkpoints" / layout.step_name(step) for root in (tmp_path / "sync", tmp_path / "async")
        )
        assert verify(b).ok, verify(b).problems
        assert read_meta(a)["files"].keys() == read_meta(b)["files"].keys()
        for name in read_meta(a)["files"]:
            if not name.startswith("rng_"):  # two engines in one process draw from one RNG stream
                _assert_same(
                    torch.load(a / name, weights_only=False), torch.load(b / name, weights_only=False), name
                )


def _assert_same(x, y, where: str) -> None:
    import torch

    if isinstance(x, torch.Tensor):
        assert isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y), where
    elif isinstance(x, dict):
        assert x.keys() == y.keys(), where
        for key in x:
            _assert_same(x[key], y[key], f"{where}[{key}]")
    elif isinstance(x, (list, tuple)):
        assert len(x) == len(y), where
        for i, (u, v) in enumerate(zip(x, y, strict=True)):
            _assert_same(u, v, f"{where}[{i}]")
    elif hasattr(x, "__dict__") and type(x).__eq__ is object.__eq__:  # e.g. DeepSpeed's loss scaler
        assert type(x) is type(y), where
        _assert_same(vars(x), vars(y), where)
    else:
        assert x == y, where


def test_at_most_one_background_save_in_flight(tmp_path, ds_world):
    engine = worker.build_engine(1)
    manager = CheckpointManager(tmp_path / "run", async_save=True)
    worker.train_step(engine, 1)
    first = manager.save(engine, 1, worker.client_state(1))
    worker.train_step(engine, 2)
    second = manager.save(engine, 2, worker.client_state(2))  # commits the first before staging the second
    assert first.is_dir() and verify(first).ok and manager.in_flight == second
    assert manager.save(
        engine, 3, worker.client_state(3), blocking=True
    ) == tmp_path / "run" / "checkpoints" / ("step_00000003")
    assert manager.in_flight is None and _steps(tmp_path / "run") == [1, 2, 3]


def test_a_failed_background_write_is_reported_and_commits_nothing(tmp_path, ds_world, monkeypatch):
    from llmtools.ckpt import writer
    from llmtools.errors import RuntimeFailure

    engine = worker.build_engine(1)
    manager = CheckpointManager(tmp_path / "run", async_save=True)
    worker.train_step(engine, 1)
    manager.save(engine, 1, worker.client_state(1), blocking=True)

    def disk_full(obj, path):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(writer, "write_file", disk_full)
    worker.train_step(engine, 2)
    manager.save(engine, 2, worker.client_state(2))
    with pytest.raises(
        RuntimeFailure, match=r"(?i)checkpoint of step 2 not saved: .*no space left on device"
    ):
        manager.wait()
    assert _steps(tmp_path / "run") == [1]
    assert manager.resolve("auto").name == "step_00000001"


def test_staging_copies_and_reuses_its_buffers():
    import torch

    from llmtools.ckpt.writer import stage

    live = {"w": torch.ones(3), "nested": [torch.zeros(2), 5, "x"], "t": (torch.arange(2),)}
    first = stage(live)
    live["w"].add_(1)
    assert first["w"].tolist() == [1.0, 1.0, 1.0]  # a copy, not a view
    second = stage(live, reuse=first)
    assert second["w"] is first["w"] and second["w"].tolist() == [2.0, 2.0, 2.0]  # same buffer, refilled
    assert second["nested"][1:] == [5, "x"] and isinstance(second["t"], tuple)
