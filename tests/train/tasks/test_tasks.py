"""The task interface: a task plugged into the table trains, logs its metrics, keeps its state across a
resume, and the trainer needs no change for it; the sequence length has one rule and one owner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmtools.errors import InputError
from tests.train.conftest import tiny_config

ROOT = Path(__file__).resolve().parents[3]


def _scaled_task_class():
    from llmtools.train.tasks import LossOutput
    from llmtools.train.tasks.pretrain import PretrainTask

    class ScaledTask(PretrainTask):
        """Pretraining that also reports twice its loss and counts its trained micro-batches (its state)."""

        name = "scaled"
        metric_names = ("loss_doubled",)
        instances: list = []

        def __init__(self, config) -> None:
            super().__init__(config)
            self.micro_batches = 0
            ScaledTask.instances.append(self)

        def loss(self, model, batch, device) -> LossOutput:
            import torch

            out = super().loss(model, batch, device)
            self.micro_batches += int(torch.is_grad_enabled())  # trained ones, not evaluated ones
            return LossOutput(out.loss, {"loss_doubled": 2 * out.loss})

        def state_dict(self) -> dict:
            return {"micro_batches": self.micro_batches}

        def load_state_dict(self, state: dict) -> None:
            self.micro_batches = state["micro_batches"]

    return ScaledTask


def test_a_plugged_in_task_trains_logs_its_metrics_and_resumes_its_state(byte_data, tmp_path, monkeypatch):
    pytest.importorskip("deepspeed")
    from llmtools.train import tasks
    from llmtools.train.deepspeed_config import load_ds_config
    from llmtools.train.loop import RunOptions, train

    scaled = _scaled_task_class()
    monkeypatch.setitem(tasks.TASKS, "scaled", scaled)
    ds = load_ds_config(ROOT / "configs/deepspeed/zero0.json")
    run = tmp_path / "run"

    def config(steps: int):
        from llmtools.train.config import from_dict

        base = tiny_config(
            byte_data["mix"],
            training__train_steps=steps,
            schedule__total_steps=3,
            schedule__warmup_steps=1,
            checkpoint__save_final=True,
            eval__every=2,
            eval__iters=1,
        )
        return from_dict({**base.to_dict(), "task": "scaled"}, "test.yaml")  # checked against the table

    first = train(config(2), ds, RunOptions(run_dir=run, quiet=True))
    assert first.steps == 2 and scaled.instances[-1].micro_batches == 4  # 2 steps x 2 micro-batches
    second = train(config(3), ds, RunOptions(run_dir=run, quiet=True, resume="auto"))
    assert second.steps == 3 and scaled.instances[-1].micro_batches == 4 + 2  # restored, then one step
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train_records] == [1, 2, 3]
    for r in train_records:
        # 2x a float is exact in binary; rel 1e-6 only absorbs the fp32-to-JSON round trip
        assert r["loss_doubled"] == pytest.approx(2 * r["loss"], rel=1e-6)
    evals = [r for r in records if r["kind"] == "eval"]
    # 2x a float is exact in binary; rel 1e-6 only absorbs the fp32-to-JSON round trip
    assert evals and all(r["loss_doubled"] == pytest.approx(2 * r["eval_loss"], rel=1e-6) for r in evals)


def test_unknown_task_lists_the_table():
    from llmtools.train.config import from_dict

    raw = {"task": "dpo2", "data": {"mix": "mix.json"}, "training": {"train_steps": 1}}
    with pytest.raises(InputError, match=r"test.yaml: task: 'dpo2' is not one of pretrain, sft"):
        from_dict(raw, "test.yaml")


def test_seq_length_has_one_rule_named_where_it_was_given(byte_data, tmp_path):
    from llmtools.formats.mix import MIN_SEQ_LENGTH, read_mix

    assert MIN_SEQ_LENGTH == 2
    with pytest.raises(InputError, match=r"^test.yaml: data.seq_length: must be >= 2, got 1$"):
        tiny_config(None, data__prefixes=byte_data["prefixes"], data__seq_length=1)
    mix = json.loads(Path(byte_data["mix"]).read_text())
    bad = tmp_path / "mix.json"
    bad.write_text(json.dumps({**mix, "seq_length": 1}))
    with pytest.raises(InputError, match=r"mix.json\[seq_length\]: must be >= 2, found 1"):
        read_mix(bad)


def test_the_sequence_length_is_the_datas(byte_data):
    """With a mix the config need not repeat it; the plan reads it from the opened data."""
    from llmtools.train.plan import make_plan

    plan = make_plan(tiny_config(byte_data["mix"]), {"train_micro_batch_size_per_gpu": "auto"})
    assert (
        plan.seq_length
        == plan.train_data.seq_length
        == json.loads(Path(byte_data["mix"]).read_text())["seq_length"]
    )
