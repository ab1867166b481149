"""Every sink shows the history of the run as it now stands: after ``--resume STEP --rollback`` with a
changed learning rate, and after a kill -9 before the first checkpoint then ``--resume auto``,
metrics.jsonl, the in-run TensorBoard and ``llm-log tb`` of it hold each step once with the value of the
timeline the run continued, and the run folder keeps one W&B run and one MLflow run, FINISHED;
``llm-log wandb|mlflow`` exports made before and after the rollback into the same tracker runs end with
the new values at the rolled-back steps."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmtools.logs.trackers import read_wandb_history, read_wandb_summary
from tests.logs.helpers import scalars
from tests.train.test_cli import DS, llm_train, write_config
from tests.train.test_tracking import mlflow_latest, mlflow_run, tracked_env, train_steps, wandb_latest

pytest.importorskip("wandb")
pytest.importorskip("mlflow")
pytest.importorskip("tensorboard")


def _train_lrs(run_dir: Path) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["lr"] for r in map(json.loads, lines) if r["kind"] == "train"}


def _llm_log_tb(run_dir: Path, logdir: Path, env) -> dict[str, dict[int, float]]:
    out = subprocess.run(
        [sys.executable, "-m", "llmtools.cli.log", "tb", str(run_dir / "metrics.jsonl"), "--logdir", str(logdir)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    (folder,) = [p for p in logdir.iterdir() if p.is_dir()]
    return scalars(folder)


def _one_tracker_run_each(run_dir: Path) -> None:
    ids = {p.name.rsplit("-", 1)[-1] for p in (run_dir / "wandb").glob("offline-run-*")}
    assert len(ids) == 1, f"one W&B run per run folder: {sorted(ids)}"
    _, runs = mlflow_run(run_dir)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED", [r.info.status for r in runs]


def test_a_rollback_with_a_new_lr_replaces_the_abandoned_steps(byte_data, tmp_path, cli_env):
    config = write_config(
        tmp_path,
        byte_data["mix"],
        schedule={"kind": "constant", "warmup_steps": 0},
        logging={"log_every": 1, "report_to": ["wandb", "mlflow", "tensorboard"]},
    )
    run_dir, env = tmp_path / "run", tracked_env(cli_env)
    first = llm_train([config, "--deepspeed", DS, "-o", run_dir], env)
    assert first.returncode == 0, first.stderr[-3000:]
    exported = {
        tracker: _export(tracker, run_dir, tmp_path / f"upload-{tracker}", env) for tracker in TRACKERS
    }
    again = llm_train(
        [config, "--deepspeed", DS, "-o", run_dir, "--resume", "4", "--rollback", "--set", "optimizer.lr=1e-4"],
        env,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    lrs = _train_lrs(run_dir)
    assert train_steps(run_dir) == list(range(1, 9))  # each step once
    # the learning rate as written into JSON and read back: a float printed and parsed, no arithmetic
    assert all(lrs[s] == pytest.approx(3e-3) for s in range(1, 5)), lrs
    assert all(lrs[s] == pytest.approx(1e-4) for s in range(5, 9)), lrs  # the new timeline's (as above)
    inrun = scalars(run_dir / "tensorboard")["train/lr"]
    # one value through another writer (TensorBoard, the trackers: float32) equals it to float32 precision
    assert sorted(inrun) == list(range(1, 9)) and all(inrun[s] == pytest.approx(lrs[s]) for s in inrun), inrun
    converted = _llm_log_tb(run_dir, tmp_path / "tb", env)["train/lr"]
    assert sorted(converted) == list(range(1, 9))
    # one value through another writer (TensorBoard, the trackers: float32) equals it to float32 precision
    assert all(converted[s] == pytest.approx(lrs[s]) for s in converted), converted
    _one_tracker_run_each(run_dir)
    client, (run,) = mlflow_run(run_dir)
    assert "steps 5..8" in run.data.tags["event/00000004/superseded"]  # the abandoned values, marked
    # ...and the trackers hold the new timeline's values at those steps, logged after the old ones
    mlflow_lrs = mlflow_latest(client, run.info.run_id, "train/lr")
    assert sorted(mlflow_lrs) == list(range(1, 9))
    # one value through another writer (TensorBoard, the trackers: float32) equals it to float32 precision
    assert all(mlflow_lrs[s] == pytest.approx(lrs[s]) for s in mlflow_lrs), mlflow_lrs
    (run_id,) = {p.name.rsplit("-", 1)[-1] for p in (run_dir / "wandb").glob("offline-run-*")}
    rows = read_wandb_history(run_dir / "wandb", run_id)
    wandb_lrs = wandb_latest(rows, "train/lr")
    assert sorted(wandb_lrs) == list(range(1, 9))
    # one value through another writer (TensorBoard, the trackers: float32) equals it to float32 precision
    assert all(wandb_lrs[s] == pytest.approx(lrs[s]) for s in wandb_lrs), wandb_lrs
    assert "steps 5..8" in read_wandb_summary(run_dir / "wandb", run_id)["event/00000004/superseded"]
    # llm-log exported the run before the rollback; exporting it again into the same tracker runs marks
    # the abandoned steps superseded and logs the new values at them: the value logged last is the run's
    for tracker in TRACKERS:
        run_id, before = exported[tracker]
        again_id, steps = _export(tracker, run_dir, tmp_path / f"upload-{tracker}", env)
        assert again_id == run_id, tracker  # one tracker run per source
        counts = {s: sum(1 for step, _ in steps if step == s) for s in range(1, 9)}
        assert counts == {**dict.fromkeys(range(1, 5), 1), **dict.fromkeys(range(5, 9), 2)}, (tracker, steps)
        latest = dict(steps)
        # the float went through JSON text twice (metrics.jsonl, the tracker's store): 1e-6 relative is far
        # below the learning-rate change these steps must show
        assert all(latest[s] == pytest.approx(lrs[s], rel=1e-6) for s in latest), (tracker, steps)
        assert all(dict(before)[s] != lrs[s] for s in range(5, 9)), (tracker, before)


TRACKERS = ("wandb", "mlflow")


def _export(tracker: str, run_dir: Path, folder: Path, env) -> tuple[str, list[tuple[int, float]]]:
    """``llm-log TRACKER RUN --dir FOLDER``: (the tracker run id, its ``train/lr`` values as (step, value)
    in the order logged)."""
    out = subprocess.run(
        [str(Path(sys.executable).parent / "llm-log"), tracker, str(run_dir), "--dir", str(folder)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    if tracker == "wandb":
        (uploaded,) = {p.name.rsplit("-", 1)[-1] for p in (folder / "wandb").glob("offline-run-*")}
        rows = read_wandb_history(folder / "wandb", uploaded)
        return uploaded, [(s, row["train/lr"]) for s, row in rows if "train/lr" in row]
    client, (run,) = mlflow_run(folder)
    history = sorted(client.get_metric_history(run.info.run_id, "train/lr"), key=lambda m: m.timestamp)
    return run.info.run_id, [(m.step, m.value) for m in history]


def test_a_kill_before_the_first_checkpoint_then_resume_auto_keeps_one_tracker_run(
    byte_data, tmp_path, cli_env
):
    config = write_config(
        tmp_path, byte_data["mix"], logging={"log_every": 1, "report_to": ["wandb", "mlflow", "tensorboard"]}
    )
    run_dir, env = tmp_path / "run", tracked_env(cli_env)
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmtools.cli.train", config, "--deepspeed", DS, "-o", run_dir],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if (run_dir / "metrics.jsonl").exists() and max(train_steps(run_dir), default=0) >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert 2 <= max(train_steps(run_dir)) < 4, proc.stderr.read()[-2000:]
    assert not list((run_dir / "checkpoints").glob("step_*"))
    time.sleep(1.0)  # W&B's service process writes what it was sent before it notices its parent is gone
    more = llm_train([config, "--deepspeed", DS, "-o", run_dir, "--resume", "auto"], env)
    assert more.returncode == 0, more.stderr[-3000:]
    assert train_steps(run_dir) == list(range(1, 9))
    assert sorted(scalars(run_dir / "tensorboard")["train/loss"]) == list(range(1, 9))
    _one_tracker_run_each(run_dir)
