"""``--force`` never replaces a training run: every writing command pointed at a run folder, one of its
entries or one of its checkpoints exits 2 saying so (and that only llm-train replaces a run), and the run
is byte-identical afterwards. ``--force`` replaces an earlier output of the same kind by the same command,
never one of another kind."""

from __future__ import annotations

import shutil

import pytest

from tests.trust.conftest import cli, error_line, snapshot

STEP4 = "checkpoints/step_00000004"


def _writers(run, target, trust_data):
    step = run / STEP4
    return {
        "export-hf": ("export", "hf", trust_data["prefix"], "-o", target, "--force"),
        "convert-hf": ("ckpt", "convert", step, "--to", "hf", "-o", target, "--force"),
        "convert-safetensors": ("ckpt", "convert", step, "--to", "safetensors", "-o", target, "--force"),
        "convert-universal": ("ckpt", "convert", step, "--to", "universal", "-o", target, "--force"),
    }


CASES = [
    *[(writer, "run") for writer in ("export-hf", "convert-hf", "convert-safetensors", "convert-universal")],
    ("export-hf", "entry"),
    ("convert-hf", "checkpoint"),
]


@pytest.mark.parametrize(("writer", "where"), CASES)
def test_force_never_replaces_a_run(run, run_master, env, trust_data, tmp_path, writer, where):
    other = tmp_path / "other"  # another run: a copy of the master
    shutil.copytree(run_master, other, symlinks=True)
    (other / "notes.txt").write_text("the user's notes\n")
    target = {"run": other, "entry": other / "checkpoints", "checkpoint": other / "checkpoints/step_00000002"}
    before = snapshot(other)
    proc = cli(*_writers(run, target[where], trust_data)[writer], env=env, timeout=600)
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = error_line(proc)
    assert str(target[where]) in line and "only llm-train replaces a run" in line, line
    assert snapshot(other) == before


def test_force_replaces_only_the_same_kind(run, env, tmp_path):
    step = run / STEP4
    out = tmp_path / "out"
    first = cli("ckpt", "convert", step, "--to", "hf", "-o", out, env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    before = snapshot(out)
    other = cli("ckpt", "convert", step, "--to", "universal", "-o", out, "--force", env=env)
    assert other.returncode == 2, other.stderr[-2000:]
    assert "another kind (llmtools.hf-model)" in error_line(other)
    assert snapshot(out) == before
    again = cli("ckpt", "convert", step, "--to", "hf", "-o", out, "--force", env=env)
    assert again.returncode == 0, again.stderr[-2000:]
