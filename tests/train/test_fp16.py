"""fp16 with DeepSpeed's dynamic loss scaling: the DeepSpeed config is filled from the train config, an
injected overflow is skipped and counted and the scale follows DeepSpeed's documented rule, a scale that
collapses to its minimum stops the run with its last good state.

DeepSpeed's CPU accelerator offers fp16 only where oneDNN has fp16 arithmetic (AVX512-FP16/AMX CPUs);
on other CPUs llm-train refuses fp16 in one line (tests/train/test_optim_cli.py). These tests declare the
CPU capable (``is_fp16_supported``), which is the only thing patched: the model, DeepSpeed's fp16 ZeRO
optimizer and its loss scaler then run for real, in fp16, on the CPU (slowly: fp16 matmuls on a CPU
without fp16 units are emulated). What they cannot show is fp16 on a GPU: its speed, and overflows that
come from a real model's activations rather than an injected one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmtools.errors import InputError, RuntimeFailure
from llmtools.train.tasks import pretrain
from tests.train.conftest import tiny_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fp16_cpu(monkeypatch):
    from deepspeed.accelerator import get_accelerator

    monkeypatch.setattr(type(get_accelerator()), "is_fp16_supported", lambda self: True)


def overflow_at(monkeypatch, steps: set[int], micro_batches: int = 2) -> None:
    """Scale the loss of the first micro-batch of each step in ``steps`` by 1e30: finite in fp32, but its
    fp16 gradients overflow (the loss scaler's case, not a NaN loss)."""
    original = pretrain.cross_entropy
    calls = {"n": 0}

    def patched(logits, labels):
        calls["n"] += 1
        loss = original(logits, labels)
        if logits.requires_grad and (calls["n"] - 1) % micro_batches == 0:
            if (calls["n"] - 1) // micro_batches + 1 in steps:
                return loss * 1e30
        return loss

    monkeypatch.setattr(pretrain, "cross_entropy", patched)


def run(mix: str, run_dir: Path, stage: int = 2, **overrides):
    from llmtools.train.deepspeed_config import load_ds_config
    from llmtools.train.loop import RunOptions, train

    cfg = tiny_config(mix, training__precision="fp16", **overrides)
    ds = load_ds_config(ROOT / f"configs/deepspeed/zero{stage}.json")
    return train(cfg, ds, RunOptions(run_dir=run_dir, quiet=True))


def records(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def documented_scales(power: int, window: int, hysteresis: int, overflows: set[int], steps: int):
    """DeepSpeed's dynamic loss scaling as its fp16 documentation states it: start at 2**power; an overflow
    skips the step and uses up one unit of hysteresis, the scale halving once none is left; after an
    overflow (or the start) the scale doubles, and the hysteresis refills, on every ``window``-th good step
    after the first. Returns the scale after each step."""
    scale, left, last, out = float(2**power), hysteresis, 0, []
    for step in range(1, steps + 1):
        if step in overflows:
            if left == 1:
                scale /= 2
            else:
                left -= 1
            last = step
        else:
            stable = step - last - 1
            if stable > 0 and stable % window == 0:
                scale *= 2
                left = hysteresis
        out.append(scale)
    return out


def test_ds_config_takes_the_loss_scaling_from_the_train_config(byte_data):
    from llmtools.train.deepspeed_config import resolve_ds_config

    cfg = tiny_config(byte_data["mix"], training__precision="fp16", fp16__initial_scale_power=12,
                      fp16__loss_scale_window=50, fp16__hysteresis=1)  # fmt: skip
    ds = resolve_ds_config({"fp16": {"enabled": "auto", "loss_scale_window": "auto"}}, cfg, world_size=1,
                           total_steps=50)  # fmt: skip
    assert ds["fp16"] == {
        "enabled": True,
        "loss_scale": 0.0,
        "initial_scale_power": 12,
        "loss_scale_window": 50,
        "hysteresis": 1,
        "consecutive_hysteresis": False,
        "min_loss_scale": 1,
    }
    assert ds["bf16"]["enabled"] is False
    with pytest.raises(
        InputError, match=r"ds.json\[bf16.enabled\]=true contradicts training.precision='fp16'"
    ):
        resolve_ds_config({"bf16": {"enabled": True}}, cfg, world_size=1, total_steps=50, ds_source="ds.json")
    with pytest.raises(
        InputError, match=r"\[fp16.loss_scale_window\]=1000 contradicts fp16.loss_scale_window=50"
    ):
        resolve_ds_config({"fp16": {"loss_scale_window": 1000}}, cfg, world_size=1, total_steps=50)
    bf16 = tiny_config(byte_data["mix"], training__precision="bf16")
    with pytest.raises(InputError, match=r"\[fp16.enabled\]=true contradicts training.precision='bf16'"):
        resolve_ds_config({"fp16": {"enabled": True}}, bf16, world_size=1, total_steps=50)


def test_overflows_are_skipped_counted_and_scaled_as_documented(byte_data, tmp_path, monkeypatch, fp16_cpu):
    steps, overflows = 14, {3, 4, 11}
    overflow_at(monkeypatch, overflows)
    scaling = {"fp16__initial_scale_power": 10, "fp16__loss_scale_window": 3, "fp16__hysteresis": 2}
    result = run(byte_data["mix"], tmp_path, training__train_steps=steps, **scaling)
    train = records(tmp_path, "train")
    assert [r["loss_scale"] for r in train] == documented_scales(10, 3, 2, overflows, steps)
    assert [r["step"] for r in train if r.get("skipped_steps")] == sorted(overflows)
    assert all(r["overflow_steps"] == 1 for r in train if r.get("skipped_steps"))
    events = [r for r in records(tmp_path, "event") if r["event"] == "overflow"]
    assert [e["step"] for e in events] == sorted(overflows)
    assert "update skipped; loss scale now" in events[0]["message"]
    # A skipped step has no update to measure; the others do.
    assert [r["step"] for r in train if "update_ratio" not in r] == sorted(overflows)
    # fp16 still learns: the overflows were skipped (an applied 1e30 gradient would have ruined the run).
    good = [loss for step, loss in enumerate(result.losses, 1) if step not in overflows]
    assert good[0] > 5.0 and sum(good[-3:]) / 3 < good[0] - 0.8, good
    assert result.steps == steps  # overflows do not count towards health.max_skips
    # An overflow is the scaler's routine, not bad data: no sample is quarantined.
    assert not (tmp_path / "quarantine.jsonl").exists()
    assert not [r for r in records(tmp_path, "event") if r["event"] == "quarantine"]
    validate_against_schema(tmp_path / "metrics.jsonl")


def validate_against_schema(path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "schemas" / "metrics.schema.json").read_text())
    for line in path.read_text().splitlines():
        jsonschema.validate(json.loads(line), schema)


def test_a_collapsed_scale_stops_with_the_last_good_state(byte_data, tmp_path, monkeypatch, fp16_cpu):
    overflow_at(monkeypatch, set(range(3, 20)))
    scaling = {"fp16__initial_scale_power": 3, "fp16__min_loss_scale": 2, "fp16__hysteresis": 1}
    with pytest.raises(RuntimeFailure) as error:
        run(byte_data["mix"], tmp_path, training__train_steps=10, **scaling)
    message = str(error.value)
    # 8 -> 4 (step 3) -> 2 (step 4), and step 5 overflows again at the minimum: steps 3-4 were skipped.
    assert "stopped at step 4: the fp16 loss scale fell to its minimum 2 (fp16.min_loss_scale)" in message
    assert "training.precision=bf16" in message and "--resume" in message
    assert (tmp_path / "checkpoints" / "step_00000004" / "meta.json").exists()
    assert records(tmp_path, "event")[-1]["event"] == "stop"
    assert [r["loss_scale"] for r in records(tmp_path, "train")] == [8.0, 8.0, 4.0, 2.0]
