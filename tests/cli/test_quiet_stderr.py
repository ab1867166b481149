"""stderr carries our lines and real warnings only: a tiny real ``llm-train`` on a machine without a GPU and
``llm-ckpt eval`` of its checkpoint, both run from a folder outside any git repository and without
``DS_ACCELERATOR`` set, print neither DeepSpeed's CPU banner nor git's complaint (lm-eval asks git for the
working folder's commit)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.train.conftest import SEQ, TINY, write_byte_prefix

BIN = Path(sys.executable).parent
NOISE = ("Setting accelerator to CPU", "not a git repository")


def test_llm_train_and_llm_ckpt_eval_print_no_foreign_noise(tmp_path, cli_env, shared_data):
    pytest.importorskip("lm_eval")
    pytest.importorskip("transformers")
    from llmtools.data import mix as mixlib

    if shutil.which("git"):  # the folder must really be outside a repository, or git stays quiet anyway
        inside = subprocess.run(["git", "rev-parse"], cwd=tmp_path, capture_output=True)
        assert inside.returncode != 0
    prefix = write_byte_prefix(shared_data("tinyshakespeare/input.jsonl"), tmp_path / "sh_text_document", 200)
    plan = mixlib.build_plan(
        mixlib.MixConfig(
            blend=mixlib.Blend([str(prefix)], [1.0]), seq_length=SEQ, num_samples=64, valid_samples=8,
            test_samples=0, split="98,2,0",
        )
    )  # fmt: skip
    mixlib.save_plan(plan, tmp_path / "mix.json")
    config = {
        "model": {"preset": "tiny", **TINY, "num_hidden_layers": 1},
        "data": {"mix": str(tmp_path / "mix.json")},
        "training": {"micro_batch_size": 4, "global_batch_size": 4, "train_steps": 2},
        "schedule": {"warmup_steps": 1, "total_steps": 2},
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    env = {k: v for k, v in cli_env.items() if k != "DS_ACCELERATOR"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # a machine without a GPU, even where the tests run on one
    zero1 = Path(__file__).resolve().parents[2] / "configs" / "deepspeed" / "zero1.json"
    train = subprocess.run(
        [str(BIN / "llm-train"), "train.yaml", "--deepspeed", str(zero1), "-o", "run"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert train.returncode == 0, train.stderr[-3000:]
    assert "step      2/2" in train.stderr  # our lines are there
    for noise in NOISE:
        assert noise not in train.stderr, train.stderr

    (tmp_path / "t.jsonl").write_text(json.dumps({"context": "To be", "choices": [" or", " and"], "gold": 0}) + "\n")
    evaluate = subprocess.run(
        [str(BIN / "llm-ckpt"), "eval", "run", "--tasks", "t.jsonl", "--tokenizer", "byte"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert evaluate.returncode == 0, evaluate.stderr[-3000:]
    assert "acc" in json.loads(evaluate.stdout)["results"]["t"]
    for noise in NOISE:
        assert noise not in evaluate.stderr, evaluate.stderr
