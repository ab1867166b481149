"""LoRA: base frozen and bitwise unchanged, only the adapters train, exact resume, merged and peft exports.

One short run (ZeRO-2, one process, dropout on) from a Hugging Face base folder feeds the export tests;
a second run stops halfway and resumes, and must match it bit for bit.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.numerics import logits_atol
from tests.train.conftest import TINY
from tests.train.tasks.test_sft import ds, make_sft_prefix, sft_config

ROOT = Path(__file__).resolve().parents[2]
LORA = {
    "lora__r": 4,
    "lora__alpha": 8.0,
    "lora__dropout": 0.1,
    "lora__target_modules": ["q_proj", "v_proj", "down_proj"],
}


def lora_config(prefix: str, base: str, **overrides):
    settings = {
        "model__init_from": base,
        "training__train_steps": 4,
        "schedule__total_steps": 4,
        "schedule__warmup_steps": 0,
        "optimizer__lr": 1e-2,
        "checkpoint__save_every": 2,
        "checkpoint__save_final": True,
        **LORA,
    }
    return sft_config(prefix, **{**settings, **overrides})


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    pytest.importorskip("deepspeed")
    import torch

    from llmtools.model import LlamaForCausalLM
    from llmtools.model.hf import save_hf_folder
    from llmtools.train.loop import RunOptions, train
    from llmtools.train.plan import resolve_model_config

    folder = tmp_path_factory.mktemp("lora")
    prefix = make_sft_prefix(folder, "chat", pack=False, n=64)
    shape = resolve_model_config(sft_config(prefix))
    torch.manual_seed(11)
    save_hf_folder(LlamaForCausalLM(shape), shape, folder / "base")
    cfg = lora_config(prefix, str(folder / "base"))
    result = train(cfg, ds("zero2"), RunOptions(run_dir=folder / "run", quiet=True))
    return {"folder": folder, "prefix": prefix, "base": folder / "base", "result": result, "shape": shape}


def _checkpoint_state(path: Path):
    from llmtools.ckpt.lora import checkpoint_lora

    found = checkpoint_lora(path)
    assert found is not None
    return found


@pytest.mark.numerics
def test_adapter_parameter_count_and_names():
    torch = pytest.importorskip("torch")
    from llmtools.model import LlamaForCausalLM, load_model_config
    from llmtools.model.lora import LoraSection, apply_lora, expected_adapter_parameters

    shape = load_model_config({**load_model_config("tiny").to_dict(), **TINY})
    torch.manual_seed(0)
    model = LlamaForCausalLM(shape)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    section = LoraSection(
        r=4,
        alpha=8,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    counts = apply_lora(model, section)
    # r x (in + out) per projection per layer; GQA: k/v project to num_kv_heads x head_dim.
    kv = shape.num_key_value_heads * shape.head_dim
    h, i = shape.hidden_size, shape.intermediate_size
    by_hand = shape.num_hidden_layers * 4 * (2 * h + 2 * (h + kv) + h + h + 2 * (h + i) + (i + h))
    assert counts["trainable"] == expected_adapter_parameters(shape, section) == by_hand
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(n.endswith((".lora_A", ".lora_B")) for n in trainable)
    assert sum(p.numel() for n, p in model.named_parameters() if p.requires_grad) == by_hand
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in before.items())  # HF names and values unchanged
    # B = 0: at initialisation the adapted model is exactly the base model.
    ids = torch.randint(0, 256, (2, 9))
    reference = LlamaForCausalLM(shape)
    reference.load_state_dict(before)
    # bitwise: B = 0 adds exact zeros to the same base kernels on the same input
    torch.testing.assert_close(model(ids), reference(ids), atol=0, rtol=0)


def test_base_weights_bitwise_unchanged_and_adapters_trained(lora_run):
    torch = pytest.importorskip("torch")
    from llmtools.model.hf import load_hf_state_dict

    result = lora_run["result"]
    assert result.steps == 4 and result.losses[-1] < result.losses[0]
    section, state = _checkpoint_state(result.checkpoint)
    assert section.r == 4 and section.target_modules == ["q_proj", "v_proj", "down_proj"]
    base = load_hf_state_dict(lora_run["base"])
    assert set(base) == {k for k in state if ".lora_" not in k}
    for name, tensor in base.items():
        assert torch.equal(state[name], tensor), name
    adapters_b = [v for k, v in state.items() if k.endswith(".lora_B")]
    assert len(adapters_b) == 3 * TINY["num_hidden_layers"] and all(v.abs().sum() > 0 for v in adapters_b)


def test_resume_is_exact(lora_run, tmp_path):
    torch = pytest.importorskip("torch")
    from llmtools.train.loop import RunOptions, train

    run = tmp_path / "run"
    first = lora_config(lora_run["prefix"], str(lora_run["base"]), training__train_steps=2)
    train(first, ds("zero2"), RunOptions(run_dir=run, quiet=True))
    resumed = train(
        lora_config(lora_run["prefix"], str(lora_run["base"])),
        ds("zero2"),
        RunOptions(run_dir=run, resume="auto", quiet=True),
    )
    straight = lora_run["result"]
    # bitwise: a resume repeats the interrupted run's steps on the same machine, kernels and batches
    assert resumed.losses == straight.losses[2:]
    _, a = _checkpoint_state(resumed.checkpoint)
    _, b = _checkpoint_state(straight.checkpoint)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _ours(lora_run):
    """The trained base-plus-adapter model, built from the checkpoint (eval mode)."""
    import torch

    from llmtools.model import LlamaForCausalLM
    from llmtools.model.lora import apply_lora

    section, state = _checkpoint_state(lora_run["result"].checkpoint)
    model = LlamaForCausalLM(lora_run["shape"])
    apply_lora(model, section)
    model.load_state_dict(state)
    torch.manual_seed(3)
    ids = torch.randint(0, 256, (2, 33))
    with torch.no_grad():
        return ids, model.eval()(ids)


def _convert(python, cli_env, *args):
    return subprocess.run(
        [python, "-m", "llmtools.cli.ckpt", "convert", *map(str, args)],
        capture_output=True, text=True, env=cli_env, timeout=300,
    )  # fmt: skip


@pytest.mark.numerics
def test_merged_export_gives_the_same_logits_in_transformers(lora_run, python, cli_env, tmp_path):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import torch

    proc = _convert(python, cli_env, lora_run["folder"] / "run", "--to", "hf", "-o", tmp_path / "merged")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / "merged")
    ids, ours = _ours(lora_run)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "merged", torch_dtype=torch.float32
    ).eval()
    with torch.no_grad():
        theirs = hf(input_ids=ids).logits
    # fp32 decoder twice, a merged W + BA against the adapter added after: logits_atol (tests/numerics.py)
    torch.testing.assert_close(theirs, ours, atol=logits_atol(ours, hf.config), rtol=0)


@pytest.mark.numerics
def test_adapter_only_export_loads_in_peft(lora_run, python, cli_env, tmp_path):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    import torch

    out = tmp_path / "adapter"
    proc = _convert(python, cli_env, lora_run["result"].checkpoint, "--to", "hf", "--adapter-only", "-o", out)
    assert proc.returncode == 0, proc.stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == ["adapter_config.json", "adapter_model.safetensors", "llmtools.json"]  # our mark: --force
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8.0
    assert config["base_model_name_or_path"] == str(Path(lora_run["base"]).resolve())  # the run's init_from
    base = transformers.AutoModelForCausalLM.from_pretrained(lora_run["base"], torch_dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, out).eval()
    ids, ours = _ours(lora_run)
    with torch.no_grad():
        theirs = model(input_ids=ids).logits
    # fp32 decoder twice, peft's adapter against ours: logits_atol (tests/numerics.py)
    torch.testing.assert_close(theirs, ours, atol=logits_atol(ours, base.config), rtol=0)
    # peft's auto loader finds the base by itself, offline, from an unrelated folder
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    load = (
        "import sys, torch, peft; m = peft.AutoPeftModelForCausalLM.from_pretrained(sys.argv[1], "
        "torch_dtype=torch.float32); print(type(m).__name__)"
    )
    auto = subprocess.run(
        [python, "-c", load, str(out)], cwd=elsewhere, capture_output=True, text=True, timeout=300,
        env={**cli_env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )  # fmt: skip
    assert auto.returncode == 0, auto.stderr[-3000:]
    assert auto.stdout.strip() == "PeftModelForCausalLM"
    # Refused: writing over it again without --force.
    again = _convert(
        python, cli_env, lora_run["result"].checkpoint, "--to", "hf", "--adapter-only", "-o", out
    )
    assert again.returncode == 2 and "Traceback" not in again.stderr


def test_adapter_only_is_refused_where_it_makes_no_sense(lora_run, python, cli_env, tmp_path):
    proc = _convert(python, cli_env, lora_run["result"].checkpoint, "--to", "safetensors", "--adapter-only",
                    "-o", tmp_path / "x")  # fmt: skip
    assert proc.returncode == 2 and "--adapter-only: only with --to hf" in proc.stderr


@pytest.mark.parametrize(
    ("lora", "message"),
    [
        ({"r": 0}, r"lora.r: must be >= 1, got 0"),
        ({"alpha": -1}, r"lora.alpha: must be > 0"),
        ({"dropout": 1.0}, r"lora.dropout: must be in \[0, 1\)"),
        (
            {"target_modules": ["q_prj"]},
            r"lora.target_modules\[0\]: 'q_prj' is not one of .*did you mean 'q_proj'",
        ),
        ({"target_modules": []}, r"lora.target_modules: give at least one"),
        ({"rank": 4}, r"unknown key lora.rank"),
    ],
)
def test_bad_lora_config_names_the_key(lora, message):
    from llmtools.errors import InputError
    from llmtools.train.config import from_dict

    raw = {"data": {"prefixes": ["x"], "seq_length": 8}, "training": {"train_steps": 1}, "lora": lora}
    with pytest.raises(InputError, match=message) as info:
        from_dict(raw, "lora.yaml")
    assert str(info.value).startswith("lora.yaml: ")


@pytest.mark.numerics
def test_zero3_packed_lora_resumes_exactly_and_exports(lora_run, tmp_path):
    """ZeRO-3 partitions the frozen base too: training, exact resume, and the merged export still hold."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from llmtools.ckpt.convert import to_hf
    from llmtools.model.hf import load_hf_state_dict
    from llmtools.train.loop import RunOptions, train

    prefix = make_sft_prefix(tmp_path, "packed", pack=True, n=64)
    base = str(lora_run["base"])
    straight = train(
        lora_config(prefix, base, data__seq_length=256),
        ds("zero3"),
        RunOptions(run_dir=tmp_path / "a", quiet=True),
    )
    train(
        lora_config(prefix, base, data__seq_length=256, training__train_steps=2),
        ds("zero3"),
        RunOptions(run_dir=tmp_path / "b", quiet=True),
    )
    resumed = train(
        lora_config(prefix, base, data__seq_length=256),
        ds("zero3"),
        RunOptions(run_dir=tmp_path / "b", resume="auto", quiet=True),
    )
    # bitwise: a resume repeats the interrupted run's steps on the same machine, kernels and batches
    assert resumed.losses == straight.losses[2:]
    section, state = _checkpoint_state(resumed.checkpoint)
    for name, tensor in load_hf_state_dict(base).items():
        assert torch.equal(state[name], tensor), name
    to_hf(resumed.checkpoint, tmp_path / "merged")
    ids, ours = _ours({**lora_run, "result": resumed})
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged", torch_dtype=torch.float32)
    with torch.no_grad():
        # fp32 decoder twice, a merged W + BA against the adapter added after: logits_atol (tests/numerics.py)
        torch.testing.assert_close(
            hf.eval()(input_ids=ids).logits, ours, atol=logits_atol(ours, hf.config), rtol=0
        )


@pytest.mark.numerics
def test_init_from_one_of_our_checkpoints_merges_the_adapters(lora_run):
    """model.init_from: a run folder (its newest checkpoint) works like a Hugging Face folder; LoRA merged."""
    torch = pytest.importorskip("torch")
    from llmtools.train.engine import build_model
    from llmtools.train.plan import make_plan

    cfg = sft_config(lora_run["prefix"], model__init_from=str(lora_run["folder"] / "run"))
    cfg.model.preset, cfg.model.overrides = None, {}  # the shape comes from the checkpoint's meta.json
    plan = make_plan(cfg, ds("zero0"))
    assert plan.model_config == lora_run["shape"]
    model = build_model(plan).eval()
    ids, ours = _ours(lora_run)
    with torch.no_grad():
        # fp32 decoder twice, a merged W + BA against the adapter added after: logits_atol (tests/numerics.py)
        torch.testing.assert_close(model(ids), ours, atol=logits_atol(ours, model.config), rtol=0)
