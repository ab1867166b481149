"""``llm-train`` on two hosts (network namespaces), one torchrun agent each, as a user runs it.

* two hosts x one process == one host x two processes, loss for loss (ZeRO-3), and the checkpoints
  written by both hosts verify and convert;
* killed workers (on either host, at random steps) are survived: torchrun restarts the job, it resumes from
  the newest complete checkpoint, finishes, and its final weights equal an uninterrupted run's bitwise;
* a host that vanishes (its link goes down: no reply, no reset) ends the surviving rank within
  ``distributed.timeout_s``, with one line naming the lost rank.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.multihost.jobs import REPO, Job, host_env, last_step, train_records
from tests.train.conftest import TINY

pytestmark = pytest.mark.slow
DS = {zero: str(REPO / "configs" / "deepspeed" / f"zero{zero}.json") for zero in (2, 3)}


def write_config(folder: Path, mix: str, steps: int, save_every: int, **sections) -> Path:
    raw = {
        "model": {"preset": "tiny", **TINY},
        "data": {"mix": mix},
        "training": {"micro_batch_size": 4, "global_batch_size": 8, "train_steps": steps},
        "optimizer": {"lr": 3e-3},
        "schedule": {"warmup_steps": 3, "total_steps": steps},
        "logging": {"log_every": 1},
        "checkpoint": {"save_every": save_every},
        "distributed": {"timeout_s": 60},
    }
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    path = folder / "train.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def train_program(config: Path, zero: int, run_dir: Path, *extra: str) -> list[str]:
    return ["-m", "llmtools.cli.train", str(config), "--deepspeed", DS[zero], "-o", str(run_dir), *extra]


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in train_records(run_dir)}


def llm_ckpt(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llmtools.cli.ckpt", *map(str, args)],
        env=host_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def final_weights(run_dir: Path, out: Path) -> dict:
    """The consolidated fp32 weights of a run's newest checkpoint (through llm-ckpt convert)."""
    from safetensors.torch import load_file

    done = llm_ckpt("convert", run_dir, "--to", "safetensors", "-o", out)
    assert done.returncode == 0, done.stderr[-2000:]
    return load_file(out)


def run_job(hosts, workdir: Path, program: list[str], timeout: float = 300, **job_options) -> Job:
    job = Job(hosts, workdir, **job_options).start(program)
    try:
        codes = job.wait(timeout)
    finally:
        job.kill()
    assert codes == [0] * len(hosts), job.output()
    return job


def test_two_hosts_train_as_one_host_with_two_processes(hosts, byte_data, tmp_path):
    """ZeRO-3 across hosts (parameters gathered over the link every layer); ZeRO-2 across hosts is the
    uninterrupted run of the kill test below."""
    zero = 3
    config = write_config(tmp_path, byte_data["mix"], steps=6, save_every=3)
    two = tmp_path / "two_hosts"
    run_job(hosts, tmp_path / "job", train_program(config, zero, two))

    one = tmp_path / "one_host"
    port = 21000 + zero
    single = hosts[0].run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "--rdzv-endpoint", f"localhost:{port}", *train_program(config, zero, one)],
        env=host_env({"GLOO_SOCKET_IFNAME": "lo"}), cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert single.returncode == 0, single.stderr[-3000:]

    assert losses(two) == losses(one) and len(losses(two)) == 6  # identical, not merely close
    resolved = yaml.safe_load((two / "config.yaml").read_text())["resolved"]
    assert resolved["world_size"] == 2 and resolved["zero_stage"] == zero
    for step in (3, 6):  # written by both hosts: both ranks' files are listed, hashed, and verify
        folder = two / "checkpoints" / f"step_{step:08d}"
        verified = llm_ckpt("verify", folder)
        assert verified.returncode == 0, verified.stderr
        meta = yaml.safe_load((folder / "meta.json").read_text())
        assert meta["world_size"] == 2 and {"rng_rank0000.pt", "rng_rank0001.pt"} <= set(meta["files"])
    converted = llm_ckpt("convert", two, "--to", "hf", "-o", tmp_path / "hf")
    assert converted.returncode == 0, converted.stderr[-2000:]
    assert (tmp_path / "hf" / "config.json").is_file()


