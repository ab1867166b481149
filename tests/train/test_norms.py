"""The parameter norm and the update's size in the train records: equal to the norms of the checkpointed
weights (replicated at ZeRO-0, partitioned at ZeRO-2); the update ratio as a health signal."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from llmtools.errors import RuntimeFailure
from tests.train.conftest import tiny_config

ROOT = Path(__file__).resolve().parents[2]


def run(mix: str, run_dir: Path, stage: int, **overrides):
    from llmtools.train.deepspeed_config import load_ds_config
    from llmtools.train.loop import RunOptions, train

    cfg = tiny_config(mix, **overrides)
    ds = load_ds_config(ROOT / f"configs/deepspeed/zero{stage}.json")
    return train(cfg, ds, RunOptions(run_dir=run_dir, quiet=True))


def records(run_dir: Path, kind: str = "train") -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def weights(run_dir: Path, step: int) -> dict:
    from llmtools.ckpt.reader import CheckpointReader

    with CheckpointReader(run_dir / "checkpoints" / f"step_{step:08d}") as reader:
        return {name: source.load().double() for name, source in reader.sources().items()}


@pytest.mark.parametrize("stage", [0, 2])
def test_norms_equal_the_checkpointed_weights(byte_data, tmp_path, stage):
    run(byte_data["mix"], tmp_path, stage, training__train_steps=4, checkpoint__save_every=3,
        checkpoint__save_final=True, logging__log_every=2)  # fmt: skip
    train = records(tmp_path)
    assert [r["step"] for r in train] == [2, 4] and all("params_norm" in r for r in train)
    before, after = weights(tmp_path, 3), weights(tmp_path, 4)
    params = math.sqrt(sum(float(w.pow(2).sum()) for w in after.values()))
    update = math.sqrt(sum(float((after[k] - before[k]).pow(2).sum()) for k in after))
    last = train[-1]
    # fp32 cascade sum of ~1e5 squares vs float64: 4 sqrt(log2 1e5) 2^-24 ~ 1e-6 of the squares, half that of the norm
    assert last["params_norm"] == pytest.approx(params, rel=1e-6)
    # weights round each update into fp32 (2^-24 of |w|); against an update ~1e-3 of |w| that is ~6e-5 of it: rel 1e-4
    assert last["update_norm"] == pytest.approx(update, rel=1e-4)
    # the logged ratio is this very float64 division: 1e-12
    assert last["update_ratio"] == pytest.approx(last["update_norm"] / last["params_norm"], rel=1e-12)
    # a range, not a tolerance: the update/weight ratio of a sane step
    assert 1e-5 < last["update_ratio"] < 1e-1


def test_norms_can_be_turned_off(byte_data, tmp_path):
    run(byte_data["mix"], tmp_path, 1, training__train_steps=2, logging__norms=False)
    assert not any("params_norm" in r for r in records(tmp_path))


def test_update_ratio_spike_detection_per_unit_lr():
    from llmtools.train.config_sections import HealthSection
    from llmtools.train.health import HealthGate

    gate = HealthGate(HealthSection(update_spike_factor=4, spike_window=3), lambda: None)
    # The lr rising through warmup moves the ratio with it: no spike. A jump per unit of lr is one.
    for ratio, lr in ((1e-4, 1e-4), (2e-4, 2e-4), (3e-4, 3e-4), (3.5e-4, 3e-4)):
        gate.check_update(ratio, lr)
        assert gate.update_spike is None
    gate.check_update(6e-3, 3e-4)
    assert gate.update_spike is not None and "update/parameter ratio spike" in gate.update_spike


def test_update_ratio_spike_stops_the_run(byte_data, tmp_path, monkeypatch):
    """An update 100 times the usual size per unit of lr at step 7 (injected where it is measured): an
    event, and with update_spike_action=stop a checkpoint of the state after it and one line saying so.
    (AdamW, Lion and Muon normalize their steps, so a gradient spike does not make one: the signal is for
    updates that outgrow the schedule.)"""
    from llmtools.train.norms import NormMonitor

    original = NormMonitor.finish
    calls = {"n": 0}

    def finish(self, device):
        out = original(self, device)
        calls["n"] += out is not None
        if out is not None and calls["n"] == 7:
            out = {**out, "update_ratio": out["update_ratio"] * 100}
        return out

    monkeypatch.setattr(NormMonitor, "finish", finish)
    with pytest.raises(RuntimeFailure, match="health.update_spike_action=stop") as error:
        run(byte_data["mix"], tmp_path, 2, training__train_steps=10, checkpoint__save_every=5,
            health__update_spike_factor=5.0, health__spike_window=4, health__update_spike_action="stop")  # fmt: skip
    message = str(error.value)
    assert "stopped at step 7" in message and "that update was applied" in message
    assert "step_00000005 holds the last state saved before it" in message
    spikes = [r for r in records(tmp_path, "event") if r["event"] == "spike"]
    assert [s["step"] for s in spikes] == [7] and "update/parameter ratio spike" in spikes[0]["message"]
    assert (tmp_path / "checkpoints" / "step_00000007" / "meta.json").exists()
