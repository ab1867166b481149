"""``llm-train --nproc-per-node 2 ...`` starts its own workers and ends as one process does: a refusal exits
2 with its line once (the rank the launcher stops meanwhile says nothing), a signal stop exits 128 + the
signal with ``"stopped"`` in ``--json`` and the resume line last (pasting it resumes), a crashed rank exits 1
with one short line. Real processes: the installed ``llm-train``, two workers on CPU (gloo)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.train.test_exactness import BIN, HOOKS, REPO, write_config
from tests.train.test_stop_contract import BOUND, _env, _signal_after_first_step, _workers

ZERO1 = str(REPO / "configs/deepspeed/zero1.json")


def _launched(config: Path, run: Path, *extra: str) -> list[str]:
    return [str(BIN / "llm-train"), "--nproc-per-node", "2", str(config), "--deepspeed", ZERO1, "-o", str(run),
            *extra]  # fmt: skip


def _hooked(**values: str) -> dict:
    env = {**_env(), **values}
    env["PYTHONPATH"] = f"{HOOKS}{os.pathsep}{env['PYTHONPATH']}"
    return env


def _no_launcher_noise(err: str) -> None:
    for noise in ("ChildFailedError", "Traceback", "interrupted by SIGTERM", "Sending process", "exitcode"):
        assert noise not in err, err[-3000:]


def test_a_refusal_exits_2_with_its_line_once_and_the_stopped_peer_is_quiet(byte_data, tmp_path):
    """Rank 0 refuses (the run folder holds a file that is not ours) while rank 1 is still reading its
    config (20 s late): the launcher stops rank 1 itself; that stop is its own, not the user's."""
    config = write_config(tmp_path / "train.yaml", byte_data["mix"], {"training": {"train_steps": 2}})
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    done = subprocess.run(_launched(config, run, "--json"), cwd=tmp_path, env=_hooked(LLMTOOLS_TEST_SLOW_RANK="1"),
                          capture_output=True, text=True, timeout=BOUND)  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llm-train: error: "), done.stderr[-3000:]
    assert "metrics.jsonl: already exists" in lines[0]
    assert done.stdout == ""
    _no_launcher_noise(done.stderr)


def test_bad_launcher_options_are_refused_before_any_worker_starts(tmp_path):
    done = subprocess.run([str(BIN / "llm-train"), "--nproc-per-node", "2", "--nnodes", "3:1", "tiny", "--deepspeed",
                           "zero1", "-o", str(tmp_path / "run")], capture_output=True, text=True, env=_env(),
                          cwd=tmp_path, timeout=BOUND)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "llm-train: error: launcher options: min_nodes must be > 0 and <= max_nodes, got min_nodes=3, max_nodes=1"
    ]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_sigterm_to_the_launcher_saves_exits_143_and_its_resume_line_resumes(byte_data, tmp_path):
    """SIGTERM to the launcher alone (as `kill PID` of the job): it forwards the signal, the workers save,
    it exits 143, rank 0's --json says stopped, and the last line is the launch line with --resume auto.
    Pasted (with the workers stopping themselves after one step: a signal sent to the workers, not the
    launcher), it resumes and stops the same way, and --max-restarts does not restart a stop."""
    config = write_config(tmp_path / "train.yaml", byte_data["mix"], {"training": {"train_steps": 600}})
    run = tmp_path / "run"
    argv = _launched(config, run, "--json", "--max-restarts", "1")
    code, out, err = _signal_after_first_step(argv, run, signal.SIGTERM, _env(), tmp_path)
    assert code == 143, err[-3000:]
    result = json.loads(out)
    assert result["stopped"] == "SIGTERM" and result["steps"] < 600, result
    saved = Path(result["checkpoint"])
    assert (saved / "meta.json").is_file()
    last = err.strip().splitlines()[-1]
    hint = f"stopped by SIGTERM: saved {saved}; resume with: "
    assert last.startswith(hint), err[-3000:]
    assert err.count("stopped by SIGTERM: saved") == 1, err[-3000:]
    line = shlex.split(last.removeprefix(hint))
    assert line[:3] == ["llm-train", "--nproc-per-node", "2"] and line[-2:] == ["--resume", "auto"], line
    assert "--max-restarts" in line, line
    _no_launcher_noise(err)

    again = subprocess.run([str(BIN / "llm-train"), *line[1:]], cwd=tmp_path, capture_output=True, text=True,
                           env=_hooked(LLMTOOLS_TEST_STOP_AT="1"), timeout=BOUND)  # fmt: skip
    assert again.returncode == 143, again.stderr[-3000:]
    resumed = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(r["kind"] == "event" and r["event"] == "resume" for r in resumed)
    assert max(r["step"] for r in resumed if r["kind"] == "train") == result["steps"] + 1
    step = run / "checkpoints" / f"step_{result['steps'] + 1:08d}"
    assert (
        again.stderr.strip()
        .splitlines()[-1]
        .startswith(f"stopped by SIGTERM: saved {step}; resume with: llm-train ")
    ), again.stderr[-3000:]


