"""training.compile through the real loop: the losses of eager (within rounding), exact resume, refusals."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from llmtools.errors import InputError
from tests.train.conftest import TINY, tiny_config

ROOT = Path(__file__).resolve().parents[2]
STEPS = 20
# fp32 throughout. Inductor fuses the norms, SiLU and RoPE and may order a row's sums differently from
# eager: one reordered sum of n terms moves the result by ~n * 2**-24 relative. Over the widest sum here
# (the 256-wide MLP) that is ~1.5e-5 of one activation, shrunk by the mean over 512 loss terms; 20 AdamW
# steps of lr 3e-3 let that drift grow but stay ~1e-6 on a loss of ~5 (measured: below 3e-6), so 1e-5.
LOSS_TOL = 1e-5

pytestmark = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler")


def _train(mix, run_dir: Path, stage=0, resume=None, **overrides):
    from llmtools.train.deepspeed_config import load_ds_config
    from llmtools.train.loop import RunOptions, train

    overrides.setdefault("training__train_steps", STEPS)
    overrides.setdefault("training__micro_batch_size", 4)
    overrides.setdefault("training__global_batch_size", 8)
    cfg = tiny_config(mix, **overrides)
    ds = load_ds_config(ROOT / f"configs/deepspeed/zero{stage}.json")
    return train(cfg, ds, RunOptions(run_dir=run_dir, quiet=True, resume=resume))


@pytest.fixture(scope="module")
def compiled(byte_data, tmp_path_factory):
    run = tmp_path_factory.mktemp("compiled") / "run"
    return run, _train(byte_data["mix"], run, training__compile=True, checkpoint__save_every=10)


def test_compiled_losses_equal_eager(byte_data, compiled, tmp_path):
    eager = _train(byte_data["mix"], tmp_path / "eager")
    _, comp = compiled
    assert len(eager.losses) == len(comp.losses) == STEPS
    worst = max(abs(a - b) for a, b in zip(eager.losses, comp.losses, strict=True))
    assert worst <= LOSS_TOL, (worst, eager.losses, comp.losses)


def test_compiled_layers_keep_the_eager_names():
    from llmtools.model import LlamaForCausalLM
    from llmtools.model.presets import load_model_config
    from llmtools.train.engine import compile_layers

    model = LlamaForCausalLM(load_model_config({**load_model_config("tiny").to_dict(), **TINY}))
    names = list(model.state_dict())
    assert compile_layers(model) == len(model.model.layers)
    assert list(model.state_dict()) == names  # checkpoints of a compiled run load into an eager one


def test_compiled_resume_is_exact(byte_data, compiled, tmp_path):
    full_run, full = compiled
    run = tmp_path / "run"
    shutil.copytree(full_run, run)
    for step in sorted((run / "checkpoints").glob("step_*"))[1:]:  # keep step 10 only
        shutil.rmtree(step)
    (run / "checkpoints" / "latest").write_text("step_00000010")
    resumed = _train(byte_data["mix"], run, resume="10", training__compile=True, checkpoint__save_every=10)
    assert resumed.losses == full.losses[10:]  # bitwise: the same compiled kernels on the same state


def test_moe_compiled_losses_equal_eager(byte_data, tmp_path):
    moe = {"model__num_experts": 4, "model__num_experts_per_tok": 2, "model__intermediate_size": 128}
    eager = _train(byte_data["mix"], tmp_path / "eager", training__train_steps=3, **moe)
    comp = _train(byte_data["mix"], tmp_path / "comp", training__train_steps=3, training__compile=True, **moe)
    worst = max(abs(a - b) for a, b in zip(eager.losses, comp.losses, strict=True))
    assert worst <= LOSS_TOL, (worst, eager.losses, comp.losses)


def test_document_masking_compiles_once(byte_data, tmp_path, monkeypatch):
    import torch

    masking = {
        "data__reset_attention_mask": True,
        "data__reset_position_ids": True,
        "training__train_steps": 3,
    }
    eager = _train(byte_data["mix"], tmp_path / "eager", **masking)
    torch._dynamo.reset()
    # every batch has other document boundaries: none of them may recompile the layers
    monkeypatch.setattr(torch._dynamo.config, "error_on_recompile", True)
    comp = _train(byte_data["mix"], tmp_path / "comp", training__compile=True, **masking)
    worst = max(abs(a - b) for a, b in zip(eager.losses, comp.losses, strict=True))
    assert worst <= LOSS_TOL, (worst, eager.losses, comp.losses)


def test_refused_combinations_name_the_key(byte_data, monkeypatch):
    from llmtools.train.deepspeed_config import load_ds_config
    from llmtools.train.plan import make_plan

    cfg = tiny_config(byte_data["mix"], training__compile=True)
    ds = load_ds_config(ROOT / "configs/deepspeed/zero3.json")
    with pytest.raises(InputError, match=r"training.compile: not with ZeRO stage 3"):
        make_plan(cfg, ds, world_size=1)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("CC", "no-such-cc")
    ds = load_ds_config(ROOT / "configs/deepspeed/zero0.json")
    with pytest.raises(InputError, match=r"training.compile: no C compiler"):
        make_plan(cfg, ds, world_size=1)


def test_compile_keeps_the_fingerprint(byte_data):
    on = tiny_config(byte_data["mix"], training__compile=True)
    assert on.fingerprint() == tiny_config(byte_data["mix"]).fingerprint()


def test_llm_train_refuses_compile_with_zero3_in_one_line(byte_data, tmp_path):
    import yaml

    from tests.contract.conftest import error_line, run_cli

    config = tmp_path / "compile.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {"preset": "tiny", **TINY},
                "data": {"mix": byte_data["mix"]},
                "training": {
                    "micro_batch_size": 4,
                    "global_batch_size": 8,
                    "train_steps": 2,
                    "compile": True,
                },
            }
        )
    )
    zero3 = ROOT / "configs/deepspeed/zero3.json"
    proc = run_cli(["llm-train", config, "--deepspeed", zero3, "-o", tmp_path / "run"], cwd=tmp_path)
    assert proc.returncode == 2
    line = error_line(proc, "llm-train")
    assert "training.compile: not with ZeRO stage 3" in line and str(config) in line
    assert not (tmp_path / "run").exists()
