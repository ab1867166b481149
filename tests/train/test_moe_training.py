"""The tiny MoE through the real training loop: loss falls under ZeRO-1/2/3 on 1 and 2 processes, expert
parallelism 2 (DeepSpeed's expert-parallel layer) matches one process, resume is exact, a world-size change
continues the run, the export loads in transformers; router metrics in metrics.jsonl; bad configs fail
before compute with one line.

The 2-rank runs share one ``torchrun`` launch (tests/train/moe_worker.py); the 1-rank runs share this
process.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.ports import free_port
from tests.train.moe_worker import moe_config

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("moe_worker.py")
pytestmark = pytest.mark.slow


def train_once(mix: str, run_dir: Path, stage: int = 2, resume: str | None = None, **kwargs):
    from llmtools.train.deepspeed_config import load_ds_config
    from llmtools.train.loop import RunOptions, train

    overrides = {k: v for k, v in kwargs.items() if "__" in k}
    config = moe_config(mix, kwargs.get("expert_parallel"), kwargs.get("save_every", 0), **overrides)
    ds = load_ds_config(ROOT / f"configs/deepspeed/zero{stage}.json")
    return train(config, ds, RunOptions(run_dir=run_dir, quiet=True, resume=resume))


def records(run_dir: Path, kind: str = "train") -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records(run_dir)}


def max_diff(a: dict[int, float], b: dict[int, float]) -> float:
    assert a.keys() == b.keys()
    return max(abs(a[k] - b[k]) for k in a)


@pytest.fixture(scope="module")
def one_rank(byte_data, tmp_path_factory):
    """1-rank runs: ZeRO-2 (checkpoints at 6 and 12), ZeRO-1, ZeRO-3, and ZeRO-2 with a capacity factor."""
    root = tmp_path_factory.mktemp("moe1")
    mix = byte_data["mix"]
    train_once(mix, root / "zero2", 2, save_every=6)
    train_once(mix, root / "zero1", 1)
    train_once(mix, root / "zero3", 3)
    train_once(mix, root / "capacity", 2, model__moe_capacity_factor=0.5, training__train_steps=4)
    return root


@pytest.fixture(scope="module")
def two_ranks(byte_data, tmp_path_factory, cli_env_module):
    root = tmp_path_factory.mktemp("moe2")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    command += ["--master_port", str(free_port()), str(WORKER), byte_data["mix"], str(root)]
    done = subprocess.run(command, env=cli_env_module, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return root


@pytest.fixture(scope="module")
def cli_env_module():
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update({"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"})
    env.pop("LLMTOOLS_DEBUG", None)
    return env


# ---- training ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("run", ["zero1", "zero2", "zero3"])
def test_loss_falls_on_one_rank(one_rank, run):
    got = losses(one_rank / run)
    assert len(got) == 12
    assert got[12] < got[1] - 1.0, got


@pytest.mark.numerics
def test_zero_stages_agree_on_one_rank(one_rank):
    reference = losses(one_rank / "zero2")
    # fp32 MoE trainings, ZeRO stages/ranks reducing in another order: last-bit gradient differences; a router can flip a near-tie, which 1e-5 of a loss ~5 still holds over these steps
    assert max_diff(losses(one_rank / "zero1"), reference) < 1e-5
    # fp32 MoE trainings, ZeRO stages/ranks reducing in another order: last-bit gradient differences; a router can flip a near-tie, which 1e-5 of a loss ~5 still holds over these steps
    assert max_diff(losses(one_rank / "zero3"), reference) < 1e-5


@pytest.mark.numerics
@pytest.mark.parametrize("run", ["zero2", "ep2-zero1", "ep2-zero2", "ep2-zero3"])
def test_two_ranks_match_one_rank(one_rank, two_ranks, run):
    """2 ranks x 1 micro-batch (with and without expert parallelism 2, ZeRO-1/2/3) = 1 rank x 2."""
    got = losses(two_ranks / run)
    assert got[12] < got[1] - 1.0
    # fp32 MoE trainings, ZeRO stages/ranks reducing in another order: last-bit gradient differences; a router can flip a near-tie, which 1e-5 of a loss ~5 still holds over these steps
    assert max_diff(got, losses(one_rank / "zero2")) < 1e-5
    config = yaml.safe_load((two_ranks / run / "config.yaml").read_text())
    assert config["resolved"]["world_size"] == 2
    ds = json.loads((two_ranks / run / "ds_config.json").read_text())
    if run.startswith("ep2"):
        assert ds["expert_parallel"]["autoep_size"] == 2 and config["model"]["expert_parallel"] == 2
        # the metrics of DeepSpeed's layer are those of ours (same routing, tapped router)
        for mine, theirs in zip(records(two_ranks / run), records(one_rank / "zero2"), strict=True):
            # fp32 router statistics of the trainings above: same order of difference, 1e-5
            assert mine["moe_aux_loss"] == pytest.approx(theirs["moe_aux_loss"], abs=1e-5)
            # fp32 router statistics of the trainings above: same order of difference, 1e-5
            assert mine["moe_layers"][1]["load"] == pytest.approx(theirs["moe_layers"][1]["load"], abs=1e-5)
    else:
        assert "expert_parallel" not in ds


def test_expert_parallel_resume_is_bitwise(two_ranks):
    """Killed at step 6 and resumed: the same losses and bitwise the same weights and optimizer state."""
    import torch

    full, resumed = two_ranks / "ep2-zero2", two_ranks / "ep2-zero2-resumed"
    assert {k: v for k, v in losses(full).items() if k > 6} == losses(resumed)
    a, b = full / "checkpoints" / "step_00000012", resumed / "checkpoints" / "step_00000012"
    names = sorted(p.name for p in a.glob("*.pt") if "expert" in p.name or "optim_states" in p.name)
    assert any(n.startswith("layer_1_expert_3") for n in names)  # each rank saved its own experts
    assert names == sorted(p.name for p in b.glob("*.pt") if "expert" in p.name or "optim_states" in p.name)
    for name in names:
        _assert_same(torch.load(a / name, weights_only=False), torch.load(b / name, weights_only=False), name)
    meta = json.loads((a / "meta.json").read_text())
    assert meta["expert_parallel"] == 2 and meta["complete"]


def _assert_same(x, y, where: str) -> None:
    import torch

    if isinstance(x, torch.Tensor):
        assert torch.equal(x, y), where
    elif isinstance(x, dict):
        for key in x:
            if key not in ("ds_config", "ds_version"):
                _assert_same(x[key], y[key], f"{where}[{key}]")
    elif isinstance(x, (list, tuple)):
        for i, (u, v) in enumerate(zip(x, y, strict=True)):
            _assert_same(u, v, f"{where}[{i}]")


@pytest.mark.numerics
@pytest.mark.parametrize(("run", "ep"), [("zero2", None), ("ep2-zero2", 1)])
def test_world_size_change_continues_the_run(two_ranks, one_rank, tmp_path, run, ep):
    """A 2-rank checkpoint (with and without expert parallelism) resumed by 1 rank: the same curve."""
    source = two_ranks / run / "checkpoints" / "step_00000006"
    train_once(_mix_of(two_ranks / run), tmp_path / "run", 2, resume=str(source), expert_parallel=ep)
    got = losses(tmp_path / "run")
    assert sorted(got) == list(range(7, 13))
    reference = {k: v for k, v in losses(one_rank / "zero2").items() if k > 6}
    # fp32 MoE trainings, ZeRO stages/ranks reducing in another order: last-bit gradient differences; a router can flip a near-tie, which 1e-5 of a loss ~5 still holds over these steps
    assert max_diff(got, reference) < 1e-5


def _mix_of(run_dir: Path) -> str:
    return yaml.safe_load((run_dir / "config.yaml").read_text())["data"]["mix"]


@pytest.mark.numerics
def test_expert_parallel_checkpoint_exports_to_transformers(two_ranks, one_rank, tmp_path):
    """An expert-parallel checkpoint (DeepSpeed's names, experts spread over files) converts to a folder in
    transformers' layout: equal to the 1-rank run's weights, and it generates."""
    import torch
    import transformers

    from llmtools.ckpt.convert import to_hf
    from llmtools.model.hf import load_hf_state_dict

    out = to_hf(two_ranks / "ep2-zero2" / "checkpoints" / "step_00000012", tmp_path / "hf")
    ref = to_hf(one_rank / "zero2" / "checkpoints" / "step_00000012", tmp_path / "ref")
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen3_moe"
    got, expected = load_hf_state_dict(out), load_hf_state_dict(ref)
    assert got.keys() == expected.keys() and "model.layers.1.mlp.experts.3.up_proj.weight" in got
    # fp32 weights after the trainings above: last-bit update differences grown over the steps, 1e-4 of weights ~1e-2..1
    assert max(float((got[k] - expected[k]).abs().max()) for k in got) < 1e-4
    assert not list(tmp_path.glob("*.tmp-*"))  # the universal scratch folder is gone
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.tensor([[72, 101, 108, 108, 111]])
    generated = hf.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert generated.shape == (1, 11)


# ---- metrics -------------------------------------------------------------------------------------------


def test_router_metrics_in_every_train_record(one_rank):
    from llmtools.logs.reader import read_log

    recs = records(one_rank / "zero2")
    for record in recs:
        assert set(record) >= {"moe_aux_loss", "moe_z_loss", "moe_load_cv", "moe_load_cv_max", "moe_dropped"}
        assert [layer["layer"] for layer in record["moe_layers"]] == [0, 1]
        for layer in record["moe_layers"]:
            # fp32 shares that sum to 1: 4 terms, a few ulps
            assert len(layer["load"]) == 4 and sum(layer["load"]) == pytest.approx(1.0, abs=1e-5)
            assert layer["dropped"] == 0.0 and layer["aux_loss"] >= 1.0
        assert record["moe_aux_loss"] >= 1.9  # k = 2 at perfect balance, more otherwise
    _check_schema(recs)
    # llm-log reads the per-layer values as scalars
    parsed = [r for r in read_log(str(one_rank / "zero2" / "metrics.jsonl"))[0] if r.kind == "train"]
    assert {"moe_aux_loss", "moe_layer0_cv", "moe_layer1_max_load", "moe_layer1_aux_loss"} <= set(
        parsed[0].values
    )


def test_capacity_factor_drops_and_reports_it(one_rank):
    recs = records(one_rank / "capacity")
    assert all(0 < r["moe_dropped"] < 1 for r in recs)
    assert all(math.isfinite(r["loss"]) for r in recs)


def _check_schema(recs: list[dict]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "schemas" / "metrics.schema.json").read_text())
    for record in recs:
        jsonschema.validate(record, schema)


# ---- bad configs ---------------------------------------------------------------------------------------


# The tiny MoE of these tests without its experts: a dense MLP as wide as the preset's intermediate_size.
DENSE_TWIN = {
    "vocab_size": 320,
    "hidden_size": 96,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "qk_norm": True,
}


def _write_config(folder: Path, mix: str, **model) -> Path:
    raw = {
        "model": {
            "preset": "tiny-moe",
            "vocab_size": 320,
            "num_hidden_layers": 2,
            "hidden_size": 96,
            "head_dim": 16,
            **model,
        },
        "data": {"mix": mix},
        "training": {"micro_batch_size": 4, "global_batch_size": 8, "train_steps": 4},
    }
    path = folder / "train.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    ("model", "stage", "message"),
    [
        ({"num_experts_per_tok": 9}, 2, "model.num_experts_per_tok: 9 is more than num_experts 8"),
        ({"expert_parallel": 2}, 2, "model.expert_parallel: 2 does not divide the data-parallel size 1"),
        (
            {"expert_parallel": 1, "moe_capacity_factor": 1.25},
            2,
            "DeepSpeed's expert-parallel layer is dropless",
        ),
        ({"expert_parallel": 1}, 0, "model.expert_parallel: needs ZeRO stage 1, 2 or 3"),
        ({"num_experts": 0}, 2, "model.moe_intermediate_size: only for mixture-of-experts models"),
        ({"dense_init": True}, 2, "[num_experts]: 0 but the model config has 8"),
    ],
    ids=["top-k", "ep-world", "ep-capacity", "ep-zero0", "dense-with-moe-fields", "moe-preset-dense-weights"],
)
def test_bad_moe_config_fails_before_compute(byte_data, tmp_path, cli_env, model, stage, message):
    if model.pop("dense_init", False):
        model["init_from"] = str(_dense_hf_folder(tmp_path))
    config = _write_config(tmp_path, byte_data["mix"], **model)
    ds = ROOT / f"configs/deepspeed/zero{stage}.json"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmtools.cli.train",
            str(config),
            "--deepspeed",
            str(ds),
            "-o",
            str(tmp_path / "run"),
        ],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llm-train: error: "), out.stderr
    assert message in lines[0]
    assert not (tmp_path / "run").exists()


def _dense_hf_folder(tmp_path: Path) -> Path:
    """A dense model of the tiny MoE's attention shape, as a Hugging Face folder (config.json is what is read)."""
    from llmtools.model.config import ModelConfig
    from llmtools.model.hf_config import to_hf_config

    dense = ModelConfig(**DENSE_TWIN)
    folder = tmp_path / "dense-hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(to_hf_config(dense)))
    return folder


def test_dense_checkpoint_into_a_moe_run_is_refused(one_rank, byte_data, tmp_path):
    """--resume with a checkpoint of another shape: refused naming the field, before a step runs."""
    from llmtools.errors import InputError
    from llmtools.train.deepspeed_config import load_ds_config
    from llmtools.train.loop import RunOptions, train
    from tests.train.conftest import tiny_config

    dense = tmp_path / "dense"
    twin = {f"model__{key}": value for key, value in DENSE_TWIN.items()}
    train(
        tiny_config(byte_data["mix"], training__train_steps=1, checkpoint__save_every=1, **twin),
        load_ds_config(ROOT / "configs/deepspeed/zero2.json"),
        RunOptions(run_dir=dense, quiet=True),
    )
    with pytest.raises(InputError, match=r"model\.num_experts\]: checkpoint has 0, the config has 4"):
        train_once(byte_data["mix"], tmp_path / "moe", 2, resume=str(dense / "checkpoints" / "step_00000001"))
    with pytest.raises(InputError, match="saved without expert parallelism"):
        train_once(
            byte_data["mix"],
            tmp_path / "moe2",
            2,
            resume=str(one_rank / "zero2" / "checkpoints" / "step_00000006"),
            expert_parallel=1,
        )


def test_llm_ckpt_verifies_and_inspects_an_expert_parallel_checkpoint(two_ranks, cli_env):
    from llmtools.model.presets import load_model_config

    path = two_ranks / "ep2-zero2" / "checkpoints" / "step_00000012"
    command = [sys.executable, "-m", "llmtools.cli.ckpt"]
    verified = subprocess.run([*command, "verify", str(path)], env=cli_env, capture_output=True, text=True)
    assert verified.returncode == 0, verified.stderr
    shown = subprocess.run(
        [*command, "inspect", str(path), "--json"], env=cli_env, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    info = json.loads(shown.stdout)
    meta = json.loads((path / "meta.json").read_text())
    assert info["num_parameters"] == load_model_config(meta["model"]).num_parameters()
    assert info["master_weights"]["kind"].startswith("expert-parallel (2 ranks")


def test_init_from_an_expert_parallel_checkpoint(two_ranks, tmp_path):
    """model.init_from names an expert-parallel checkpoint: the weights arrive under the model's names."""
    import torch

    from llmtools.ckpt.convert import to_hf
    from llmtools.ckpt.init_from import load_init_weights
    from llmtools.model.hf import load_hf_model
    from llmtools.model.llama import LlamaForCausalLM
    from llmtools.train.plan import resolve_model_config

    path = two_ranks / "ep2-zero2" / "checkpoints" / "step_00000012"
    config = resolve_model_config(moe_config(_mix_of(two_ranks / "ep2-zero2")))
    model = LlamaForCausalLM(config)
    load_init_weights(model, str(path))
    exported = load_hf_model(to_hf(path, tmp_path / "hf"))
    for (name, mine), theirs in zip(model.state_dict().items(), exported.state_dict().values(), strict=True):
        assert torch.equal(mine, theirs), name
    assert not list(path.parent.glob("*.tmp-*"))
