"""What ``llm-train`` says of LoRA: the start line counts the trainable parameters against all of them as
peft's ``print_trainable_parameters`` does (the same model, the same adapters, the same numbers), and a run
that starts from a LoRA run's checkpoint says in one line that it merges the adapters."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from tests.train.tasks.test_sft import make_sft_prefix
from tests.train.test_cli import DS
from tests.train.test_lora import lora_config

pytest.importorskip("deepspeed")


@pytest.fixture(scope="module")
def lora_cli_run(tmp_path_factory):
    """A two-step LoRA run through llm-train, from a Hugging Face base folder."""
    import torch

    from llmtools.model import LlamaForCausalLM
    from llmtools.model.hf import save_hf_folder
    from llmtools.train.plan import resolve_model_config
    from tests.train.tasks.test_sft import sft_config

    folder = tmp_path_factory.mktemp("lora-lines")
    prefix = make_sft_prefix(folder, "chat", pack=False, n=32)
    shape = resolve_model_config(sft_config(prefix))
    torch.manual_seed(3)
    save_hf_folder(LlamaForCausalLM(shape), shape, folder / "base")
    config = folder / "lora.yaml"
    raw = lora_config(prefix, str(folder / "base"), training__train_steps=2, schedule__total_steps=2).to_dict()
    config.write_text(yaml.safe_dump(raw))
    out = train_cli([config, "--deepspeed", DS, "-o", folder / "run"])
    assert out.returncode == 0, out.stderr
    return {"folder": folder, "config": config, "raw": raw, "stderr": out.stderr, "prefix": prefix}


def train_cli(args):
    import os

    from tests.conftest import REPO

    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("LLMTOOLS_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "llmtools.cli.train", *map(str, args)],
        env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip


def test_the_start_line_counts_trainable_and_all_parameters_as_peft_does(lora_cli_run):
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    (line,) = [x for x in lora_cli_run["stderr"].splitlines() if x.startswith("training ")]
    found = re.match(r"training ([\d,]+) of ([\d,]+) parameters \(trainable% ([\d.]+): LoRA", line)
    assert found, line
    trainable, total = (int(found[i].replace(",", "")) for i in (1, 2))

    lora = lora_cli_run["raw"]["lora"]
    base = transformers.AutoModelForCausalLM.from_pretrained(lora_cli_run["folder"] / "base")
    model = peft.get_peft_model(
        base,
        peft.LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], target_modules=lora["target_modules"]),
    )
    theirs = model.get_nb_trainable_parameters()
    assert (trainable, total) == theirs, (line, theirs)
    assert found[3] == f"{100 * theirs[0] / theirs[1]:.4f}"  # print_trainable_parameters' trainable%


def test_init_from_a_lora_run_says_it_merges_the_adapters(lora_cli_run, tmp_path):
    raw = dict(lora_cli_run["raw"], lora=None)
    raw["training"] = {**raw["training"], "train_steps": 1}
    raw["schedule"] = {**raw["schedule"], "total_steps": 1}
    raw["model"] = {"preset": None, "init_from": str(lora_cli_run["folder"] / "run")}
    config = tmp_path / "full.yaml"
    config.write_text(yaml.safe_dump(raw))
    out = train_cli([config, "--deepspeed", DS, "-o", tmp_path / "full"])
    assert out.returncode == 0, out.stderr
    merged = [x for x in out.stderr.splitlines() if "are merged into" in x]
    assert len(merged) == 1, out.stderr
    lora = lora_cli_run["raw"]["lora"]
    assert merged[0].startswith(f"init_from: {lora_cli_run['folder'] / 'run' / 'checkpoints'}")
    assert f"r={lora['r']}, alpha={lora['alpha']:g}, on {', '.join(lora['target_modules'])}" in merged[0]
    # a run without adapters trains every parameter, and says no more than that
    assert re.search(r"^training [\d,]+ parameters for 1 steps", out.stderr, re.M), out.stderr
    # from a Hugging Face folder nothing is merged, and nothing is said
    raw["model"] = {"preset": None, "init_from": str(lora_cli_run["folder"] / "base")}
    config.write_text(yaml.safe_dump(raw))
    plain = train_cli([config, "--deepspeed", DS, "-o", tmp_path / "plain"])
    assert plain.returncode == 0, plain.stderr
    assert "merged" not in plain.stderr
