"""``llm-log wandb`` / ``llm-log mlflow``: the real commands in subprocesses, read back through each library's
own reader (W&B's offline run files, MLflow's ``get_metric_history``): every step once, a second upload
adds nothing, a grown log adds its new steps, ``--follow`` uploads as the log grows."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.logs.helpers import FIXTURES

pytest.importorskip("wandb")
pytest.importorskip("mlflow")


@pytest.fixture
def env(cli_env):
    env = dict(cli_env)
    for key in ("WANDB_MODE", "MLFLOW_TRACKING_URI", "WANDB_API_KEY", "WANDB_BASE_URL"):
        env.pop(key, None)
    env["WANDB_DISABLE_GIT"] = "true"
    return env


def llm_log(args, env, timeout=180):
    return subprocess.run(
        [sys.executable, "-m", "llmtools.cli.log", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def first_values(path: Path, tag: str) -> dict[int, float]:
    """The first value of each step in the log, as our parsers read it (restarts replay steps)."""
    from llmtools.logs.reader import read_log

    kind, name = tag.split("/", 1)
    out: dict[int, float] = {}
    for record in read_log(str(path))[0]:
        if record.kind == kind and name in record.values:
            out.setdefault(record.step, record.values[name])
    return out


def mlflow_history(folder: Path, tag: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # the folder store llm-log wrote (mlflow-skinny's)
    client = MlflowClient(tracking_uri=(folder / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, tag))


def wandb_history(folder: Path, tag: str) -> list[tuple[int, float]]:
    from llmtools.logs.trackers import read_wandb_history

    (run_id,) = {p.name.rsplit("-", 1)[-1] for p in (folder / "wandb").glob("offline-run-*")}
    return sorted(
        (step, row[tag]) for step, row in read_wandb_history(folder / "wandb", run_id) if tag in row
    )


def test_megatron_log_to_mlflow_once(tmp_path, env):
    log = FIXTURES / "megatron.log"
    out = llm_log(["mlflow", log, "--dir", tmp_path / "t"], env)
    assert out.returncode == 0, out.stderr
    expected = first_values(log, "train/loss")
    assert len(expected) >= 10
    got = mlflow_history(tmp_path / "t", "train/loss")
    assert [s for s, _ in got] == sorted(expected)
    # float32 round trip is not involved: MLflow stores doubles, the log prints 6 significant digits
    assert all(value == pytest.approx(expected[step], rel=1e-12) for step, value in got)
    again = llm_log(["mlflow", log, "--dir", tmp_path / "t"], env)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().endswith("\t0 new points")
    assert mlflow_history(tmp_path / "t", "train/loss") == got


def test_metrics_jsonl_to_wandb_grows_once(tmp_path, env):
    lines = (FIXTURES / "metrics.jsonl").read_text().splitlines(keepends=True)
    run = tmp_path / "run"
    run.mkdir()
    half = len(lines) // 2
    (run / "metrics.jsonl").write_text("".join(lines[:half]))
    assert llm_log(["wandb", run, "--dir", tmp_path / "t"], env).returncode == 0
    (run / "metrics.jsonl").write_text("".join(lines))
    for _ in range(2):  # the grown log adds its new steps; once more adds nothing
        out = llm_log(["wandb", run, "--dir", tmp_path / "t"], env)
        assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("\t0 new points")
    expected = first_values(run / "metrics.jsonl", "train/loss")
    got = wandb_history(tmp_path / "t", "train/loss")
    assert [s for s, _ in got] == sorted(expected)
    assert all(value == expected[step] for step, value in got)


def test_follow_uploads_as_the_log_grows(tmp_path, env):
    lines = (FIXTURES / "metrics.jsonl").read_text().splitlines(keepends=True)
    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(lines[:3]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmtools.cli.log", "mlflow", str(log), "--dir", str(tmp_path / "t"), "-f"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(8)  # started and uploading
        with open(log, "a") as handle:
            handle.writelines(lines[3:])
        expected = sorted(first_values(log, "train/loss"))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if [s for s, _ in mlflow_history(tmp_path / "t", "train/loss")] == expected:
                    break
            except ValueError:  # the run is not created yet
                pass
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, stderr  # stopped by a signal, as every command
    assert [s for s, _ in mlflow_history(tmp_path / "t", "train/loss")] == expected


def test_a_folder_that_is_not_a_run_is_one_line_exit_2(tmp_path, env):
    (tmp_path / "empty").mkdir()
    out = llm_log(["wandb", tmp_path / "empty", "--dir", tmp_path / "t"], env)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"llm-log: error: {tmp_path / 'empty'}: a folder without metrics.jsonl (not a run folder of llm-train)"
    ]
    assert json.dumps(out.stdout) == '""'


def _console_log(args, env):
    """The installed ``llm-log ARGS``."""
    script = Path(sys.executable).parent / "llm-log"
    return subprocess.run(
        [str(script), *map(str, args)], env=env, capture_output=True, text=True, timeout=300
    )


def _tracked(folder: Path, tracker: str, tag: str) -> tuple[str, list[tuple[int, float]], dict[str, str]]:
    """(tracker run id, every value of ``tag`` as (step, value) in the order logged, the event keys)."""
    from llmtools.logs.trackers import read_wandb_history, read_wandb_summary

    if tracker == "wandb":
        (run_id,) = {p.name.rsplit("-", 1)[-1] for p in (folder / "wandb").glob("offline-run-*")}
        rows = read_wandb_history(folder / "wandb", run_id)
        return (
            run_id,
            [(s, row[tag]) for s, row in rows if tag in row],
            read_wandb_summary(folder / "wandb", run_id),
        )
    from mlflow.tracking import MlflowClient

    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    client = MlflowClient(tracking_uri=(folder / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    history = sorted(client.get_metric_history(run.info.run_id, tag), key=lambda m: m.timestamp)
    return run.info.run_id, [(m.step, m.value) for m in history], dict(run.data.tags)


def _rolled_back(lines: list[str], upto: int, last: int) -> list[str]:
    """The records of a run resumed from step ``upto`` with a tenth of the learning rate, up to ``last``:
    new losses and learning rates after ``upto``, with the resume event llm-train writes."""
    out = [json.dumps({"kind": "event", "step": upto, "time": 1787000100.0, "event": "resume",
                       "message": f"resumed from checkpoints/step_{upto:08d}"}) + "\n"]  # fmt: skip
    for line in lines:
        record = json.loads(line)
        if record["kind"] == "train" and upto < record["step"] <= last:
            record.update(loss=record["loss"] + 0.5, lr=record["lr"] / 10, time=record["time"] + 100)
            out.append(json.dumps(record) + "\n")
    return out


@pytest.mark.parametrize("tracker", ["wandb", "mlflow"])
def test_a_rewritten_history_is_logged_again_into_the_same_tracker_run(tmp_path, env, tracker):
    """metrics.jsonl rewritten as ``llm-train --resume 20 --rollback`` rewrites it (llm-train's own
    ``keep_history`` drops the steps after 20; the new timeline appends its records): exporting again into
    the same tracker run marks steps 21..60 superseded and logs the new values of 21..30; the steps before
    stay as they were (logged once); a third export adds nothing; the rest of the new timeline, once
    written, replaces the remaining stale steps."""
    from llmtools.logs.trackers import scalars
    from llmtools.train.metrics import keep_history

    lines = (FIXTURES / "metrics.jsonl").read_text().splitlines(keepends=True)
    run = tmp_path / "run"
    run.mkdir()
    metrics = run / "metrics.jsonl"
    metrics.write_text("".join(lines))
    out = _console_log([tracker, run, "--dir", tmp_path / "t"], env)
    assert out.returncode == 0, out.stderr
    run_id, first, _ = _tracked(tmp_path / "t", tracker, "train/lr")
    old = dict(first)
    assert sorted(old) == list(range(1, 61))

    assert keep_history(metrics, 20)
    with open(metrics, "a") as handle:
        handle.writelines(_rolled_back(lines, 20, 30))
    out = _console_log([tracker, run, "--dir", tmp_path / "t"], env)
    assert out.returncode == 0, out.stderr
    relogged = [json.loads(line) for line in metrics.read_text().splitlines()[-10:]]
    points = sum(len(scalars(record)) for record in relogged)  # steps 21..30, every metric
    assert out.stdout.strip().endswith(f"\t{points} new points"), out.stdout
    same_run, values, events = _tracked(tmp_path / "t", tracker, "train/lr")
    assert same_run == run_id  # one tracker run per run folder
    assert "steps 21..60" in events["event/00000020/superseded"], events
    latest = dict(values)
    expected = {
        r["step"]: r["lr"] for r in map(json.loads, metrics.read_text().splitlines()) if r["kind"] == "train"
    }
    assert all(latest[s] == expected[s] for s in range(1, 31)), (latest, expected)
    assert all(latest[s] != old[s] for s in range(21, 31))
    counts = {s: sum(1 for step, _ in values if step == s) for s in range(1, 61)}
    assert all(counts[s] == 1 for s in range(1, 21)), counts  # the kept steps: not logged again
    assert all(counts[s] == 2 for s in range(21, 31)), counts  # the old value, then the new one

    again = _console_log([tracker, run, "--dir", tmp_path / "t"], env)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().endswith("\t0 new points"), again.stdout
    assert _tracked(tmp_path / "t", tracker, "train/lr")[1] == values

    with open(metrics, "a") as handle:  # the new timeline goes on to step 60
        handle.writelines(_rolled_back(lines, 30, 60)[1:])
    grown = _console_log([tracker, run, "--dir", tmp_path / "t"], env)
    assert grown.returncode == 0, grown.stderr
    expected = {
        r["step"]: r["lr"] for r in map(json.loads, metrics.read_text().splitlines()) if r["kind"] == "train"
    }
    assert dict(_tracked(tmp_path / "t", tracker, "train/lr")[1]) == expected