@pytest.mark.slow
def test_a_killed_worker_exits_1_with_one_line_for_that_rank(byte_data, tmp_path):
    """kill -9 of rank 1 mid-training: exit 1, one line per failed rank, rank 1's naming its signal; rank 0
    ends by itself (its peer is gone, its line says so) or is stopped by the launcher, and never claims
    to have been interrupted."""
    config = write_config(tmp_path / "train.yaml", byte_data["mix"], {"training": {"train_steps": 600}})
    run = tmp_path / "run"

    def rank_1(launcher: int) -> list[int]:
        for pid in _workers(launcher):
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if b"RANK=1" in environ:
                return [pid]
        raise AssertionError("no worker of rank 1")

    code, out, err = _signal_after_first_step(_launched(config, run), run, signal.SIGKILL, _env(), tmp_path,
                                              targets=rank_1)  # fmt: skip
    assert code == 1, err[-3000:]
    failed = [line for line in err.splitlines() if line.startswith("llm-train: error: rank ")]
    assert err.strip().splitlines()[-len(failed) :] == failed, err[-3000:]  # the summary ends the output
    killed = r"llm-train: error: rank 1 \(local rank 1, pid \d+\) was killed by SIGKILL: it left no message"
    assert re.match(killed, failed[-1]), err[-3000:]
    if len(failed) == 2:  # rank 0 saw its peer go before the launcher stopped it
        assert re.match(
            r"llm-train: error: rank 0 \(local rank 0, pid \d+\) exited 1: rank 0: lost rank 1 ", failed[0]
        ), err
    assert len(failed) in (1, 2), err[-3000:]
    assert "received SIGTERM" not in err
    _no_launcher_noise(err)


def test_a_dry_run_under_the_launcher_checks_every_rank_and_prints_one_plan(byte_data, tmp_path):
    """The plan of two ranks (global batch 8 = 2 ranks x micro 4: no accumulation), printed once."""
    config = write_config(tmp_path / "train.yaml", byte_data["mix"], {"training": {"train_steps": 2}})
    done = subprocess.run(_launched(config, tmp_path / "run", "--dry-run", "--json"), cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=BOUND)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    plan = json.loads(done.stdout)  # one object
    assert plan["grad_accumulation"] == 1 and plan["deepspeed"]["train_batch_size"] == 8, plan


@pytest.mark.slow
def test_with_max_restarts_a_killed_worker_is_restarted_and_the_run_resumes_to_its_end(byte_data, tmp_path):
    """kill -9 of rank 1 once step 2 is saved, --max-restarts 1 and --resume auto: the launcher restarts
    both workers, they continue from the newest checkpoint, the run ends at its last step and exits 0."""
    cell = {"training": {"train_steps": 12}, "checkpoint": {"save_every": 2, "save_final": True}}
    config = write_config(tmp_path / "train.yaml", byte_data["mix"], cell)
    run = tmp_path / "run"
    argv = _launched(config, run, "--json", "--max-restarts", "1", "--resume", "auto")
    proc = subprocess.Popen(argv, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    saved = run / "checkpoints" / "step_00000002" / "meta.json"
    deadline = time.monotonic() + BOUND
    while not saved.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in _workers(proc.pid):
        if b"RANK=1" in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            os.kill(pid, signal.SIGKILL)
    out, err = (x.decode() for x in proc.communicate(timeout=BOUND))
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out)
    assert result["steps"] == 12 and result["stopped"] is None, result
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    resumed = [r for r in records if r["kind"] == "event" and r["event"] == "resume"]
    assert len(resumed) == 1 and resumed[0]["step"] >= 2, err[-3000:]
    _no_launcher_noise(err)


def test_the_launcher_options_are_split_from_the_workers_arguments_in_either_spelling():
    from llmtools.train.launch import split_argv

    argv = ["--nproc-per-node", "2", "tiny", "--nnodes=1:2", "--deepspeed", "zero2", "--max_restarts", "3",
            "--set", "training.train_steps=5", "-o", "runs/t", "--rdzv-conf=join_timeout=5"]  # fmt: skip
    launcher, worker = split_argv(argv)
    assert launcher == [
        "--nproc-per-node",
        "2",
        "--nnodes=1:2",
        "--max_restarts",
        "3",
        "--rdzv-conf=join_timeout=5",
    ]
    assert worker == ["tiny", "--deepspeed", "zero2", "--set", "training.train_steps=5", "-o", "runs/t"]


def test_every_launcher_option_is_an_option_of_llm_train():
    """The options the launcher takes off the command line are the ones llm-train declares (both spellings)."""
    from llmtools.train.launch import OPTIONS

    shown = subprocess.run(
        [str(BIN / "llm-train"), "--help"], capture_output=True, text=True, env=_env()
    ).stdout
    for name in OPTIONS:
        spelled = f"--{name}, --{name.replace('-', '_')}" if "-" in name else f"--{name} "
        assert spelled in shown, name
