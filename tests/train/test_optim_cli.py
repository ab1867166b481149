"""``llm-train`` (the real command in a subprocess): every bad precision, optimizer, eval or monitoring
setting fails before compute with exit 2 and one line naming it, and writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.train.test_cli import llm_train, write_config

ROOT = Path(__file__).resolve().parents[2]
DEEPSPEED = ROOT / "configs" / "deepspeed"


def fp16_capable() -> bool:
    import os

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.accelerator import get_accelerator

    return bool(get_accelerator().is_fp16_supported())


# (--set overrides, DeepSpeed config (a file in configs/deepspeed or a dict), expected words)
BAD = [
    (["optimizer.name=muon"], "zero3.json", "optimizer.name=muon: not with ZeRO stage 3"),
    (["optimizer.name=muon", "lora.r=4"], "zero2.json", "optimizer.name=muon: not with lora"),
    (["optimizer.name=muon"], "zero2-offload.json", "optimizer.name=muon runs on the device"),
    (["optimizer.name=lion", "optimizer.betas=[-0.1, 0.99]"], "zero2.json", "optimizer.betas: must be two numbers"),
    (["optimizer.name=muon", "optimizer.momentum=1.5"], "zero2.json", "optimizer.momentum: must be in [0, 1)"),
    (["optimizer.name=muon", "optimizer.ns_steps=0"], "zero2.json", "optimizer.ns_steps: must be in [1, 99]"),
    (["optimizer.muon_adjust_lr=spectral"], "zero2.json", "optimizer.muon_adjust_lr: 'spectral' is not one of"),
    (["optimizer.name=sgd"], "zero2.json", "optimizer.name: 'sgd' is not one of adamw, adafactor, lion, muon"),
    (["optimizer.name=lion"], {"optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 2}},
     "optimizer.name='lion' in"),
    (["training.precision=fp16"], {"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}},
     "[bf16.enabled]=true contradicts training.precision='fp16'"),
    (["training.precision=bf16"], {"fp16": {"enabled": True}, "zero_optimization": {"stage": 2}},
     "[fp16.enabled]=true contradicts training.precision='bf16'"),
    (["training.precision=fp16"], "zero0.json", "training.precision=fp16: needs ZeRO stage 1, 2 or 3"),
    (["training.precision=fp16", "fp16.loss_scale_window=2000"],
     {"fp16": {"loss_scale_window": 1000}, "zero_optimization": {"stage": 2}},
     "[fp16.loss_scale_window]=1000 contradicts fp16.loss_scale_window=2000"),
    (["fp16.min_loss_scale=0"], "zero2.json", "fp16.min_loss_scale: must be >= 1"),
    (["fp16.hysteresis=0"], "zero2.json", "fp16.hysteresis: must be >= 1"),
    (["fp16.loss_scale=-1"], "zero2.json", "fp16.loss_scale: must be 0 (dynamic) or a positive number"),
    (["fp16.initial_scale_power=4", "fp16.min_loss_scale=32"], "zero2.json", "above the initial scale 2**4"),
    (["health.update_spike_factor=0.5"], "zero2.json", "health.update_spike_factor: must be 0 (off) or > 1"),
    (["health.update_spike_action=skip"], "zero2.json", "health.update_spike_action: 'skip' is not one of"),
    (["logging.norms=maybe"], "zero2.json", "logging.norms: expected true/false"),
]  # fmt: skip


@pytest.mark.parametrize("overrides, deepspeed, message", BAD, ids=[row[2][:40] for row in BAD])
def test_bad_settings_fail_before_compute(byte_data, tmp_path, cli_env, overrides, deepspeed, message):
    config = write_config(tmp_path, byte_data["mix"])
    if isinstance(deepspeed, dict):
        ds = tmp_path / "ds.json"
        ds.write_text(json.dumps(deepspeed))
    else:
        ds = DEEPSPEED / deepspeed
    args = [config, "--deepspeed", ds, "-o", tmp_path / "run"]
    for item in overrides:
        args += ["--set", item]
    out = llm_train(args, cli_env)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llm-train: error: "), out.stderr
    assert message in lines[0]
    assert not (tmp_path / "run").exists()  # nothing written: no compute started


def test_fp16_on_a_cpu_without_fp16_is_refused_in_one_line(byte_data, tmp_path, cli_env):
    if fp16_capable():
        pytest.skip("this CPU has fp16 arithmetic (oneDNN): DeepSpeed trains fp16 on it")
    config = write_config(tmp_path, byte_data["mix"])
    out = llm_train(
        [
            config,
            "--deepspeed",
            DEEPSPEED / "zero2.json",
            "-o",
            tmp_path / "run",
            "--set",
            "training.precision=fp16",
        ],
        cli_env,
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "training.precision=fp16: DeepSpeed's cpu accelerator has no fp16" in lines[0]
    assert not (tmp_path / "run").exists()
