"""The change a stop advises can be made: its ``--resume`` and ``--set`` taken as printed are accepted by
the resume policy (announced, not refused), and they address the cause. Through the real ``llm-train``,
for each stop that advises a change: a routing collapse from a capacity limit (more capacity, which a
resumed run may change: no parameter depends on it) and a divergence the config caused (a lower learning
rate, from the last good state)."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from tests.train.conftest import TINY
from tests.train.test_exactness import llm_train, write_config

BOUND = 300

CASES = {
    "moe-capacity": (
        {"model": {"preset": "tiny-moe", **TINY, "moe_capacity_factor": 0.1},
         "health": {"moe_collapse_action": "stop"}},
        "model.moe_capacity_factor",
    ),  # fmt: skip
    "config-divergence": (
        {"optimizer": {"lr": 1.0}, "schedule": {"kind": "constant", "warmup_steps": 0},
         "health": {"loss_spike_factor": 1.5, "spike_window": 2, "spike_action": "stop"},
         "checkpoint": {"save_every": 1}},
        "optimizer.lr",
    ),  # fmt: skip
}


def advice(line: str) -> list[str]:
    """The arguments a stop's line tells to add: ``--resume X [--rollback] [--set K=V ...]``."""
    found = re.search(r"(--resume \S+(?: --rollback)?(?: --set \S+=[^\s,;()]+)*)", line)
    assert found, line
    return shlex.split(found.group(1))


def _dropped(run) -> list[float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [max(layer["dropped"] for layer in r["moe_layers"]) for r in records if r["kind"] == "train"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_stop_advises_a_change_the_resume_policy_accepts(byte_data, tmp_path, case):
    settings, key = CASES[case]
    settings = {**settings, "training": {"train_steps": 12}}
    config = write_config(tmp_path / "train.yaml", byte_data["mix"], settings)
    run = tmp_path / "run"
    stopped = llm_train(config, run, timeout=BOUND)
    err = stopped.stderr.decode()
    assert stopped.returncode == 1, err[-3000:]
    args = advice(err.strip().splitlines()[-1])
    assert "--set" in args and args[args.index("--set") + 1].startswith(f"{key}="), args
    if case == "moe-capacity":
        before = _dropped(run)
    resumed = llm_train(config, run, *args, timeout=BOUND)
    text = resumed.stderr.decode()
    assert resumed.returncode != 2 and "resumed from" in text, text[-3000:]
    assert f"resume: {key}" in text, text[-3000:]  # the change is applied and announced
    if case == "moe-capacity":  # more capacity: fewer assignments dropped than at the stop
        after = _dropped(run)[len(before):]
        assert after and max(after) < before[-1], (before, after)
