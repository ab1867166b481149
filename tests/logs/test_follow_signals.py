"""``llm-log ... --follow`` stopped by a signal ends as every command a signal stops: what was read is
committed, then exit 128 + the signal with one "interrupted by" line. A tracker that cannot start is one
error line, never an error line carrying a warning of its own (one level per line). Through the real
``llm-log`` console script."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.logs.helpers import FIXTURES

BIN = Path(sys.executable).parent


@pytest.fixture
def env(cli_env):
    env = dict(cli_env)
    for key in ("WANDB_MODE", "MLFLOW_TRACKING_URI", "WANDB_API_KEY", "WANDB_BASE_URL"):
        env.pop(key, None)
    env["WANDB_DISABLE_GIT"] = "true"
    return env


def _started(command: str, out: Path) -> bool:
    """The follower is in its loop: its first commit (tb) or its tracker's run id (wandb, mlflow) is on disk."""
    if command == "tb":
        return any(out.glob("*/.llm-log-state.json"))
    return (out / ".llm-log-trackers.json").exists()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("command", ["wandb", "mlflow", "tb"])
def test_a_follow_stopped_by_a_signal_exits_128_plus_the_signal(tmp_path, env, command, signum):
    if command != "tb":
        pytest.importorskip(command)
    log = tmp_path / "metrics.jsonl"
    log.write_text((FIXTURES / "metrics.jsonl").read_text())
    out = tmp_path / "out"
    where = ["--logdir", out] if command == "tb" else ["--dir", out]
    proc = subprocess.Popen(
        [BIN / "llm-log", command, log, *where, "--follow", "--poll", "0.05"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not _started(command, out) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # past the start, in the follow loop
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signum, (proc.returncode, stderr)
    assert "Traceback" not in stderr and "error:" not in stderr, stderr
    stopped = [line for line in stderr.splitlines() if "interrupted by" in line]
    assert len(stopped) == 1 and signal.Signals(signum).name in stopped[0], stderr
    assert stdout.strip(), "what was committed is still reported"


@pytest.mark.parametrize("store", ["missing", "a-file"])
def test_a_tracker_that_cannot_start_is_one_error_line_of_one_level(tmp_path, env, store):
    pytest.importorskip("mlflow")
    if store == "missing":
        uri = "file:///proc/no-such-store"
    else:  # a file where the store's folder should be
        (tmp_path / "store").write_text("not a folder")
        uri = (tmp_path / "store").as_uri()
    log = tmp_path / "metrics.jsonl"
    log.write_text((FIXTURES / "metrics.jsonl").read_text())
    proc = subprocess.run(
        [BIN / "llm-log", "mlflow", log, "--dir", tmp_path / "t", "--tracking-uri", uri],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    ours = [line for line in proc.stderr.splitlines() if line.startswith("llm-log:")]
    errors = [line for line in ours if ": error: " in line]
    assert len(errors) == 1, proc.stderr
    for line in ours:  # one level per line
        assert sum(line.count(level) for level in ("error:", "warning:")) <= 1, line
    assert "mlflow" in errors[0] and "failed" in errors[0], errors[0]
