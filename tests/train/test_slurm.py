"""``llm-train`` under ``srun``: one task per device, no torchrun, only SLURM_* and MASTER_* in the environment.

No Slurm here, so the test does what ``srun --ntasks 2`` does: it starts the two tasks itself, each with its
SLURM_PROCID / SLURM_LOCALID / SLURM_NTASKS, and with MASTER_ADDR / MASTER_PORT exported as the README's batch
script does, but none of RANK / WORLD_SIZE / LOCAL_RANK (srun sets none of those).
"""

from __future__ import annotations

import subprocess
import sys

import yaml

from tests.train.test_cli import DS, free_port, llm_train, losses, write_config

# What a launcher (torchrun, deepspeed) would have set; a leftover from the parent (an in-process train() in
# another test sets RANK/WORLD_SIZE/LOCAL_RANK in os.environ) would hide the SLURM_* path entirely.
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK")


def clean_env(cli_env: dict) -> dict:
    return {
        key: value
        for key, value in cli_env.items()
        if key not in LAUNCHER_VARS and not key.startswith(("SLURM_", "TORCHELASTIC_", "MASTER_"))
    }


def srun_task_env(base: dict, procid: int, ntasks: int, port: int) -> dict:
    return {
        **base,
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(procid),  # one node: local id == global id
        "SLURM_NTASKS": str(ntasks),
        "SLURM_NNODES": "1",
        "SLURM_NODEID": "0",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_NODELIST": "localhost",
        "SLURM_JOB_ID": "4242",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def test_srun_style_two_tasks_equal_one_with_twice_the_accumulation(byte_data, tmp_path, cli_env):
    """2 srun-style tasks (micro 4, accumulation 1) == 1 process (micro 4, accumulation 2), loss for loss."""
    config = write_config(
        tmp_path,
        byte_data["mix"],
        checkpoint={"save_every": 0, "save_final": False},
        training={"train_steps": 6},
    )
    base = clean_env(cli_env)
    one = llm_train([config, "--deepspeed", DS, "-o", tmp_path / "one"], env=base)
    assert one.returncode == 0, one.stderr[-3000:]

    port = free_port()
    command = [sys.executable, "-m", "llmtools.cli.train", config, "--deepspeed", DS, "-o", tmp_path / "two"]
    tasks = [
        subprocess.Popen(
            list(map(str, command)),
            env=srun_task_env(base, procid, 2, port),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for procid in range(2)
    ]
    outputs = []
    try:
        for task in tasks:
            outputs.append(task.communicate(timeout=300))
    finally:  # one task failing leaves the other waiting at the rendezvous: never leave it behind
        for task in tasks:
            if task.poll() is None:
                task.kill()
                task.wait()
    for task, (_, stderr) in zip(tasks, outputs, strict=True):
        assert task.returncode == 0, stderr[-3000:]

    resolved = yaml.safe_load((tmp_path / "two" / "config.yaml").read_text())["resolved"]
    assert resolved["world_size"] == 2 and resolved["grad_accumulation"] == 1
    a, b = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert len(a) == len(b) == 6
    # fp32 AdamW trainings, gradients reduced in another order: last-bit (2^-24) update differences, summed over a few steps on a loss ~5: ~1e-6; 1e-5 leaves 10x
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5
    # Only SLURM_PROCID 0 prints and writes.
    assert outputs[0][0].count("metrics.jsonl") == 1 and "metrics.jsonl" not in outputs[1][0]
