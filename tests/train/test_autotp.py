"""Tensor parallelism: DeepSpeed AutoTP training runs on the CPU accelerator over gloo (the finding the
llm-train integration builds on; llm-train itself: ``tests/train/test_tensor_parallel.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.train.test_cli import free_port

WORKER = Path(__file__).with_name("autotp_worker.py")


@pytest.mark.parametrize("stage", ["1", "2"])
def test_deepspeed_autotp_shards_our_decoder_over_gloo_and_keeps_its_loss(cli_env, stage):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(free_port()), str(WORKER)]  # fmt: skip
    out = subprocess.run(cmd, env={**cli_env, "STAGE": stage}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    for r in ranks:
        assert r["q_proj"] == [48, 96]  # 6 heads x 16 split over 2 ranks: the weight is sharded
        # fp32; each rank sums half of every projection's inputs, then an all-reduce: a few ulps
        assert abs(r["loss"] - r["expected"]) < 1e-5
