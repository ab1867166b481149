"""Under sequence parallelism the two ranks of a group read the same samples: a quarantine names them
once, for the group, not once per rank. The real ``llm-train`` on two ranks (torchrun), a NaN injected
into one step's loss on both ranks (tests/train/hooks)."""

from __future__ import annotations

import json
import os

from tests.train.parallel_runs import torchrun_train
from tests.train.test_cli import write_config
from tests.train.test_exactness import HOOKS


def test_a_sequence_parallel_group_quarantines_each_sample_once(byte_data, tmp_path, cli_env):
    config = write_config(tmp_path, byte_data["mix"], parallel={"sequence": 2}, health={"nan_action": "skip"},
                          training={"train_steps": 4}, checkpoint={"save_every": 0})  # fmt: skip
    env = {**cli_env, "LLMTOOLS_TEST_INJECT": "nan@3"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HOOKS), env.get("PYTHONPATH", "")) if p)
    run = tmp_path / "run"
    torchrun_train(config, 2, run, env)
    records = [json.loads(line) for line in (run / "quarantine.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [3], records
    positions = [s["position"] for r in records for s in r["samples"]]
    assert positions and len(positions) == len(set(positions)), positions
