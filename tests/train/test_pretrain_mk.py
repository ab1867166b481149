"""``make pretrain``: the chain of targets and their commands (dry run; the real run is `make pretrain`)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def dry_run(*variables: str) -> list[str]:
    if shutil.which("make") is None:
        pytest.skip("needs GNU make")
    out = subprocess.run(
        ["make", "-n", "-o", ".venv/.setup-stamp", "-o", "setup", "pretrain", *variables],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.splitlines() if not line.startswith(("echo", "cat "))]


def test_default_chain(tmp_path):
    lines = dry_run(f"OUT={tmp_path}/p")
    order = [
        "llm-prep sample-corpus",
        "llm-prep tokenizer train",
        "llm-prep json2bin",
        "llm-mix",
        "llm-train",
        "llm-ckpt verify",
        "llm-ckpt convert",
        "llm-log summary",
        "llm-log plot",
        "llm-prep sample-task",
        "llm-ckpt eval",
    ]
    text = "\n".join(lines)
    for name in order:
        assert name in text, name
    first = {name: text.index(name) for name in order[:5]}
    assert list(first) == sorted(first, key=first.get)  # corpus -> tokenizer -> json2bin -> mix -> train
    assert text.count("llm-prep json2bin") == 2  # two sources
    train = next(line for line in lines if "llm-train" in line)
    assert "configs/train/tiny.yaml --deepspeed configs/deepspeed/zero2.json" in train
    assert f"-o {tmp_path}/p/run" in train and f"data.mix={tmp_path}/p/mix.json" in train
    assert "--weights 0.7,0.3" in text


def test_variables_point_it_at_real_data(tmp_path):
    a, b = tmp_path / "web.jsonl", tmp_path / "code.jsonl.gz"
    a.write_text('{"text": "x"}\n')
    b.write_bytes(b"")
    lines = dry_run(
        f"OUT={tmp_path}/p",
        f"CORPUS={a} {b}",
        "WEIGHTS=0.6,0.4",
        "NPROC=2",
        "DS=configs/deepspeed/zero3.json",
        "CONFIG=configs/train/tiny.yaml",
        "RESUME=auto",
    )
    text = "\n".join(lines)
    assert "sample-corpus" not in text
    assert "llm-ckpt eval" not in text  # the downstream task is built like the built-in corpus only
    assert f"json2bin {a}" in text and f"-o {tmp_path}/p/data/web " in text
    assert f"json2bin {b}" in text and f"-o {tmp_path}/p/data/code " in text
    assert "--weights 0.6,0.4" in text
    train = next(line for line in lines if "llmtools.cli.train" in line)
    assert "torchrun --nproc_per_node 2" in train and "zero3.json" in train and "--resume auto" in train
