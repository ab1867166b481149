"""Shared fixtures. Real corpora and tokenizers come from ../shared/data (never copied into the repo)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("LLMTOOLS_SHARED_DATA", REPO.parent / "shared" / "data"))

# Keep CPU tests deterministic and quiet on 2 cores.
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def shared(relative: str) -> Path:
    """A path under ../shared/data, or skip the test with a clear reason when it is absent."""
    path = SHARED_DATA / relative
    if not path.exists():
        pytest.skip(f"needs {path} (the shared data folder beside the repo; always present in CI)")
    return path


@pytest.fixture
def shared_data():
    return shared


@pytest.fixture
def cli_env():
    """Environment for subprocess CLI tests: the checkout on the path, debug tracebacks off."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("LLMTOOLS_DEBUG", None)
    return env


@pytest.fixture
def python():
    return sys.executable


def run_cli_inproc(capsys, monkeypatch, command: str, *args):
    """Run ``llm-<command>`` in this process through its real ``main`` (argument parsing and the error
    model included): much faster than a subprocess. Returns a CompletedProcess-like result."""
    import importlib
    import subprocess

    main = importlib.import_module(f"llmtools.cli.{command}").main
    capsys.readouterr()  # drop what the test's own set-up printed
    monkeypatch.setattr(sys, "argv", [f"llm-{command}", *map(str, args)])
    with pytest.raises(SystemExit) as exit_info:
        main()
    out = capsys.readouterr()
    code = exit_info.value.code
    return subprocess.CompletedProcess(args, 0 if code is None else code, out.out, out.err)
