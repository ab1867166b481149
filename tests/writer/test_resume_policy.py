"""The resume policy through real llm-train processes: refused changes exit 2 before anything is written,
allowed ones are applied and announced (stderr and metrics.jsonl), config.yaml is rewritten only then."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from llmtools.train.config import SECTION_TYPES, all_keys
from llmtools.train.config_sections import ScheduleSection
from llmtools.train.resume import POLICY, rule_for
from llmtools.train.resume_rules import DERIVED
from llmtools.train.schedule import lr_factor
from tests.writer.conftest import STEPS, records, run, snapshot, train_args

pytestmark = pytest.mark.slow
CKPT = "checkpoints/step_00000004"


def test_every_config_key_has_a_rule():
    """A new config key must be decided on here: may it change on resume or not?"""
    import dataclasses

    from llmtools.model.config import ModelConfig

    keys = [k for k in all_keys() if not k.startswith("lora.")] + ["task", "lora", "world_size"]
    keys += [f"model.{f.name}" for f in dataclasses.fields(ModelConfig)]
    keys += ["zero_optimization.stage", "tokenizer", "data.plan"]
    for key in keys:
        section = key.split(".")[0]
        assert key in POLICY or f"{section}.*" in POLICY, key
    assert set(SECTION_TYPES) - {"lora"} <= {k.split(".")[0] for k in POLICY}
    assert rule_for("model.preset").kind == DERIVED


REFUSED = [
    # (id, extra arguments, key, checkpoint value, config value, the way out named in the message)
    ("model-shape", ["--set", "model.hidden_size=96"], "model.hidden_size", "64", "96",
     "no flag allows it: train it as a new run, -o NEW_RUN"),
    ("precision", ["--set", "training.precision=bf16"], "training.precision", "'fp32'", "'bf16'",
     "no flag allows it: start a new run from these weights, -o NEW_RUN --init-from {ckpt}"),
    ("zero-stage", ["--deepspeed-stage", "1"], "zero_optimization.stage", "2", "1", "pass --reshard"),
    ("zero-3-even-with-reshard", ["--deepspeed-stage", "3", "--reshard"], "zero_optimization.stage", "2", "3",
     "--reshard converts between ZeRO-1 and ZeRO-2 only"),
    ("seed", ["--set", "training.seed=7"], "training.seed", "1234", "7", "pass --reset-data"),
    ("optimizer", ["--set", "optimizer.name=adafactor"], "optimizer.name", "'adamw'", "'adafactor'",
     "no flag allows it"),
    ("batch", ["--set", "training.global_batch_size=16"], "training.global_batch_size", "8", "16",
     "no flag allows it"),
    ("steps-behind", ["--set", "training.train_steps=3"], "training.train_steps", None, None,
     "the checkpoint is at step 4, the config now ends at step 3: nothing to train"),
]  # fmt: skip


@pytest.mark.parametrize("case", REFUSED, ids=[row[0] for row in REFUSED])
def test_a_refused_change_exits_2_and_writes_nothing(base_run, run_copy, case):
    _, extra, key, old, new, way = case
    stage = 2
    if extra[0] == "--deepspeed-stage":
        stage, extra = int(extra[1]), extra[2:]
    before = snapshot(run_copy)
    done = run(train_args(base_run[1], run_copy, stage, "--resume", "auto", *extra))
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    where = f"llm-train: error: {run_copy / CKPT}/meta.json[{key}]: "
    assert lines[0].startswith(where)
    if old is not None:
        assert lines[0].startswith(f"{where}checkpoint has {old}, the config has {new}; ")
    assert way.format(ckpt=run_copy / CKPT) in lines[0]
    assert snapshot(run_copy) == before  # config.yaml, metrics.jsonl, checkpoints: untouched


def _optimizer_state(checkpoint) -> dict:
    import torch

    state = torch.load(checkpoint / "zero_pp_rank_0_mp_rank_00_optim_states.pt", weights_only=False)
    return state["optimizer_state_dict"]


def test_allowed_changes_are_applied_and_announced(base_run, run_copy):
    original = (run_copy / "config.yaml").read_text()
    changes = {
        "training.train_steps": 6,
        "optimizer.lr": 1e-3,
        "schedule.kind": "linear",
        "optimizer.betas": [0.8, 0.9],
        "optimizer.eps": 1e-6,
        "optimizer.weight_decay": 0.05,
        "training.clip_grad": 0.5,
        "training.micro_batch_size": 2,
        "checkpoint.save_every": 1,
        "health.max_skips": 5,
        "logging.tensorboard": True,
        "data.seed": 7,  # pretraining keeps a data ledger: a data change is continued by its rules
    }
    sets = [a for key, value in changes.items() for a in ("--set", f"{key}={json.dumps(value)}")]
    done = run(train_args(base_run[1], run_copy, 2, "--resume", "auto", *sets))
    assert done.returncode == 0, done.stderr[-3000:]

    events = [e for e in records(run_copy, "event") if e["event"] == "config_change"]
    assert {e["key"]: e["new"] for e in events} == changes
    assert all(e["step"] == STEPS for e in events)
    for key, value in changes.items():
        assert (
            f"resume: {key}: " in done.stderr
            and f" -> {json.dumps(value) if isinstance(value, list) else repr(value)} (" in done.stderr
        )

    # The learning rate: the new peak on the new curve, continued at step 5 (not re-warmed).
    schedule = ScheduleSection(kind="linear", warmup_steps=2, total_steps=48)
    train = [r for r in records(run_copy, "train") if r["step"] > STEPS]
    assert [r["step"] for r in train] == [5, 6]
    for r in train:
        # both float64 from the same schedule formula: rel 1e-9 is far above float64's ulps
        assert math.isclose(r["lr"], 1e-3 * lr_factor(r["step"], schedule, 48), rel_tol=1e-9)
    assert "resume: learning rate at step 5: " in done.stderr

    # The optimizer state saved after the resume carries the new hyperparameters.
    state = _optimizer_state(run_copy / "checkpoints" / "step_00000006")
    groups = state["base_optimizer_state"]["param_groups"]
    assert [tuple(g["betas"]) for g in groups] == [(0.8, 0.9)] * 2 and {g["eps"] for g in groups} == {1e-6}
    assert [g["weight_decay"] for g in groups] == [0.05, 0.0]  # norms and biases keep no decay
    assert state["clip_grad"] == 0.5
    assert (run_copy / "checkpoints" / "step_00000005").is_dir()  # save_every 1

    # config.yaml now says what the run does; the previous one is kept beside it.
    assert (run_copy / "config.4.yaml").read_text() == original
    resolved = yaml.safe_load((run_copy / "config.yaml").read_text())
    assert resolved["optimizer"]["lr"] == 1e-3 and resolved["schedule"]["kind"] == "linear"
    assert json.loads((run_copy / "ds_config.4.json").read_text())["gradient_clipping"] == 1.0
    assert json.loads((run_copy / "ds_config.json").read_text())["gradient_clipping"] == 0.5


def test_reset_data_allows_a_new_seed_and_restarts_the_data(base_run, run_copy):
    done = run(train_args(base_run[1], run_copy, 2, "--resume", "auto", "--reset-data",
                          "--set", "training.seed=7", "--set", "data.seed=7", "--set", "training.train_steps=5"))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resume: training.seed: 1234 -> 7 (the RNG streams restart from the new seed)" in done.stderr
    assert "resume: RNG streams restarted from seed 7" in done.stderr
    keys = [e["key"] for e in records(run_copy, "event") if e["event"] == "config_change"]
    assert keys == ["data.seed", "training.train_steps", "training.seed"]
    assert [r["consumed_samples"] for r in records(run_copy, "train") if r["step"] == 5] == [8]


def test_reshard_moves_a_run_from_zero_2_to_zero_1(base_run, run_copy):
    done = run(train_args(base_run[1], run_copy, 1, "--resume", "auto", "--reshard",
                          "--set", "training.train_steps=5"), timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resume: zero_optimization.stage: 2 -> 1 (" in done.stderr
    assert [r["step"] for r in records(run_copy, "train")][-1] == 5
    meta = json.loads((run_copy / "checkpoints" / "step_00000005" / "meta.json").read_text())
    assert meta["zero_stage"] == 1
