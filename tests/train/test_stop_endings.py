"""Every stop of a run goes through one ending: the background save in flight is finished (or abandoned),
and only then are checkpoints named, each of which exists and verifies; ``latest`` names one that exists;
nothing half-written stays behind; the stop is the last event. A matrix of stop kinds x background saves
on and off, through the real ``llm-train`` (a checkpoint after every step, so a save is in flight at
every stop when saves run in the background); the faults are provoked by tests/train/hooks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from llmtools.ckpt import layout
from llmtools.ckpt.verify import verify
from tests.train.conftest import TINY
from tests.train.test_exactness import llm_train, write_config

BOUND = 300

# kind: (settings, llm_train's keyword arguments, exit code, words of the message)
KINDS = {
    "signal": ({}, {"stop_at": 3}, 143, "stopped by SIGTERM: saved"),
    "nan": ({"health": {"nan_action": "stop"}}, {"inject": "nan@3"}, 1, "health.nan_action=stop"),
    "update-spike": (
        {"health": {"update_spike_factor": 5.0, "spike_window": 2, "update_spike_action": "stop"}},
        {"inject": "update@5"}, 1, "health.update_spike_action=stop",
    ),  # fmt: skip
    "config-divergence": (
        {"optimizer": {"lr": 1.0}, "schedule": {"kind": "constant", "warmup_steps": 0},
         "health": {"loss_spike_factor": 1.5, "spike_window": 2, "spike_action": "stop"}},
        {}, 1, "the cause is the config or the state",
    ),  # fmt: skip
    "moe-collapse": (
        {"model": {"preset": "tiny-moe", **TINY, "moe_capacity_factor": 0.1},
         "health": {"moe_collapse_action": "stop"}},
        {}, 1, "health.moe_collapse_action=stop",
    ),  # fmt: skip
    "error": ({}, {"inject": "error@4"}, 1, "injected failure at step 4"),
}


@pytest.mark.parametrize("background", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_stop_names_only_checkpoints_that_exist_and_verify(byte_data, tmp_path, kind, background):
    settings, options, code, words = KINDS[kind]
    settings = {**settings, "training": {"train_steps": 12},
                "checkpoint": {"save_every": 1, "save_final": True, "async": background}}  # fmt: skip
    run = tmp_path / "run"
    done = llm_train(write_config(tmp_path / "train.yaml", byte_data["mix"], settings), run, timeout=BOUND,
                     **options)  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == code, err[-3000:]
    assert words in err and "Traceback" not in err and "I/O operation on closed file" not in err, err[-3000:]
    ckpts = run / "checkpoints"
    tail = err.strip().splitlines()[-1]
    named = {Path(p.rstrip(".")) for p in re.findall(r"([^\s();,]*checkpoints/step_\d{8}[^\s();,]*)", tail)}
    if kind != "error":
        assert named, tail
    for path in named:  # every checkpoint the stop names exists, complete, and verifies
        assert path.name.startswith("step_") and ".tmp" not in path.name, tail
        assert verify(path).ok, (path, tail)
    assert not layout.leftovers(ckpts), sorted(p.name for p in ckpts.iterdir())
    latest = ckpts / (ckpts / "latest").read_text().strip()
    assert verify(latest).ok, latest
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    events = [e for e in events if e["kind"] == "event"]
    if kind != "error":
        assert events[-1]["event"] == "stop", events[-3:]
        # every checkpoint an event names was committed (the event is written at the commit)
        for e in events:
            if e["event"] == "checkpoint":
                assert (Path(e["message"]) / "meta.json").is_file() or not Path(e["message"]).exists(), e
