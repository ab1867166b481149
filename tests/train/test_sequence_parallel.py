"""``parallel.sequence: 2`` (DeepSpeed-Ulysses over gloo on CPU) through the real ``llm-train`` under
torchrun: the same losses as one rank holding whole sequences, exact resume, checkpoints that verify and
convert, a resume under another degree, and the refusals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.train.parallel_runs import (
    assert_refused,
    ds_config,
    one_rank_and_grid,
    seeded_with,
    torchrun_train,
)
from tests.train.test_cli import llm_train, losses, write_config

STEPS = 20
# document masking on: the head exchange must carry the rows' document boundaries too
DATA = {"reset_attention_mask": True, "reset_position_ids": True, "eod_mask_loss": True}


def _config(folder: Path, mix: str, sequence: int, recompute: bool = False, **sections):
    folder.mkdir(parents=True, exist_ok=True)
    training = {"train_steps": STEPS, "micro_batch_size": 4, "global_batch_size": 8}
    return write_config(
        folder,
        mix,
        data=DATA,
        parallel={"sequence": sequence},
        training={**training, "activation_checkpointing": recompute},
        schedule={"warmup_steps": 3, "total_steps": STEPS},
        checkpoint={"save_every": 10},
        **sections,
    )


@pytest.mark.numerics
@pytest.mark.parametrize("stage", [2, 3])
def test_two_ranks_holding_half_of_each_sequence_equal_one_rank(byte_data, tmp_path, cli_env, stage):
    recompute = stage == 3  # activation checkpointing recomputes the all-to-all in the backward pass
    one = tmp_path / "one"
    config = _config(tmp_path / "c1", byte_data["mix"], 1, recompute)
    out = llm_train([config, "--deepspeed", ds_config(stage), "-o", one], cli_env)
    assert out.returncode == 0, out.stderr[-3000:]
    two = tmp_path / "two"
    torchrun_train(_config(tmp_path / "c2", byte_data["mix"], 2, recompute), stage, two, cli_env)
    resolved = yaml.safe_load((two / "config.yaml").read_text())["resolved"]
    assert resolved["world_size"] == 2 and resolved["grad_accumulation"] == 2  # one replica of two ranks
    a, b = losses(one), losses(two)
    assert len(a) == len(b) == STEPS
    # fp32; the same sums in another order (attention over two head groups, the loss in two halves)
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5
    if stage != 2:
        return
    # exact resume under the same degree, from step 10
    again = seeded_with(two, 10, tmp_path / "again")
    torchrun_train(_config(tmp_path / "c2", byte_data["mix"], 2), stage, again, cli_env, "--resume", "auto")
    assert losses(again) == b[10:]
    # the checkpoint verifies and converts to one HF folder
    ckpt = [sys.executable, "-m", "llmtools.cli.ckpt"]
    verify = subprocess.run([*ckpt, "verify", str(two / "checkpoints" / "step_00000020")], env=cli_env,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert verify.returncode == 0, verify.stderr
    hf = tmp_path / "hf"
    convert = subprocess.run([*ckpt, "convert", str(two / "checkpoints" / "step_00000020"), "--to", "hf", "-o", str(hf)],
                             env=cli_env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert convert.returncode == 0, convert.stderr
    assert (hf / "config.json").exists()
    # another degree on the same two ranks (two replicas of whole sequences): ZeRO's partitions are the
    # same, so it continues; the same losses up to summation order
    other = seeded_with(two, 10, tmp_path / "other")
    torchrun_train(_config(tmp_path / "c3", byte_data["mix"], 1), stage, other, cli_env, "--resume", "auto")
    # fp32 losses of the same model, only the reduction order across the head exchange differs
    assert max(abs(x - y) for x, y in zip(losses(other), b[10:], strict=True)) < 1e-5


@pytest.mark.numerics
@pytest.mark.parametrize(
    "nproc, stage", [(4, 2), (2, 1), (2, 0)], ids=["dp2-zero2", "dp1-zero1", "dp1-zero0"]
)
def test_replicas_of_sequence_parallel_groups_and_every_stage_equal_one_rank(
    byte_data, tmp_path, cli_env, nproc, stage
):
    """Two replicas of a group of two (4 ranks: data 2 x sequence 2), and the ZeRO stages the test above
    does not run: the same losses as one rank holding whole sequences."""
    _, a, b = one_rank_and_grid(
        tmp_path, lambda folder, degree: _config(folder, byte_data["mix"], degree), stage, nproc, cli_env
    )
    assert len(a) == len(b) == STEPS
    # fp32; the same sums in another order (head groups, loss halves, the replicas' gradient average)
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5


@pytest.mark.parametrize(
    "world, sections, message",
    [
        ("1", {}, "parallel.sequence=2: does not divide the world size 1"),
        ("2", {"model": {"num_key_value_heads": 1}}, "key/value heads must both divide by it"),
        ("2", {"model": {"num_experts": 4, "num_experts_per_tok": 2}}, "not supported with a MoE model"),
    ],
)
def test_what_sequence_parallelism_cannot_run_is_refused_in_one_line(
    byte_data, tmp_path, cli_env, world, sections, message
):
    config = _config(tmp_path, byte_data["mix"], 2, **sections)
    assert_refused(config, world, message, tmp_path / "run", cli_env)
