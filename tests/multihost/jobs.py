"""Launching ``llm-train`` on namespace hosts the way users do on real ones: one torchrun agent per host.

    job = Job(cluster.hosts, workdir, nproc=1, max_restarts=3)
    job.start(["-m", "llmtools.cli.train", "cfg.yaml", "--deepspeed", "ds.json", "-o", "run", "--resume", "auto"])
    codes = job.wait(timeout=300)            # every agent's exit code (None: still running at the timeout)

The agents use the c10d rendezvous hosted by the first host (``--rdzv-conf is_host=true``); the hosts share
one hostname, so each passes ``--local-addr`` with its own address; gloo is told to use the host's link
(``GLOO_SOCKET_IFNAME``). Each agent's output goes to ``workdir/host<i>.log``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.multihost.netns import Host

REPO = Path(__file__).resolve().parents[2]
# Set by an outer launcher (or an in-process train() of another test): they would hide torchrun's values.
_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR",
                  "MASTER_PORT")  # fmt: skip


def host_env(extra: dict | None = None) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _LAUNCHER_VARS and not k.startswith(("SLURM_", "TORCHELASTIC_", "PET_"))
    }
    env.update(
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        GLOO_SOCKET_IFNAME="eth0",
        OMP_NUM_THREADS="1",
        DS_ACCELERATOR="cpu",
        PYTHONUNBUFFERED="1",
    )
    env.pop("LLMTOOLS_DEBUG", None)
    env.update(extra or {})
    return env


class Job:
    """One torchrun agent per host, all in one c10d rendezvous."""

    def __init__(
        self,
        hosts: list[Host],
        workdir: Path,
        nproc: int = 1,
        max_restarts: int = 0,
        env: dict | None = None,
        rdzv_conf: str = "",
    ) -> None:
        self.hosts = hosts
        self.workdir = Path(workdir)
        self.nproc = nproc
        self.max_restarts = max_restarts
        self.env = host_env(env)
        self.rdzv_conf = rdzv_conf
        # A fresh namespace has nothing listening: any port is free there (never 29500 all the same).
        self.port = 20000 + os.getpid() % 9000
        self.procs: list[subprocess.Popen] = []
        self.started = 0.0

    def agent_command(self, host: Host, program: list[str]) -> list[str]:
        conf = ",".join(c for c in ("is_host=true" if host.index == 0 else "", self.rdzv_conf) if c)
        return [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(len(self.hosts)), "--nproc-per-node", str(self.nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{self.hosts[0].address}:{self.port}",
            "--rdzv-id", "llmtools-test", "--local-addr", host.address,
            "--max-restarts", str(self.max_restarts), "--monitor-interval", "0.5",
            *(["--rdzv-conf", conf] if conf else []),
            *program,
        ]  # fmt: skip

    def log(self, index: int) -> Path:
        return self.workdir / f"host{index}.log"

    def start(self, program: list[str]) -> Job:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        for host in self.hosts:
            with open(self.log(host.index), "w") as out:
                self.procs.append(
                    host.popen(
                        self.agent_command(host, program),
                        env=self.env,
                        cwd=REPO,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
        return self

    def wait(self, timeout: float) -> list[int | None]:
        deadline = time.monotonic() + timeout
        codes: list[int | None] = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        return codes

    def kill(self) -> None:
        for host in self.hosts:
            host.kill_all()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def output(self) -> str:
        return "\n".join(f"--- host{h.index}\n{self.log(h.index).read_text()[-4000:]}" for h in self.hosts)

    def workers(self, host: Host) -> list[int]:
        """Pids of the llm-train workers on ``host`` (not the agent)."""
        return host.processes("llmtools.cli.train", exclude=("torch.distributed.run",))


def train_records(run_dir: Path, kind: str = "train") -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        if record.get("kind") == kind:
            records.append(record)
    return records


def last_step(run_dir: Path) -> int:
    return max((r["step"] for r in train_records(run_dir)), default=0)
