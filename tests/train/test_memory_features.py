"""Memory features in the real loop: activation checkpointing (same losses) and Adafactor (loss falls, small state)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from llmtools.errors import InputError
from tests.train.conftest import tiny_config

ROOT = Path(__file__).resolve().parents[2]


def _train(mix: str, run_dir: Path, stage: int, **overrides):
    from llmtools.train.deepspeed_config import load_ds_config
    from llmtools.train.loop import RunOptions, train

    cfg = tiny_config(mix, **overrides)
    ds = load_ds_config(ROOT / f"configs/deepspeed/zero{stage}.json")
    return train(cfg, ds, RunOptions(run_dir=run_dir, quiet=True))


@pytest.mark.numerics
def test_activation_checkpointing_gives_the_same_losses(byte_data, tmp_path):
    plain = _train(byte_data["mix"], tmp_path / "plain", 0, training__train_steps=6)
    ckpt = _train(byte_data["mix"], tmp_path / "ckpt", 0, training__train_steps=6,
                  training__activation_checkpointing=True)  # fmt: skip
    assert len(plain.losses) == len(ckpt.losses) == 6
    for a, b in zip(plain.losses, ckpt.losses, strict=True):
        # fp32: recomputed activations are the same kernels; only gradient accumulation order moves, last bits of a loss ~5: 1e-6
        assert abs(a - b) <= 1e-6, (plain.losses, ckpt.losses)


@pytest.mark.parametrize("stage", [0, "2-offload"])
def test_adafactor_trains(byte_data, tmp_path, stage):
    result = _train(byte_data["mix"], tmp_path / "run", stage, optimizer__name="adafactor", optimizer__lr=0.1,
                    training__train_steps=40)  # fmt: skip
    first, last5 = result.losses[0], sum(result.losses[-5:]) / 5
    assert math.isfinite(last5) and first > 5.0 and last5 < first - 1.5, (first, last5)


def test_adafactor_state_is_factored():
    import torch

    from llmtools.train.config_sections import OptimizerSection
    from llmtools.train.optim import build_optimizer

    weight = torch.nn.Parameter(torch.randn(64, 32))
    bias = torch.nn.Parameter(torch.randn(32))
    opt = build_optimizer(OptimizerSection(name="adafactor", lr=1e-2), [{"params": [weight, bias]}])
    (weight.sum() + bias.sum()).backward()
    opt.step()
    state_numel = sum(
        t.numel() for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.ndim
    )
    assert state_numel == 64 + 32 + 32  # row + column factors for the matrix, a full vector for the bias
    adamw = build_optimizer(OptimizerSection(name="adamw"), [{"params": [weight, bias]}])
    assert isinstance(adamw, torch.optim.AdamW)


def test_config_surface(byte_data):
    from llmtools.train.deepspeed_config import resolve_ds_config

    cfg = tiny_config(byte_data["mix"], optimizer__name="adafactor")
    assert cfg.optimizer.name == "adafactor"
    with pytest.raises(InputError, match="optimizer.name"):
        tiny_config(byte_data["mix"], optimizer__name="sgd")
    # toggling activation checkpointing does not change what the weights will be
    on = tiny_config(byte_data["mix"], training__activation_checkpointing=True)
    assert (
        on.training.activation_checkpointing
        and on.fingerprint() == tiny_config(byte_data["mix"]).fingerprint()
    )
    ds = {"train_batch_size": "auto", "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}
    with pytest.raises(InputError, match="remove the optimizer section"):
        resolve_ds_config(ds, cfg, world_size=1, total_steps=10)
