"""What the sequence- and tensor-parallel tests share: ``llm-train`` under torchrun, and a run on one rank
beside a run on a grid of ranks, compared loss for loss."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.train.test_cli import free_port, llm_train, losses

ROOT = Path(__file__).resolve().parents[2]


def ds_config(stage: int) -> str:
    return str(ROOT / "configs" / "deepspeed" / f"zero{stage}.json")


def torchrun_train(config, stage: int, run_dir: Path, env, *extra, nproc: int = 2, check: bool = True):
    """``llm-train`` on ``nproc`` local ranks; with ``check``, a failure shows the error lines of every rank."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
           str(free_port()), "-m", "llmtools.cli.train", config, "--deepspeed", ds_config(stage), "-o", run_dir,
           *extra]  # fmt: skip
    out = subprocess.run(list(map(str, cmd)), env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert out.returncode == 0, "\n".join(
            line
            for line in out.stderr.splitlines()
            if "rror" in line or "llm-train" in line or "File" in line
        )[-4000:]
    return out


def one_rank_and_grid(
    tmp_path: Path, config, stage: int, nproc: int, env
) -> tuple[Path, list[float], list[float]]:
    """``config(folder, degree)`` trained on one rank (degree 1) and on ``nproc`` ranks (degree 2): the
    grid's run folder and both runs' losses, after checking the grid's data-parallel split (a global
    batch of 8 samples in micro-batches of 4)."""
    one = tmp_path / "one"
    out = llm_train([config(tmp_path / "c1", 1), "--deepspeed", ds_config(stage), "-o", one], env)
    assert out.returncode == 0, out.stderr[-3000:]
    grid = tmp_path / "grid"
    torchrun_train(config(tmp_path / "c2", 2), stage, grid, env, nproc=nproc)
    resolved = yaml.safe_load((grid / "config.yaml").read_text())["resolved"]
    assert resolved["world_size"] == nproc and resolved["grad_accumulation"] == 4 // nproc
    return grid, losses(one), losses(grid)


def assert_refused(config, world: str, message: str, run_dir: Path, env) -> None:
    """``llm-train`` as rank 0 of ``world`` refuses ``config`` before any rendezvous: exit 2, one line
    holding ``message``, no run folder."""
    env = {**env, "WORLD_SIZE": world, "RANK": "0", "LOCAL_RANK": "0"}
    out = llm_train([config, "--deepspeed", ds_config(2), "-o", run_dir], env)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr
    assert not run_dir.exists()


def seeded_with(run_dir: Path, step: int, new_run: Path) -> Path:
    """A new run folder holding only ``run_dir``'s checkpoint of ``step`` (what ``--resume auto`` picks)."""
    name = f"step_{step:08d}"
    (new_run / "checkpoints").mkdir(parents=True)
    shutil.copytree(run_dir / "checkpoints" / name, new_run / "checkpoints" / name)
    return new_run
