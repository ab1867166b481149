"""``logging.report_to``: W&B (offline) and MLflow (local store) from ``llm-train``, read back through each
library's own reader: every metric at every step exactly once across a kill -9 and a resume; an
unreachable tracker costs a warning, never the run; a tracker that cannot work is refused before compute."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.train.test_cli import DS, free_port, llm_train, write_config

pytest.importorskip("wandb")
pytest.importorskip("mlflow")


def tracked_env(cli_env: dict) -> dict:
    env = dict(cli_env)
    for key in ("WANDB_MODE", "MLFLOW_TRACKING_URI", "WANDB_API_KEY", "WANDB_BASE_URL"):
        env.pop(key, None)
    env["WANDB_DISABLE_GIT"] = "true"
    return env


def train_steps(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r["step"] for r in map(json.loads, lines) if r["kind"] == "train"]


def mlflow_run(run_dir: Path):
    from mlflow.tracking import MlflowClient

    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # the folder store the run wrote (mlflow-skinny's)

    client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return client, runs


def jsonl_values(run_dir: Path, key: str) -> dict[int, float]:
    """``{step: value}`` of train records' ``key`` in metrics.jsonl (the run's history as it stands)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r[key] for r in map(json.loads, lines) if r["kind"] == "train" and key in r}


def mlflow_latest(client, run_id: str, key: str) -> dict[int, float]:
    """``{step: value}`` with the value logged last at each step (the one a rollback logged again)."""
    history = sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)
    return {m.step: m.value for m in history}


def wandb_latest(rows: list, key: str) -> dict[int, float]:
    """``{training step: value}`` with the value logged last at each step, from read_wandb_history."""
    return {step: row[key] for step, row in rows if key in row}


def test_kill9_then_resume_logs_every_step_once(byte_data, tmp_path, cli_env):
    from llmtools.logs.trackers import read_wandb_history, read_wandb_summary

    config = write_config(
        tmp_path, byte_data["mix"], logging={"log_every": 1, "report_to": ["wandb", "mlflow"]}
    )
    run_dir, env = tmp_path / "run", tracked_env(cli_env)
    # Killed once step 6 is reported: steps 5 and 6 are in the trackers but not in the step-4 checkpoint.
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmtools.cli.train", config, "--deepspeed", DS, "-o", run_dir],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if (run_dir / "metrics.jsonl").exists() and max(train_steps(run_dir), default=0) >= 6:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    killed_at = max(train_steps(run_dir))
    assert 6 <= killed_at < 8, proc.stderr.read()[-2000:]
    time.sleep(1.0)  # W&B's service process writes what it was sent before it notices its parent is gone

    more = llm_train(
        [config, "--deepspeed", DS, "-o", run_dir, "--resume", "auto", "--set", "training.train_steps=10"],
        env,
    )
    assert more.returncode == 0, more.stderr
    assert "warning" not in more.stderr, more.stderr
    # metrics.jsonl holds the history as it stands: each step once (the replayed ones replaced)
    assert train_steps(run_dir) == list(range(1, 11))

    client, runs = mlflow_run(run_dir)
    assert len(runs) == 1, "the resume continued the MLflow run"
    run = runs[0]
    for key in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s"):
        # the replayed steps are logged again (the value logged last at a step is the run's)
        latest = mlflow_latest(client, run.info.run_id, key)
        expected = jsonl_values(run_dir, key.split("/", 1)[1])
        assert sorted(latest) == list(range(1, 11)), key
        # one value through another writer (TensorBoard, the trackers: float32) equals it to float32 precision
        assert all(latest[s] == pytest.approx(expected[s]) for s in latest), (key, latest, expected)
    tags = run.data.tags
    assert any(k.startswith("event/00000004/resume") for k in tags), sorted(tags)
    assert any(k.endswith("config_change") for k in tags), "the changed train_steps is an event"
    assert tags["checkpoint/path"].endswith("step_00000010")
    assert len(tags["checkpoint/sha256"]) == 64
    assert run.data.params["training.micro_batch_size"] == "4"
    assert run.info.status == "FINISHED"
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["curves.png"]

    ids = {p.name.rsplit("-", 1)[-1] for p in (run_dir / "wandb").glob("offline-run-*")}
    assert len(ids) == 1, "the resume continued the W&B run"
    (run_id,) = ids
    rows = read_wandb_history(run_dir / "wandb", run_id)
    for key in ("train/loss", "train/lr", "train/grad_norm"):
        latest = wandb_latest(rows, key)
        expected = jsonl_values(run_dir, key.split("/", 1)[1])
        assert sorted(latest) == list(range(1, 11)), (key, latest)
        # one value through another writer (TensorBoard, the trackers: float32) equals it to float32 precision
        assert all(latest[s] == pytest.approx(expected[s]) for s in latest), (key, latest, expected)
    summary = read_wandb_summary(run_dir / "wandb", run_id)
    assert summary["checkpoint/path"].endswith("step_00000010")
    assert any(k.startswith("event/00000004/resume") for k in summary)


def test_unreachable_mlflow_warns_and_the_run_finishes(byte_data, tmp_path, cli_env):
    config = write_config(
        tmp_path,
        byte_data["mix"],
        training={"train_steps": 3},
        logging={"report_to": ["mlflow"], "tracking_uri": f"http://127.0.0.1:{free_port()}"},
    )
    out = llm_train([config, "--deepspeed", DS, "-o", tmp_path / "run"], tracked_env(cli_env), timeout=200)
    assert out.returncode == 0, out.stderr
    warnings = [line for line in out.stderr.splitlines() if line.startswith("warning: mlflow")]
    assert len(warnings) == 1 and "reporting to mlflow stops here" in warnings[0], out.stderr
    assert train_steps(tmp_path / "run") == [1, 2, 3]


@pytest.mark.parametrize(
    ("report_to", "hidden", "message"),
    [
        (
            ["tensorboard", "wandbb"],
            None,
            "logging.report_to: 'wandbb' is not one of tensorboard, wandb, mlflow",
        ),
        (["wandb"], "wandb", "logging.report_to: wandb is not installed"),
    ],
)
def test_a_tracker_that_cannot_work_is_refused_before_compute(
    byte_data, tmp_path, cli_env, report_to, hidden, message
):
    config = write_config(tmp_path, byte_data["mix"], logging={"report_to": report_to})
    env = tracked_env(cli_env)
    if hidden:  # the library is not installed: import machinery finds nothing under its name
        hooks = tmp_path / "hooks"
        hooks.mkdir()
        (hooks / "sitecustomize.py").write_text(f"import sys\nsys.modules[{hidden!r}] = None\n")
        env["PYTHONPATH"] = f"{hooks}{os.pathsep}{env['PYTHONPATH']}"
    out = llm_train([config, "--deepspeed", DS, "-o", tmp_path / "run"], env, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr
    assert not (tmp_path / "run").exists()
