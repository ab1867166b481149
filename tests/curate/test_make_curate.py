"""``make curate``: the embedded sample corpus through filter, dedup and decontaminate, for real, each step
reading what the one before kept and saying in its stats what it kept and removed."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_make_curate_runs_every_step_and_prints_their_stats(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("needs GNU make")
    out = tmp_path / "curate"
    done = subprocess.run(
        ["make", "-s", "-o", ".venv/.setup-stamp", "-o", "setup", "curate", f"CURATE_OUT={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    filtered = json.loads((out / "clean.jsonl.stats.json").read_text())
    deduped = json.loads((out / "dedup/stats.json").read_text())["sources"]["corpus"]
    curated = json.loads((out / "curated.jsonl.stats.json").read_text())
    assert filtered["command"] == "filter" and filtered["documents"]["removed"] > 0
    assert set(filtered["rules"]) >= {"length.min_chars"}
    assert deduped["documents"] == filtered["documents"]["kept"]
    assert curated["command"] == "decontaminate"
    assert curated["documents"]["in"] == deduped["kept"]
    kept = (out / "curated.jsonl").read_bytes().splitlines()
    assert len(kept) == curated["documents"]["kept"] > 0
    for stats in (filtered, curated):  # make prints each step's stats
        assert f'"command": "{stats["command"]}"' in done.stdout
    assert '"format": "llmtools.dedup-stats"' in done.stdout
