"""llmtools.train.moe without DeepSpeed: RouterLoss hands the task logits and keeps the auxiliary loss,
RouterMeter turns a window of router statistics into the train record's fields."""

from __future__ import annotations

import math

import pytest
import torch

from llmtools.errors import InputError
from llmtools.model.config import ModelConfig
from llmtools.model.llama import LlamaForCausalLM
from llmtools.train.moe import RouterLoss, RouterMeter, check_expert_parallel, expert_parallel_ds_config

CONFIG = ModelConfig(
    vocab_size=100,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    qk_norm=True,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    router_aux_loss_coef=0.1,
)


def test_router_loss_passes_arguments_and_keeps_each_forwards_aux_loss():
    torch.manual_seed(0)
    model = LlamaForCausalLM(CONFIG)
    meter = RouterMeter(CONFIG)
    router = RouterLoss(model, meter)
    ids = torch.randint(0, 100, (2, 10))
    segments = torch.ones_like(ids)
    segments[:, 7:] = 0
    logits = router(ids, segment_ids=segments)  # what a task sees: logits
    assert torch.equal(logits, model(ids, segment_ids=segments))
    aux = router.take_aux()
    expected = model(ids, segment_ids=segments, output_router=True).aux_loss
    # the same fp32 aux loss through the wrapper: default fp32 tolerance (~11 ulps)
    torch.testing.assert_close(aux, expected)
    assert aux.requires_grad and router.take_aux() is None  # taken once
    assert router.config is CONFIG  # anything else is the wrapped model's
    router(ids)
    router(ids)  # two forwards before one take: both count
    assert torch.allclose(router.take_aux(), 2 * model(ids, output_router=True).aux_loss)
    assert meter.forwards == 3


def test_meter_record_reduces_a_window():
    meter = RouterMeter(CONFIG)
    model = LlamaForCausalLM(CONFIG)
    outs = [model(torch.randint(0, 100, (2, 8)), output_router=True) for _ in range(3)]
    for out in outs:
        meter.add(out.router)
    record = meter.record("cpu")
    counts = sum(out.router.counts for out in outs)
    for i, layer in enumerate(record["moe_layers"]):
        load = (counts[i] / counts[i].sum()).tolist()
        # fp32 expert loads (counts / total) vs float64: 1e-6 is ~8 fp32 ulps of a share <= 1
        assert layer["layer"] == i and layer["load"] == pytest.approx(load, abs=1e-6)
        mean = 1 / 4
        cv = math.sqrt(sum((x - mean) ** 2 for x in load) / 4) / mean
        # fp32 router statistics recomputed in float64: default rel=1e-6 is ~8 fp32 ulps
        assert layer["cv"] == pytest.approx(cv) and layer["max_load"] == pytest.approx(max(load) * 4)
        # fp32 router statistics recomputed in float64: default rel=1e-6 is ~8 fp32 ulps
        assert layer["aux_loss"] == pytest.approx(float(sum(o.router.balance[i] for o in outs) / 3))
    # fp32 router statistics recomputed in float64: default rel=1e-6 is ~8 fp32 ulps
    assert record["moe_aux_loss"] == pytest.approx(float(sum(o.router.load_balancing for o in outs) / 3))
    assert record["moe_load_cv_max"] == max(layer["cv"] for layer in record["moe_layers"])
    assert record["moe_dropped"] == 0.0
    assert meter.forwards == 0 and meter.counts is None  # reset for the next window
    # a rank without a forward in the window still answers (zeros), so the all-reduce matches up
    empty = meter.record("cpu")
    assert empty["moe_aux_loss"] == 0.0 and empty["moe_layers"][0]["load"] == [0.0] * 4


@pytest.mark.parametrize(
    ("expert_parallel", "world", "fields", "message"),
    [
        (2, 3, {}, "2 does not divide the data-parallel size 3"),
        (3, 3, {}, "3 does not divide num_experts 4"),
        (0, 1, {}, "must be >= 1"),
        (1, 1, {"moe_capacity_factor": 2.0}, "dropless"),
        (
            2,
            2,
            {"num_experts": 0, "num_experts_per_tok": 2, "moe_intermediate_size": None},
            "needs a MoE model",
        ),
    ],
)
def test_expert_parallel_checks(expert_parallel, world, fields, message):
    import dataclasses

    config = dataclasses.replace(
        CONFIG, **fields, router_aux_loss_coef=0.001 if fields.get("num_experts") == 0 else 0.1
    )
    with pytest.raises(InputError, match=message):
        check_expert_parallel(config, expert_parallel, world, "t.yaml")


def test_expert_parallel_deepspeed_section():
    section = expert_parallel_ds_config(CONFIG, 2)
    assert section["enabled"] and section["autoep_size"] == 2 and section["preset_model"] == "qwen3_moe"
    assert section["route_norm"] is True
