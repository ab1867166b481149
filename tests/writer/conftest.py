"""Fixtures for the one-writer and resume-policy tests: real processes over a small byte-level mix.

``base_run`` trains the tiny model for 4 steps once per session (checkpoints at steps 2 and 4); each test
copies it (``run_copy``) and starts ``llm-train`` / ``llm-ckpt`` / ``llm-prep`` as real processes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, shared

STEPS = 4
SAVE_EVERY = 2


def cli(name: str) -> list[str]:
    """The console script of ``llm-NAME`` run from this checkout (python -m, so no install is needed)."""
    return [sys.executable, "-m", f"llmtools.cli.{name}"]


def env() -> dict:
    out = dict(os.environ)
    out["PYTHONPATH"] = str(REPO) + os.pathsep + out.get("PYTHONPATH", "")
    out.update({"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
    out.pop("LLMTOOLS_DEBUG", None)
    return out


def run(args: list, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, env=env(), timeout=timeout, **kwargs
    )


def snapshot(folder: Path) -> dict[str, tuple[int, int, str]]:
    """Every file under ``folder``: size, mtime (ns) and sha256, to prove nothing was touched."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            stat = path.stat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            out[path.relative_to(folder).as_posix()] = (stat.st_size, stat.st_mtime_ns, digest)
    return out


def records(run_dir: Path, kind: str | None = None) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if kind is None or r["kind"] == kind]


@pytest.fixture(scope="session")
def byte_mix(tmp_path_factory) -> Path:
    """A mix of two real corpora in byte tokens: seq 32, 400 train samples (no valid split)."""
    from llmtools.data import mix as mixlib
    from tests.train.conftest import write_byte_prefix

    folder = tmp_path_factory.mktemp("writer-data")
    a = write_byte_prefix(shared("tinyshakespeare/input.jsonl"), folder / "shakespeare_text_document", 400)
    b = write_byte_prefix(shared("wikitext-2/valid.jsonl"), folder / "wiki_text_document", 400)
    config = mixlib.MixConfig(
        blend=mixlib.Blend([str(a), str(b)], [0.7, 0.3]), seq_length=32, num_samples=400, split="100,0,0"
    )
    mix_path = folder / "mix.json"
    mixlib.save_plan(mixlib.build_plan(config), mix_path)
    return mix_path


def write_config(path: Path, mix: Path, **sections) -> Path:
    """A tiny train config (the tiny preset shrunk, 4 steps, checkpoints every 2) with overrides."""
    import yaml

    config = {
        "model": {"preset": "tiny", "vocab_size": 320, "num_hidden_layers": 2, "hidden_size": 64,
                  "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2},
        "data": {"mix": str(mix)},
        "training": {"micro_batch_size": 4, "global_batch_size": 8, "train_steps": STEPS, "seed": 1234},
        "optimizer": {"lr": 3e-3, "weight_decay": 0.1},
        "schedule": {"kind": "cosine", "warmup_steps": 2, "total_steps": 48},
        "logging": {"log_every": 1},
        "checkpoint": {"save_every": SAVE_EVERY},
    }  # fmt: skip
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def train_args(config: Path, run_dir: Path, stage: int = 2, *extra) -> list:
    return [*cli("train"), config, "--deepspeed", REPO / f"configs/deepspeed/zero{stage}.json", "-o", run_dir,
            *extra]  # fmt: skip


@pytest.fixture(scope="session")
def base_run(tmp_path_factory, byte_mix) -> tuple[Path, Path]:
    """(run folder, its train config): 4 steps of ZeRO-2, checkpoints at steps 2 and 4. Copy before use."""
    root = tmp_path_factory.mktemp("writer-base")
    config = write_config(root / "train.yaml", byte_mix)
    run_dir = root / "run"
    done = run(train_args(config, run_dir), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir, config


@pytest.fixture
def run_copy(base_run, tmp_path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(base_run[0], run_dir)
    return run_dir
