"""``parallel.tensor: 2`` (DeepSpeed AutoTP over gloo on CPU) through the real ``llm-train`` under torchrun:
the same losses as one rank holding whole weights, exact resume, checkpoints with a shard per rank that
verify and convert to one Hugging Face folder, a resume under another degree refused with the reason, and
the refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.train.parallel_runs import (
    assert_refused,
    ds_config,
    one_rank_and_grid,
    seeded_with,
    torchrun_train,
)
from tests.train.test_cli import llm_train, losses, write_config

STEPS = 20


def _config(folder: Path, mix: str, tensor: int, **sections):
    folder.mkdir(parents=True, exist_ok=True)
    return write_config(
        folder,
        mix,
        parallel={"tensor": tensor, **sections.pop("parallel", {})},
        training={"train_steps": STEPS, "micro_batch_size": 4, "global_batch_size": 8},
        schedule={"warmup_steps": 3, "total_steps": STEPS},
        checkpoint={"save_every": 10},
        **sections,
    )


def _ckpt(env, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmtools.cli.ckpt", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


# The LLaMA layout, and Qwen3's (a norm over each head's queries and keys, kept whole on every rank).
@pytest.mark.numerics
@pytest.mark.parametrize(
    "nproc, stage, qk_norm",
    [(2, 1, False), (2, 2, True), (4, 2, False)],
    ids=["tp2-zero1", "tp2-zero2-qwen3", "dp2-tp2-zero2"],
)
def test_ranks_holding_half_of_each_projection_equal_one_rank(
    byte_data, tmp_path, cli_env, nproc, stage, qk_norm
):
    def config(folder, degree):
        return _config(folder, byte_data["mix"], degree, model={"qk_norm": qk_norm})

    two, a, b = one_rank_and_grid(tmp_path, config, stage, nproc, cli_env)
    assert len(a) == len(b) == STEPS
    # fp32; the same sums in another order (each projection's dot products split in two, then all-reduced)
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5
    step20 = two / "checkpoints" / "step_00000020"
    meta = json.loads((step20 / "meta.json").read_text())
    assert meta["tensor_parallel"]["degree"] == 2 and meta["dp_world_size"] == nproc // 2
    assert (
        meta["num_parameters"]
        == json.loads((tmp_path / "one" / "checkpoints" / "step_00000020" / "meta.json").read_text())[
            "num_parameters"
        ]
    )  # the whole model's count, not one shard's
    assert {"mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"} <= set(meta["files"])
    if (nproc, stage) != (2, 1):
        return
    # exact resume under the same degree, from step 10
    again = seeded_with(two, 10, tmp_path / "again")
    torchrun_train(_config(tmp_path / "c2", byte_data["mix"], 2), stage, again, cli_env, "--resume", "auto")
    assert losses(again) == b[10:]
    # the checkpoint verifies and converts to one HF folder: every sharded weight is its shards end to end
    assert _ckpt(cli_env, "verify", step20).returncode == 0
    hf = tmp_path / "hf"
    convert = _ckpt(cli_env, "convert", step20, "--to", "hf", "-o", hf)
    assert convert.returncode == 0, convert.stderr
    import torch
    from safetensors.torch import load_file

    whole = load_file(hf / "model.safetensors")
    shards = [
        torch.load(step20 / f"mp_rank_{m:02d}_model_states.pt", weights_only=False)["module"] for m in (0, 1)
    ]
    for name, dim in meta["tensor_parallel"]["split_dims"].items():
        assert torch.equal(whole[name], torch.cat([shard[name] for shard in shards], dim=dim)), name
    assert torch.equal(whole["model.embed_tokens.weight"], shards[0]["model.embed_tokens.weight"])
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf)
    assert model.model.layers[0].self_attn.q_proj.weight.shape == (96, 96)
    # another degree: refused before anything loads, with the way on
    other = seeded_with(two, 10, tmp_path / "other")
    refused = torchrun_train(_config(tmp_path / "c3", byte_data["mix"], 1), stage, other, cli_env, "--resume", "auto",
                        check=False)  # fmt: skip
    assert refused.returncode != 0
    assert "[parallel.tensor]: checkpoint has 2, the config has 1" in refused.stderr
    assert "llm-ckpt convert --to hf" in refused.stderr


@pytest.mark.parametrize(
    "world, sections, message",
    [
        ("1", {}, "parallel.tensor=2: does not divide the world size 1"),
        ("2", {"model": {"num_key_value_heads": 1}}, "key/value heads must both divide by it"),
        ("2", {"parallel": {"tensor": 2, "sequence": 2}}, "not supported together with parallel.sequence"),
        ("2", {"optimizer": {"name": "muon"}}, "not supported with optimizer muon"),
    ],
)
def test_what_tensor_parallelism_cannot_run_is_refused_in_one_line(
    byte_data, tmp_path, cli_env, world, sections, message
):
    config = _config(tmp_path, byte_data["mix"], 2, **sections)
    assert_refused(config, world, message, tmp_path / "run", cli_env)


def test_zero3_is_refused_in_one_line(byte_data, tmp_path, cli_env):
    config = _config(tmp_path, byte_data["mix"], 2)
    env = {**cli_env, "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}
    out = llm_train([config, "--deepspeed", ds_config(3), "-o", tmp_path / "run", "--dry-run"], env)
    assert out.returncode == 2, out.stderr
    assert "[zero_optimization][stage]: 3 with parallel.tensor=2" in out.stderr.strip().splitlines()[-1]