def test_killed_workers_are_survived_and_the_weights_equal_an_uninterrupted_run(hosts, byte_data, tmp_path):
    """Two kills -9 at random steps, one on each host; torchrun (--max-restarts) restarts every worker,
    they resume from the newest complete checkpoint, and the finished run equals the uninterrupted one."""
    steps = 16
    config = write_config(tmp_path, byte_data["mix"], steps=steps, save_every=3)
    reference = tmp_path / "reference"
    run_job(hosts, tmp_path / "ref_job", train_program(config, 2, reference))

    run = tmp_path / "run"
    job = Job(hosts, tmp_path / "job", max_restarts=3).start(
        train_program(config, 2, run, "--resume", "auto")
    )
    rng = random.Random()
    kills = []
    try:
        for host, low, high in ((hosts[1], 4, 7), (hosts[0], 10, 13)):
            at = rng.randint(low, high)
            deadline = time.monotonic() + 240
            while last_step(run) < at and time.monotonic() < deadline and job.procs[0].poll() is None:
                time.sleep(0.05)
            victims = job.workers(host)
            assert victims, job.output()
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            kills.append((host.index, last_step(run)))
        codes = job.wait(timeout=300)
    finally:
        job.kill()
    assert codes == [0, 0], f"kills {kills}\n{job.output()}"
    log = job.output()
    assert "lost rank" in log and "internal error" not in log, log
    resumed = [r for r in train_records(run, kind="event") if r["event"] == "resume"]
    assert len(resumed) == 2, f"kills {kills}: {resumed}"
    # The survivors were stopped by their agents with SIGTERM while a peer was gone: no rank tried a
    # dying-gasp save with the broken group (every checkpoint is a scheduled one).
    saved = {int(p.name[5:]) for p in (run / "checkpoints").glob("step_*") if p.is_dir()}
    assert saved <= {3, 6, 9, 12, 15, 16} and not [
        r for r in train_records(run, "event") if r["event"] == "stop"
    ]
    # Every step's loss, first run and redone steps alike, equals the uninterrupted run's.
    expected = losses(reference)
    assert all(r["loss"] == expected[r["step"]] for r in train_records(run)), kills
    assert last_step(run) == steps
    a = final_weights(reference, tmp_path / "a.safetensors")
    b = final_weights(run, tmp_path / "b.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a), kills


def test_a_vanished_host_ends_the_survivor_within_the_timeout(hosts, byte_data, tmp_path):
    timeout_s = 8
    config = write_config(
        tmp_path, byte_data["mix"], steps=700, save_every=0, distributed={"timeout_s": timeout_s}
    )
    run = tmp_path / "run"
    job = Job(hosts, tmp_path / "job").start(train_program(config, 2, run))
    try:
        deadline = time.monotonic() + 240
        while last_step(run) < 3 and time.monotonic() < deadline and job.procs[0].poll() is None:
            time.sleep(0.05)
        assert last_step(run) >= 3, job.output()
        hosts[1].vanish()
        gone = time.monotonic()
        code = job.procs[0].wait(timeout=timeout_s + 60)
        elapsed = time.monotonic() - gone
    finally:
        for host in hosts:
            host.kill_all(signal.SIGKILL)
        job.kill()
    log = job.log(0).read_text()
    assert code != 0
    # The worker's one line: who is gone, when, and what to do; no traceback, no "internal error".
    lines = [line for line in log.splitlines() if "llm-train: error:" in line]
    assert lines and "lost rank 1" in lines[0] and "10." in lines[0], log[-3000:]
    assert f"distributed.timeout_s={timeout_s}" in lines[0] and "--resume auto" in lines[0]
    assert "internal error" not in log and 'llmtools/train/loop.py", line' not in log  # no traceback of ours
    # The collective timeout, a few seconds of roll call at the store, and the agent's own shutdown.
    assert elapsed < timeout_s + 30, f"{elapsed:.1f} s\n{log[-3000:]}"
