"""A run is protected by default: besides ``checkpoint.save_every`` steps it saves once
``checkpoint.save_every_minutes`` (30 by default) of training have passed since its start or its last save,
rank 0's clock deciding for every rank; short runs save as before."""

from __future__ import annotations

import subprocess
import sys

from llmtools.train.config import load_train_config
from tests.ports import free_port
from tests.train.test_cli import DS, ROOT, llm_train, write_config


def saved_steps(run_dir) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*") if p.is_dir())


def test_the_default_saves_every_30_minutes_and_says_so(cli_env):
    assert load_train_config(ROOT / "configs/train/tiny.yaml").checkpoint.save_every_minutes == 30
    out = subprocess.run(
        [sys.executable, "-m", "llmtools.cli.train", "--help"], env=cli_env, capture_output=True, text=True
    )
    assert out.returncode == 0
    assert "checkpoint.save_every_minutes" in " ".join(out.stdout.split())


def test_a_run_saves_by_the_clock_between_its_step_saves(byte_data, tmp_path, cli_env):
    # 0.0005 minutes (30 ms) is shorter than any step here: every step is due by the clock alone
    config = write_config(
        tmp_path, byte_data["mix"], training={"train_steps": 4}, checkpoint={"save_every": 0, "save_every_minutes": 0.0005}
    )
    out = llm_train([config, "--deepspeed", DS, "-o", tmp_path / "run"], cli_env)
    assert out.returncode == 0, out.stderr
    assert saved_steps(tmp_path / "run") == [1, 2, 3, 4]
    off = llm_train(
        [config, "--deepspeed", DS, "-o", tmp_path / "off", "--set", "checkpoint.save_every_minutes=0"], cli_env
    )
    assert off.returncode == 0, off.stderr
    assert saved_steps(tmp_path / "off") == [4]  # off: the end save only


def test_every_rank_saves_at_the_step_rank_0_chose(byte_data, tmp_path, cli_env):
    """Under torchrun the ranks' clocks differ; the save is one collective, so they must agree on its
    step: the run ends (no rank waits in a save the other skipped) with every clock-chosen checkpoint."""
    config = write_config(
        tmp_path, byte_data["mix"], training={"train_steps": 3}, checkpoint={"save_every": 0, "save_every_minutes": 0.0005}
    )
    torchrun = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
        "-m", "llmtools.cli.train", config, "--deepspeed", DS, "-o", tmp_path / "two",
    ]  # fmt: skip
    two = subprocess.run(list(map(str, torchrun)), env=cli_env, capture_output=True, text=True, timeout=400)
    assert two.returncode == 0, two.stderr[-3000:]
    assert saved_steps(tmp_path / "two") == [1, 2, 3]
