"""DeepSpeed config: "auto" filled from the train config like the HF Trainer; contradictions name both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmtools.errors import InputError
from llmtools.train.config import from_dict
from llmtools.train.deepspeed_config import load_ds_config, resolve_ds_config

ROOT = Path(__file__).resolve().parents[2]


def make_cfg(**training):
    raw = {
        "data": {"mix": "mix.json"},
        "training": {"micro_batch_size": 4, "global_batch_size": 16, "train_steps": 100, **training},
        "optimizer": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
        "schedule": {"kind": "cosine", "warmup_steps": 10, "min_lr_ratio": 0.1},
    }
    return from_dict(raw, "train.yaml")


def resolve(ds, world_size=1, **training):
    return resolve_ds_config(
        ds, make_cfg(**training), world_size=world_size, total_steps=100, hidden_size=64, ds_source="ds.json"
    )


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_shipped_configs_fill_completely(stage):
    ds = load_ds_config(ROOT / f"configs/deepspeed/zero{stage}.json")
    out = resolve(ds, world_size=2, precision="bf16")
    assert out["train_micro_batch_size_per_gpu"] == 4
    assert out["gradient_accumulation_steps"] == 2  # 16 / (4 x 2 ranks)
    assert out["train_batch_size"] == 16
    assert out["gradient_clipping"] == 1.0
    assert out["bf16"]["enabled"] is True
    assert out["zero_optimization"]["stage"] == stage
    assert "auto" not in json.dumps(out)
    assert ds["train_batch_size"] == "auto"  # the input is not modified


def test_offload_config_fills():
    out = resolve(load_ds_config(ROOT / "configs/deepspeed/zero2-offload.json"))
    assert out["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert out["zero_optimization"]["reduce_bucket_size"] == 500_000_000  # DeepSpeed's default, not "auto"


def test_hf_style_optimizer_and_scheduler_sections_fill():
    ds = {
        "train_micro_batch_size_per_gpu": "auto",
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
        },
        "scheduler": {
            "type": "WarmupCosineLR",
            "params": {"total_num_steps": "auto", "warmup_num_steps": "auto"},
        },
        "zero_optimization": {
            "stage": 3,
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
        },
    }
    out = resolve(ds)
    assert out["optimizer"]["params"] == {
        "lr": 1e-3,
        "betas": [0.9, 0.95],
        "eps": 1e-8,
        "weight_decay": 0.1,
        "torch_adam": True,
    }
    assert out["scheduler"]["params"]["total_num_steps"] == 100
    assert out["scheduler"]["params"]["warmup_num_steps"] == 10
    assert out["scheduler"]["params"]["cos_min_ratio"] == 0.1
    assert out["zero_optimization"]["stage3_prefetch_bucket_size"] == int(0.9 * 64 * 64)
    assert out["zero_optimization"]["stage3_param_persistence_threshold"] == 640


def test_matching_real_values_are_accepted():
    out = resolve(
        {
            "train_micro_batch_size_per_gpu": 4,
            "train_batch_size": 16,
            "gradient_accumulation_steps": 4,
            "gradient_clipping": 1.0,
            "bf16": {"enabled": False},
        }
    )
    assert out["gradient_accumulation_steps"] == 4


@pytest.mark.parametrize(
    "ds, message",
    [
        (
            {"train_micro_batch_size_per_gpu": 8},
            "ds.json[train_micro_batch_size_per_gpu]=8 contradicts training.micro_batch_size=4 in train.yaml",
        ),
        ({"train_batch_size": 32}, "ds.json[train_batch_size]=32 contradicts training.global_batch_size=16"),
        ({"gradient_accumulation_steps": 3}, "ds.json[gradient_accumulation_steps]=3 contradicts"),
        ({"gradient_clipping": 0.5}, "ds.json[gradient_clipping]=0.5 contradicts training.clip_grad=1.0"),
        ({"bf16": {"enabled": True}}, "ds.json[bf16.enabled]=true contradicts training.precision='fp32'"),
        ({"fp16": {"enabled": True}}, "ds.json[fp16.enabled]=true contradicts training.precision='fp32'"),
        (
            {"optimizer": {"type": "AdamW", "params": {"lr": 0.1}}},
            "ds.json[optimizer.params.lr]=0.1 contradicts optimizer.lr=0.001",
        ),
        (
            {"optimizer": {"type": "Lion", "params": {}}},
            "ds.json[optimizer.type]='Lion' contradicts optimizer.name",
        ),
        (
            {"scheduler": {"type": "WarmupLR", "params": {}}},
            "ds.json[scheduler.type]='WarmupLR' contradicts schedule.kind='cosine'",
        ),
        (
            {"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 50}}},
            "ds.json[scheduler.params.total_num_steps]=50 contradicts schedule.total_steps=100",
        ),
        (
            {"zero_optimization": {"stage": 2, "sub_group_size": "auto"}},
            "ds.json[zero_optimization.sub_group_size]",
        ),
    ],
)
def test_contradictions_name_both(ds, message):
    with pytest.raises(InputError) as error:
        resolve(ds)
    assert message in str(error.value)


def test_global_batch_must_split_over_ranks():
    from llmtools.errors import UsageError

    with pytest.raises(UsageError, match="not a multiple of training.micro_batch_size=4 x world size 3"):
        resolve({}, world_size=3)


def test_bad_json_names_line(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{\n  "train_batch_size": "auto",\n  oops\n}\n')
    with pytest.raises(InputError, match=r"ds\.json:3:3: not valid JSON"):
        load_ds_config(path)


@pytest.mark.parametrize("cpu, expected", [(True, False), (False, True)])
def test_contiguous_gradients_auto_follows_the_device(cpu, expected):
    """ "auto": off on CPU (an extra copy of every gradient, nothing gained), on for CUDA (less fragmentation)."""
    ds = load_ds_config(ROOT / "configs/deepspeed/zero2.json")
    assert ds["zero_optimization"]["contiguous_gradients"] == "auto"
    out = resolve_ds_config(ds, make_cfg(), world_size=1, total_steps=100, hidden_size=64, cpu=cpu)
    assert out["zero_optimization"]["contiguous_gradients"] is expected
    ds["zero_optimization"]["contiguous_gradients"] = True  # a real value is kept as written
    out = resolve_ds_config(ds, make_cfg(), world_size=1, total_steps=100, hidden_size=64, cpu=True)
    assert out["zero_optimization"]["contiguous_gradients"] is True
