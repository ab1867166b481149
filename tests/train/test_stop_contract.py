"""A run stopped before its end says so, the same way wherever it runs: SIGINT, SIGTERM, SIGHUP or SIGQUIT
finish the step, save it, and the process exits 128 + the signal (not 0: ``llm-train ... && llm-ckpt
convert ...`` must not carry on as if training had finished), ``--json`` says ``"stopped": "SIGINT"``
(null for a run that reached its end), and the resume line is the last thing printed. Real ``llm-train``
processes, one and two ranks (torchrun)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.ports import free_port
from tests.train.test_exactness import BIN, REPO, llm_train, write_config

BOUND = 300


def _signal_after_first_step(argv: list[str], run: Path, signum: int, env: dict, cwd: Path, targets=None):
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and '"train"' in metrics.read_text():
            break
        time.sleep(0.1)
    if proc.poll() is not None:
        out, err = proc.communicate()
        raise AssertionError(f"ended before any signal ({proc.returncode}): {err.decode()[-3000:]}")
    for pid in targets(proc.pid) if targets else [proc.pid]:
        os.kill(pid, signum)
    out, err = proc.communicate(timeout=BOUND)
    return proc.returncode, out.decode(), err.decode()


def _env() -> dict:
    env = dict(os.environ)
    env.update({"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT"])
def test_a_signal_stop_exits_128_plus_the_signal_and_says_it_stopped(byte_data, tmp_path, name):
    signum = signal.Signals[name].value
    config = write_config(tmp_path / "train.yaml", byte_data["mix"], {"training": {"train_steps": 600}})
    run = tmp_path / "run"
    argv = [str(BIN / "llm-train"), str(config), "--deepspeed", str(REPO / "configs/deepspeed/zero1.json"),
            "-o", str(run), "--json"]  # fmt: skip
    code, out, err = _signal_after_first_step(argv, run, signum, _env(), tmp_path)
    assert code == 128 + signum, (code, err[-3000:])
    result = json.loads(out)
    assert result["stopped"] == name and result["steps"] < 600, result
    saved = Path(result["checkpoint"])
    assert (saved / "meta.json").is_file() and saved.name == f"step_{result['steps']:08d}"
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"stopped by {name}: saved {saved}; resume with: ") and last.endswith(
        " --resume auto"
    ), err[-3000:]


def test_a_run_that_reaches_its_end_says_it_did_not_stop(byte_data, tmp_path):
    config = write_config(tmp_path / "train.yaml", byte_data["mix"], {"training": {"train_steps": 2}})
    done = llm_train(config, tmp_path / "run", "--json", timeout=BOUND)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert json.loads(done.stdout)["stopped"] is None


def _workers(pid: int) -> list[int]:
    try:
        children = [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return children


def test_under_torchrun_every_rank_exits_as_one_process_does(byte_data, tmp_path):
    """torchrun's agent reports a worker's non-zero exit as its own failure (its summary, exit 1: not
    ours to change); each rank exits 128 + the signal, as one process does, and the resume line is
    printed once."""
    config = write_config(tmp_path / "train.yaml", byte_data["mix"], {"training": {"train_steps": 600}})
    run = tmp_path / "run"
    argv = [str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", str(free_port()), "-m",
            "llmtools.cli.train", str(config), "--deepspeed", str(REPO / "configs/deepspeed/zero1.json"),
            "-o", str(run)]  # fmt: skip
    env = {**_env(), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    code, _out, err = _signal_after_first_step(argv, run, signal.SIGTERM, env, tmp_path, targets=_workers)
    assert code != 0, err[-3000:]
    assert len(re.findall(r"stopped by SIGTERM: saved \S+; resume with: torchrun ", err)) == 1, err[-3000:]
    # torchrun's summary names each rank's exit code: 143, not a kill by a signal
    codes = re.findall(r"rank\s*:\s*(\d) \(local_rank: \d\)\s*exitcode\s*:\s*(-?\d+)", err)
    assert sorted(codes) == [("0", "143"), ("1", "143")], err[-3000:]


def test_under_torchrun_a_rank_stopped_after_another_refused_says_why(byte_data, tmp_path):
    """Rank 0 refuses (the run folder holds a run) while rank 1 is still reading its config: torchrun
    stops rank 1 with SIGTERM; its line says that a launcher stops every rank once one has ended, not a
    bare "interrupted by SIGTERM" that reads as the cause."""
    from tests.train.test_exactness import HOOKS

    config = write_config(tmp_path / "train.yaml", byte_data["mix"], {"training": {"train_steps": 2}})
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    env = {**_env(), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "LLMTOOLS_TEST_SLOW_RANK": "1"}
    env["PYTHONPATH"] = f"{HOOKS}{os.pathsep}{env['PYTHONPATH']}"
    argv = [str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", str(free_port()), "-m",
            "llmtools.cli.train", str(config), "--deepspeed", str(REPO / "configs/deepspeed/zero1.json"),
            "-o", str(run)]  # fmt: skip
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=BOUND)
    assert "metrics.jsonl: already exists" in done.stderr, done.stderr[-3000:]
    interrupted = [line for line in done.stderr.splitlines() if "interrupted by SIGTERM" in line]
    assert interrupted, done.stderr[-3000:]
    assert all("rank 1 of 2: a launcher stops every rank once one has ended" in line for line in interrupted)
