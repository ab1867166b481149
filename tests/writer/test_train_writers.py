"""One llm-train per run folder (real processes): two started together, llm-ckpt prune during a run, a
holder killed with -9, and SIGHUP / SIGQUIT stopping like SIGTERM."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from llmtools.ckpt import layout
from llmtools.ckpt.verify import verify
from tests.ports import free_port
from tests.writer.conftest import cli, env, records, run, train_args, write_config

pytestmark = pytest.mark.slow
LONG = 40  # steps: long enough that a run is still going while the test looks at it


def _popen(args) -> subprocess.Popen:
    return subprocess.Popen(
        [str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env()
    )


def _wait_for(predicate, what: str, procs=(), timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(
                    f"exited {proc.returncode} while waiting for {what}: {proc.stderr.read()[-3000:]}"
                )
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _train_records(run_dir: Path) -> list[dict]:
    try:
        return records(run_dir, "train")
    except (FileNotFoundError, ValueError):  # not yet written, or a line half-written as we read
        return []


def _steps(run_dir: Path) -> list[int]:
    return [step for step, _ in layout.list_checkpoints(run_dir / "checkpoints")]


def test_two_llm_train_on_one_run_started_together(tmp_path, byte_mix):
    """A requeued job racing the old one: both `--resume auto` on one folder, started together. One trains,
    the other exits 2 naming it (host, pid, start time) without writing; so does llm-ckpt prune; the
    survivor's metrics hold each step once, and SIGHUP stops it like SIGTERM (saved, exit 128 + SIGHUP)."""
    config = write_config(tmp_path / "train.yaml", byte_mix, training={"train_steps": LONG})
    run_dir = tmp_path / "run"
    procs = [_popen(train_args(config, run_dir, 2, "--resume", "auto")) for _ in range(2)]
    try:
        _wait_for(lambda: any(p.poll() is not None for p in procs), "one of the two to give way", timeout=600)
        loser = next(p for p in procs if p.poll() is not None)
        winner = procs[1 - procs.index(loser)]
        _, err = loser.communicate()
        assert loser.returncode == 2, err[-3000:]
        assert f"llm-train: error: {run_dir}: in use by " in err
        assert f"(pid {winner.pid} on {socket.gethostname()}, started " in err and "Traceback" not in err

        _wait_for(
            lambda: len(_train_records(run_dir)) >= 3 and _steps(run_dir), "3 steps and a save", [winner]
        )
        pruned = run([*cli("ckpt"), "prune", run_dir, "--keep", "1"])
        assert pruned.returncode == 2 and f"(pid {winner.pid} on " in pruned.stderr

        winner.send_signal(signal.SIGHUP)
        _, err = winner.communicate(timeout=300)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert winner.returncode == 128 + signal.SIGHUP, err[-3000:]  # stopped before its end, resumable
    assert "stopped by SIGHUP: saved " in err
    steps = [r["step"] for r in records(run_dir, "train")]
    assert steps == list(range(1, steps[-1] + 1)) and steps[-1] < LONG  # every step once, in order
    assert records(run_dir, "event")[-1]["event"] == "stop"
    assert _steps(run_dir)[-1] == steps[-1]
    assert all(verify(path).ok for _, path in layout.list_checkpoints(run_dir / "checkpoints"))
    assert not layout.leftovers(run_dir / "checkpoints") and not (run_dir / "run.lock").exists()


def test_a_holder_killed_with_9_leaves_no_lock_behind(tmp_path, byte_mix):
    """kill -9 leaves RUN/run.lock as a file but not as a lock: --resume auto goes on at once, and SIGQUIT
    stops the resumed run like SIGTERM."""
    config = write_config(tmp_path / "train.yaml", byte_mix, training={"train_steps": LONG})
    run_dir = tmp_path / "run"
    first = _popen(train_args(config, run_dir))
    try:
        _wait_for(lambda: len(_steps(run_dir)) >= 1, "a checkpoint", [first])
        first.kill()
        first.wait(timeout=60)
        assert (run_dir / "run.lock").exists()
        saved = _steps(run_dir)[-1]
        second = _popen(train_args(config, run_dir, 2, "--resume", "auto"))
        _wait_for(
            lambda: (
                any(e["event"] == "resume" for e in _events(run_dir))
                and _train_records(run_dir)[-1]["step"] > saved
            ),
            "a resumed step",
            [second],
        )
        second.send_signal(signal.SIGQUIT)
        _, err = second.communicate(timeout=300)
    finally:
        for p in (first,):
            if p.poll() is None:
                p.kill()
    assert second.returncode == 128 + signal.SIGQUIT, err[-3000:]
    assert "stopped by SIGQUIT: saved " in err and "in use by" not in err
    assert _steps(run_dir)[-1] > saved


def _events(run_dir: Path) -> list[dict]:
    try:
        return records(run_dir, "event")
    except (FileNotFoundError, ValueError):
        return []


HOLD_RUN = """
import sys, time
from llmtools.locks import lock_run
with lock_run(sys.argv[1], command="holder-for-test"):
    print("held", flush=True)
    time.sleep(600)
"""


def test_every_rank_stops_when_another_writer_holds_the_run(tmp_path, byte_mix):
    """Two ranks under torchrun: rank 0 finds the folder locked and every rank exits 2 alike (none is left
    waiting in a collective), writing nothing."""
    import sys

    config = write_config(tmp_path / "train.yaml", byte_mix)
    run_dir = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_RUN, str(run_dir)], stdout=subprocess.PIPE, text=True,
                              env=env())  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        port = free_port()
        args = train_args(config, run_dir, 2, "--resume", "auto")
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port,
                    "-m", "llmtools.cli.train", *args[3:]]  # fmt: skip
        done = run(torchrun, timeout=600)
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert done.returncode != 0
    refusals = [line for line in done.stderr.splitlines() if line.startswith("llm-train: error: ")]
    assert len(refusals) == 2, done.stderr[-3000:]
    assert all(f"{run_dir}: in use by holder-for-test (pid {holder.pid} on " in line for line in refusals)
    assert sorted(p.name for p in run_dir.iterdir()) == ["run.lock"]
