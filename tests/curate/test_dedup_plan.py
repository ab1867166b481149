"""`llm-prep dedup --explain --plan-tokens`: the stage plan of a big corpus, scaled from a real run over
the sample given (its stats and files), through the console script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.curate.dedup_corpus import write_corpus

BIN = Path(sys.executable).parent


def _prep(*args, cwd, code=0):
    proc = subprocess.run(
        [str(BIN / "llm-prep"), "dedup", *map(str, args)], cwd=cwd, capture_output=True, text=True
    )
    assert proc.returncode == code, proc.stderr
    return proc


def test_plan_is_the_sample_run_scaled(tmp_path):
    write_corpus(tmp_path / "corpus", files=3, per_similarity=2)
    inputs = sorted(map(str, (tmp_path / "corpus").glob("*.jsonl")))
    record = json.loads(_prep("--explain", "--plan-tokens", "15T", "--tasks", "1000", *inputs, "--json",
                              cwd=tmp_path).stdout)["plan"]  # fmt: skip
    _prep(*inputs, "-o", "run", "-q", cwd=tmp_path)  # the same run, kept, to compare with
    stats = json.loads((tmp_path / "run" / "stats.json").read_text())["sources"]["corpus"]
    sample = record["sample"]
    assert (sample["documents"], sample["removed"], sample["bytes"]) == (
        stats["documents"], stats["removed"], stats["bytes"])  # fmt: skip
    signatures = sum(p.stat().st_size for p in (tmp_path / "run" / "work" / "sig").rglob("*") if p.is_file())
    pairs = (
        sum(p.stat().st_size for p in (tmp_path / "run" / "work" / "pairs").rglob("*") if p.is_file()) // 16
    )
    assert (sample["signature_bytes"], sample["pairs"]) == (signatures, pairs) and pairs > 0
    scale = 15e12 * 4 / stats["bytes"]
    stages = record["stages"]
    assert record["corpus"]["documents"] == int(stats["documents"] * scale)
    assert stages["signatures"]["tasks"] == stages["apply"]["tasks"] == 1000
    assert stages["signatures"]["read_per_task"] == 60_000_000_000
    assert stages["signatures"]["write_per_task"] == int(signatures * scale / 1000)
    assert stages["buckets"]["tasks"] == 15 and stages["clusters"]["tasks"] == 1  # 14 bands + exact
    assert stages["clusters"]["memory_per_task"] == int(pairs * scale * 180)
    text = _prep("--explain", "--plan-tokens", "15T", "--tasks", "1000", *inputs, cwd=tmp_path).stdout
    assert "60.0 TB" in text and "so at most 15 tasks" in text and "signatures   1,000      60.0 GB" in text
    refused = _prep("--explain", "--plan-tokens", "15T", cwd=tmp_path, code=2)
    assert "give INPUT files" in refused.stderr and refused.stderr.count("\n") == 1
