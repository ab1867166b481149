"""``configs/slurm/train.sbatch`` run as Slurm runs it, on two namespace hosts.

There is no Slurm here: ``tests/multihost/fake_slurm/`` puts a stand-in ``srun`` (one task per node, each
started inside that node's namespace with the variables slurmd sets, signals forwarded) and ``scontrol``
(``show hostnames``; ``requeue`` recorded) first on PATH. The batch script itself runs unchanged, as the
batch shell does: the test sends it USR1 as ``--signal=B:USR1@600`` would before the time limit, then
starts it again as the requeued job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.multihost.jobs import REPO, host_env, last_step, train_records
from tests.multihost.test_elastic import write_config

pytestmark = pytest.mark.slow
SBATCH = REPO / "configs" / "slurm" / "train.sbatch"
FAKE = Path(__file__).resolve().parent / "fake_slurm"


def batch_env(hosts, tmp_path: Path, config: Path, run: Path) -> dict:
    import sys

    return host_env(
        {
            "PATH": os.pathsep.join([str(FAKE), str(Path(sys.executable).parent), os.environ["PATH"]]),
            "FAKE_SLURM_NODES": ",".join(f"{h.namespace}={h.address}" for h in hosts),
            "FAKE_SLURM_LOG": str(tmp_path / "slurm.log"),
            "SLURM_JOB_ID": str(4000 + os.getpid() % 1000),
            "SLURM_JOB_NAME": "test",
            "SLURM_JOB_NODELIST": ",".join(h.address for h in hosts),
            "SLURM_JOB_NUM_NODES": str(len(hosts)),
            "CONFIG": str(config),
            "DS": str(REPO / "configs" / "deepspeed" / "zero2.json"),
            "RUN": str(run),
            "NPROC_PER_NODE": "1",
            "OMP_NUM_THREADS": "1",
            "SAVE_GRACE": "120",
            "VENV": str(Path(sys.executable).parent.parent),
        }
    )


def test_sbatch_requeues_before_the_time_limit_and_the_requeued_job_resumes(hosts, byte_data, tmp_path):
    steps = 400  # long enough that the "time limit" comes first
    config = write_config(tmp_path, byte_data["mix"], steps=steps, save_every=0, logging={"log_every": 1})
    run = tmp_path / "run"
    env = batch_env(hosts, tmp_path, config, run)
    with open(tmp_path / "first.log", "w") as out:
        batch = subprocess.Popen(
            ["bash", str(SBATCH)], env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 240
        while last_step(run) < 4 and time.monotonic() < deadline and batch.poll() is None:
            time.sleep(0.05)
        assert last_step(run) >= 4, (tmp_path / "first.log").read_text()[-3000:]
        batch.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@600 sends the batch shell
        code = batch.wait(timeout=200)
    finally:
        for host in hosts:
            host.kill_all()
    log = (tmp_path / "first.log").read_text()
    assert code == 0, log[-3000:]
    assert (tmp_path / "slurm.log").read_text().split() == ["requeue", env["SLURM_JOB_ID"]]
    # Both workers got SIGTERM through srun and torchrun, agreed, saved the step they were at, and exited.
    stopped = [r for r in train_records(run, kind="event") if r["event"] == "stop"]
    assert len(stopped) == 1 and "SIGTERM" in stopped[0]["message"], log[-3000:]
    stop_step = stopped[0]["step"]
    assert (run / "checkpoints" / f"step_{stop_step:08d}" / "meta.json").is_file()
    assert "lost rank" not in log and "internal error" not in log

    # The requeued job: the same script, 6 more steps, from the checkpoint the first one saved.
    more = stop_step + 6
    env["CONFIG"] = str(
        write_config(tmp_path, byte_data["mix"], steps=more, save_every=0, schedule={"total_steps": steps})
    )
    second = subprocess.run(
        ["bash", str(SBATCH)], env=env, cwd=REPO, capture_output=True, text=True, timeout=300
    )
    for host in hosts:
        host.kill_all()
    assert second.returncode == 0, second.stderr[-3000:]
    resumed = [r for r in train_records(run, kind="event") if r["event"] == "resume"]
    assert len(resumed) == 1 and resumed[0]["step"] == stop_step
    assert last_step(run) == more
