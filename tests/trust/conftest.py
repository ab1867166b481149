"""Fixtures for the trust tests: a tiny real run made by ``llm-train`` (checkpoints at steps 2 and 4), a
small byte-level dataset and mix, hostile pickles, and a runner for the real console commands.

Every claim here is about a process (exit code, stderr, files left or not left), so the commands run as
``python -m llmtools.cli.X`` subprocesses.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO, shared

pytest.importorskip("deepspeed")

TRAIN_YAML = """\
model: {preset: tiny, vocab_size: 320, num_hidden_layers: 1, hidden_size: 48, intermediate_size: 96}
data: {mix: MIX}
training: {micro_batch_size: 2, global_batch_size: 4, train_steps: 4, seed: 1}
optimizer: {lr: 1.0e-3}
schedule: {kind: constant, warmup_steps: 0}
logging: {log_every: 1}
checkpoint: {save_every: 2}
"""


def cli(command: str, *args, env: dict, timeout: int = 300, stdin: bytes | None = None):
    """``llm-<command> ARGS`` as a real process (text output)."""
    return subprocess.run(
        [sys.executable, "-m", f"llmtools.cli.{command}", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=REPO,
    )


def error_line(proc) -> str:
    """The one error line of a refused command (DeepSpeed's own log lines aside); no traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes: to show a refused command touched nothing."""
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"<dir>"
        for p in sorted(folder.rglob("*"))
    }


# ---------------------------------------------------------------------------------------------- data
@pytest.fixture(scope="session")
def trust_data(tmp_path_factory):
    """{"folder", "prefix" (a 300-document byte dataset), "mix" (seq 32, 400 train samples)}."""
    from llmtools.data import mix as mixlib
    from tests.train.conftest import write_byte_prefix

    folder = tmp_path_factory.mktemp("trustdata")
    prefix = write_byte_prefix(shared("tinyshakespeare/input.jsonl"), folder / "shk_text_document", 300)
    config = mixlib.MixConfig(
        blend=mixlib.Blend([str(prefix)], [1.0]),
        seq_length=32,
        num_samples=400,
        valid_samples=0,
        test_samples=0,
        split="100,0,0",
    )
    mix = folder / "mix.json"
    mixlib.save_plan(mixlib.build_plan(config), mix)
    return {"folder": folder, "prefix": prefix, "mix": mix}


@pytest.fixture(scope="session")
def train_files(trust_data, tmp_path_factory):
    """(train config, DeepSpeed config) for a 4-step ZeRO-1 run over the trust mix."""
    folder = tmp_path_factory.mktemp("trustcfg")
    config = folder / "tiny.yaml"
    config.write_text(TRAIN_YAML.replace("MIX", str(trust_data["mix"])))
    return config, REPO / "configs" / "deepspeed" / "zero1.json"


@pytest.fixture(scope="session")
def run_master(train_files, tmp_path_factory):
    """A real run (``llm-train``, ZeRO-1, fp32): checkpoints at steps 2 and 4. Read-only: copy it."""
    run = tmp_path_factory.mktemp("trustrun") / "run"
    env = _cli_env()
    config, ds = train_files
    proc = cli("train", config, "--deepspeed", ds, "-o", run, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run


@pytest.fixture
def run(run_master, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run_master, copy, symlinks=True)
    return copy


def _cli_env() -> dict:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("LLMTOOLS_DEBUG", None)
    return env


@pytest.fixture
def env():
    return _cli_env()


# ---------------------------------------------------------------------------------------------- payloads
def payload_pickle(data: bytes, marker: Path) -> bytes:
    """``data`` (a pickle whose top object is a dict) with one more item, whose value is what
    ``os.system("touch MARKER")`` returns: a plain unpickler runs the command while loading."""
    assert data.endswith(b".")
    key = b"trust"
    command = f"touch {marker}".encode()
    extra = (
        b"X" + len(key).to_bytes(4, "little") + key
        + b"cos\nsystem\n"
        + b"X" + len(command).to_bytes(4, "little") + command
        + b"\x85R"  # TUPLE1, REDUCE: os.system(command)
        + b"s"  # SETITEM on the dict below
    )  # fmt: skip
    return data[:-1] + extra + b"."


def plant_payload(pt_file: Path, marker: Path) -> None:
    """Rewrite a ``torch.save`` zip with the payload in its ``data.pkl`` (the archive otherwise equal)."""
    tmp = pt_file.with_name(pt_file.name + ".evil")
    with zipfile.ZipFile(pt_file) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("/data.pkl"):
                data = payload_pickle(data, marker)
            dst.writestr(info, data)
    tmp.replace(pt_file)


def rehash(checkpoint: Path) -> None:
    """Recompute meta.json's sizes and checksums, as whoever supplies a file can."""
    meta_path = checkpoint / "meta.json"
    meta = json.loads(meta_path.read_text())
    for name in list(meta["files"]):
        file = checkpoint / name
        if file.is_file():
            meta["files"][name] = {
                "size": file.stat().st_size,
                "sha256": hashlib.sha256(file.read_bytes()).hexdigest(),
            }
    meta_path.write_text(json.dumps(meta, indent=1))


@pytest.fixture
def marker(tmp_path):
    """The file a payload would create: it must never appear."""
    return tmp_path / "PAYLOAD_RAN"
