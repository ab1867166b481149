"""A refused resume changes nothing; an allowed change is applied wherever a fresh run applies it.
Real ``llm-train`` processes: a DPO resume refused for another ``init_from`` leaves every file of the run
as it was (and the run still resumes with its own config); a weight decay changed on resume reaches
every optimizer group a fresh run decays (per optimizer, per group); ``--reset-data`` asks the new data
to hold the steps left, suggests a step count that trains, and reports the samples consumed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.train.conftest import TINY
from tests.train.test_exactness import llm_train, write_config

BOUND = 300  # seconds per process (a tiny run takes ~15 s on a loaded machine)


def tree_hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def optimizer_decay(checkpoint: Path) -> list[float]:
    """The weight decay of each optimizer group, as the checkpoint's optimizer state holds it."""
    import torch

    (path,) = sorted(checkpoint.rglob("*optim_states.pt"))[:1]
    state = torch.load(path, map_location="cpu", weights_only=False)

    def find(node):
        if isinstance(node, dict):
            if isinstance(node.get("param_groups"), list):
                return node["param_groups"]
            for value in node.values():
                found = find(value)
                if found is not None:
                    return found
        return None

    return [float(g["weight_decay"]) for g in find(state)]


@pytest.mark.parametrize("optimizer", ["adamw", "lion", "muon"])
def test_a_weight_decay_change_reaches_every_group_a_fresh_run_decays(byte_data, tmp_path, optimizer):
    def config(wd: float, steps: int) -> Path:
        settings = {"optimizer": {"name": optimizer, "lr": 1e-3, "weight_decay": wd},
                    "training": {"train_steps": steps}}  # fmt: skip
        return write_config(tmp_path / f"{wd}-{steps}.yaml", byte_data["mix"], settings)

    fresh, run = tmp_path / "fresh", tmp_path / "run"
    for proc in (
        llm_train(config(0.1, 1), fresh, timeout=BOUND),
        llm_train(config(0.0, 1), run, timeout=BOUND),
    ):
        assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    resumed = llm_train(config(0.1, 2), run, "--resume", "auto", timeout=BOUND)
    assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
    assert b"optimizer.weight_decay" in resumed.stderr
    expected = optimizer_decay(fresh / "checkpoints" / "step_00000001")
    assert 0.1 in expected and 0.0 in expected  # norms and biases are never decayed
    assert optimizer_decay(run / "checkpoints" / "step_00000002") == expected


@pytest.fixture(scope="module")
def dpo_prefix(tmp_path_factory):
    from tests.train.tasks.test_dpo import make_pref_prefix

    return make_pref_prefix(tmp_path_factory.mktemp("pref"))


def test_a_refused_dpo_resume_computes_and_writes_nothing(dpo_prefix, tmp_path):
    import torch

    from llmtools.model import LlamaForCausalLM, load_model_config
    from llmtools.model.hf import save_hf_folder

    model_config = load_model_config({**load_model_config("tiny").to_dict(), **TINY})
    torch.manual_seed(1)
    other = save_hf_folder(LlamaForCausalLM(model_config), model_config, tmp_path / "other-init")

    def config(name: str, **model) -> Path:
        raw = {"task": "dpo", "data": {"prefixes": [dpo_prefix], "seq_length": 128, "mix": None},
               "model": model, "optimizer": {"lr": 1e-3, "weight_decay": 0.0}, "dpo": {"beta": 0.1},
               "training": {"train_steps": 2}}  # fmt: skip
        return write_config(tmp_path / name, "unused", raw)

    run = tmp_path / "run"
    first = llm_train(config("a.yaml"), run, timeout=BOUND)
    assert first.returncode == 0, first.stderr.decode()[-3000:]
    before = tree_hashes(run)
    refused = llm_train(config("b.yaml", init_from=str(other)), run, "--resume", "auto", timeout=BOUND)
    text = refused.stderr.decode().strip()
    assert refused.returncode == 2 and "\n" not in text, text[-3000:]
    assert "meta.json[model.init_from]" in text and "reference was computed from the weights" in text
    assert tree_hashes(run) == before  # nothing computed, nothing written
    # the run still takes its own config back
    again = llm_train(config("c.yaml"), run, "--resume", "auto", timeout=BOUND)
    assert again.returncode == 0 and b"nothing to train" in again.stderr, again.stderr.decode()[-3000:]


def _mix(byte_data, path: Path, samples: int) -> str:
    from llmtools.data import mix as mixlib

    config = mixlib.MixConfig(
        blend=mixlib.Blend(list(reversed(byte_data["prefixes"])), [0.5, 0.5]),
        seq_length=64,
        num_samples=samples,
        valid_samples=0,
        test_samples=0,
        split="100,0,0",
    )
    mixlib.save_plan(mixlib.build_plan(config), path)
    return str(path)


def test_reset_data_asks_the_new_data_for_the_steps_left(byte_data, tmp_path):
    def config(name: str, mix: str, steps: int) -> Path:
        settings = {"training": {"train_steps": steps}, "checkpoint": {"save_every": 5}}
        return write_config(tmp_path / name, mix, settings)

    run = tmp_path / "run"
    first = llm_train(config("a.yaml", byte_data["mix"], 5), run, timeout=BOUND)
    assert first.returncode == 0, first.stderr.decode()[-3000:]
    # 3 steps of data (24 samples) for the 5 steps left: refused, suggesting 5 + 3 = 8 steps
    short = _mix(byte_data, tmp_path / "short.json", 24)
    refused = llm_train(config("b.yaml", short, 10), run, "--resume", "auto", "--reset-data", timeout=BOUND)
    text = refused.stderr.decode().strip()
    assert refused.returncode == 2 and "\n" not in text, text[-3000:]
    assert "the 5 steps left (step 5 to training.train_steps=10) need 40" in text
    assert "--set training.train_steps=8" in text
    # 5 steps of data (40 samples): enough for the steps left
    enough = _mix(byte_data, tmp_path / "enough.json", 40)
    done = llm_train(config("c.yaml", enough, 10), run, "--resume", "auto", "--reset-data", timeout=BOUND)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert (
        f"resumed from {run}/checkpoints/step_00000005 at step 5 (40 samples consumed)"
        in done.stderr.decode()
    )
