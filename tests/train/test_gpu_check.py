"""benchmarks/gpu_check.py end to end on CPU (--cpu-smoke): the GPU check's code cannot rot unseen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# llm-train's loop, the baseline, the MoE step and document masking (run where this build has it, else
# recorded as not available). The other variants differ only in the flags they pass; training.compile's
# own cost and correctness are tests/train/test_compile.py's, so no compile is paid for here.
VARIANTS = ["zero0-eager", "hf-deepspeed-zero2", "zero2-eager-docmask", "moe-zero2-eager"]


def test_cpu_smoke_writes_the_documented_report(tmp_path):
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/gpu_check.py"), "--cpu-smoke", "--out", str(tmp_path / "out"),
         "--only", ",".join(VARIANTS)],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "out/gpu_check.json").read_text())
    assert report["format"] == "llmtools.gpu-check" and report["version"] == 1
    assert report["baseline"] == "hf-deepspeed-zero2" and report["setup"]["preset"] == "tiny"
    assert report["environment"]["device"] == "cpu" and report["environment"]["peak_bf16_tflops"] is None
    results = report["results"]
    assert set(results) == set(VARIANTS)
    docmask = results.pop("zero2-eager-docmask")
    assert docmask["status"] == "ok" or docmask == {
        "status": "skipped",
        "error": "not available in this build",
    }
    for name, r in results.items():
        assert r["status"] == "ok", (name, r)
        assert r["tokens_per_s"] > 0 and r["mfu"] is None  # no peak is known for a CPU: no MFU is made up
        assert len(r["losses"]) == report["setup"]["warmup"] + report["setup"]["steps"]
        assert all(5.0 < loss < 7.5 for loss in r["losses"]), (name, r["losses"])  # ~ln(512) at the start
    table = (tmp_path / "out/gpu_check.md").read_text()
    assert "| hf-deepspeed-zero2 |" in table and "1.00x" in table and "| moe-zero2-eager |" in table
    assert str(tmp_path / "out/gpu_check.json") in proc.stdout
