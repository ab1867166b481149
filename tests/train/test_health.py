"""Health: a NaN/inf loss or a grad-norm spike is caught; the update is skipped, or the run stops with a
checkpoint and a clear message. A bad micro-batch is injected by wrapping the loss function."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from llmtools.errors import RuntimeFailure
from llmtools.train import loop
from llmtools.train.health import HealthGate
from llmtools.train.tasks import pretrain as losses
from tests.train.conftest import tiny_config

ROOT = Path(__file__).resolve().parents[2]


def inject(monkeypatch, at_call: int, factor: float):
    """Multiply the loss of the ``at_call``-th micro-batch (1-based) by ``factor`` (nan -> NaN loss)."""
    original = losses.cross_entropy
    calls = {"n": 0}

    def patched(logits, labels):
        calls["n"] += 1
        loss = original(logits, labels)
        return loss * factor if calls["n"] == at_call else loss

    monkeypatch.setattr(losses, "cross_entropy", patched)


def run(byte_data, run_dir, stage=2, **overrides):
    from llmtools.train.deepspeed_config import load_ds_config

    cfg = tiny_config(byte_data["mix"], **overrides)
    ds = load_ds_config(ROOT / f"configs/deepspeed/zero{stage}.json")
    return loop.train(cfg, ds, loop.RunOptions(run_dir=run_dir, quiet=True))


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("stage", [0, 2])
def test_nan_loss_skips_the_update(byte_data, tmp_path, monkeypatch, stage):
    inject(monkeypatch, at_call=5, factor=float("nan"))  # step 3, first micro-batch (2 per step)
    result = run(byte_data, tmp_path, stage=stage, training__train_steps=6, health__nan_action="skip")
    assert result.steps == 6
    assert math.isnan(result.losses[2])
    # Had the NaN gradient reached the weights, every later loss would be NaN too.
    assert all(math.isfinite(x) for x in result.losses[3:])
    records = metrics(tmp_path)
    events = [r for r in records if r["kind"] == "event" and r["event"] == "nan"]
    assert [e["step"] for e in events] == [3] and "update skipped" in events[0]["message"]
    step3 = next(r for r in records if r["kind"] == "train" and r["step"] == 3)
    assert step3["skipped"] is True and step3["loss"] is None  # JSON has no NaN: written as null


def test_nan_loss_stops_with_a_checkpoint(byte_data, tmp_path, monkeypatch):
    inject(monkeypatch, at_call=6, factor=float("inf"))
    with pytest.raises(RuntimeFailure) as error:
        run(byte_data, tmp_path, training__train_steps=6, health__nan_action="stop")
    message = str(error.value)
    assert "stopped at step 3: health.nan_action=stop" in message
    assert "step_00000003" in message and "--resume" in message
    assert (tmp_path / "checkpoints" / "step_00000003" / "meta.json").exists()
    records = metrics(tmp_path)
    assert records[-1]["event"] == "stop"
    assert max(r["step"] for r in records if r["kind"] == "train") == 3


def test_grad_norm_spike_is_skipped(byte_data, tmp_path, monkeypatch):
    inject(monkeypatch, at_call=15, factor=1e4)  # step 8: gradients (and their norm) x 10^4
    result = run(
        byte_data,
        tmp_path,
        training__train_steps=10,
        health__spike_factor=5.0,
        health__spike_window=4,
        health__spike_action="skip",
    )
    records = metrics(tmp_path)
    spikes = [r for r in records if r["kind"] == "event" and r["event"] == "spike"]
    assert [s["step"] for s in spikes] == [8]
    assert "grad-norm spike" in spikes[0]["message"] and "update skipped" in spikes[0]["message"]
    # The x10^4 gradient was not applied: the next losses stay on the normal curve.
    assert result.losses[8] < result.losses[0] and result.losses[9] < result.losses[0]


def test_health_gate_unit():
    from llmtools.train.config_sections import HealthSection

    norms = iter([1.0, 1.1, 0.9, 1.0, 50.0, 1.0, float("nan"), 1.0])
    gate = HealthGate(
        HealthSection(spike_factor=10, spike_window=3, spike_action="warn", nan_action="skip"),
        lambda: next(norms),
    )
    decisions = []
    for _ in range(7):
        gate.reset()
        decisions.append((gate.allow(), gate.reason))
    assert decisions == [
        (True, None),
        (True, None),
        (True, None),
        (True, None),
        (True, "spike"),
        (True, None),
        (False, "nan"),
    ]
    gate.reset()
    gate.loss_bad = True
    assert gate.allow() is False and gate.reason == "nan" and not gate.stop


def test_loss_spike_gate_unit():
    from llmtools.train.config_sections import HealthSection

    gate = HealthGate(HealthSection(loss_spike_factor=2, spike_window=3, spike_action="skip"), lambda: 1.0)
    decisions = []
    for loss in [4.0, 3.0, 3.5, 3.2, 7.1, 6.0, 3.1, None]:
        gate.reset()
        gate.loss = loss
        decisions.append((gate.allow(), gate.reason, gate.loss_limit))
    assert decisions == [
        (True, None, None),  # the window fills first
        (True, None, None),
        (True, None, None),
        (True, None, 7.0),  # 2 x median(4, 3, 3.5)
        (False, "loss_spike", 6.4),  # 2 x median(3, 3.5, 3.2); skipped, so not in the window
        (True, None, 6.4),
        (True, None, 7.0),  # 2 x median(3.5, 3.2, 6.0)
        (True, None, 6.4),  # no loss this step (not checked): nothing to compare
    ]
    with pytest.raises(Exception, match="health.loss_spike_factor: must be 0 .off. or > 1, got 0.5"):
        HealthSection(loss_spike_factor=0.5)


def test_a_loss_spike_stops_with_a_checkpoint(byte_data, tmp_path, monkeypatch):
    inject(monkeypatch, at_call=15, factor=10.0)  # step 8's first micro-batch: its loss x 10
    with pytest.raises(RuntimeFailure, match=r"stopped at step 8: health.spike_action=stop \(a loss spike\)"):
        run(
            byte_data,
            tmp_path,
            training__train_steps=10,
            health__loss_spike_factor=3.0,
            health__spike_window=4,
            health__spike_action="stop",
        )
    records = metrics(tmp_path)
    (event,) = [r for r in records if r["kind"] == "event" and r["event"] == "loss_spike"]
    assert event["step"] == 8 and "loss spike" in event["message"] and "stopping" in event["message"]
    (quarantine,) = [json.loads(line) for line in (tmp_path / "quarantine.jsonl").read_text().splitlines()]
    assert quarantine["reason"] == "loss_spike" and quarantine["step"] == 8
    # the injected loss is not one sample's own (scored again, every sample is normal): the whole batch
    assert quarantine["note"] == "the whole batch: no single sample's loss was above the limit"
    assert len(quarantine["samples"]) == 8


def test_a_loss_spike_names_the_samples_whose_own_loss_is_over_the_limit(byte_data, tmp_path, monkeypatch):
    from llmtools.train.tasks.pretrain import PretrainTask

    inject(monkeypatch, at_call=15, factor=10.0)  # step 8's first micro-batch
    original = PretrainTask.sample_losses

    def scored(self, model, batch, device):  # scored again: the second sample of the first micro-batch
        values = original(self, model, batch, device)
        scored.calls += 1
        return [v * 100 if (scored.calls, i) == (1, 1) else v for i, v in enumerate(values)]

    scored.calls = 0
    monkeypatch.setattr(PretrainTask, "sample_losses", scored)
    with pytest.raises(RuntimeFailure, match="a loss spike"):
        run(byte_data, tmp_path, training__train_steps=10, health__loss_spike_factor=3.0,
            health__spike_window=4, health__spike_action="stop")  # fmt: skip
    (quarantine,) = [json.loads(line) for line in (tmp_path / "quarantine.jsonl").read_text().splitlines()]
    assert quarantine["note"] == ""
    (sample,) = quarantine["samples"]
    assert sample["position"] == 7 * 8 + 1 and sample["loss"] > 100
