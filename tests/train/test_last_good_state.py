"""The last good state a divergence's stop names is good, and it is kept.

A learning rate at the top of its range makes the run diverge (the config's fault, not the data's). The
newest checkpoint then holds updates made on the way there; the stop must name instead the newest
checkpoint whose weights then passed a health-checked step, and pruning (``keep_last: 1``) must not
have removed it. Through the real ``llm-train``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.train.test_exactness import llm_train, write_config

BOUND = 240  # seconds: a process start and a dozen tiny steps take ~15 s on a loaded machine


def test_a_divergence_names_a_last_good_state_that_passed_the_gate_and_was_kept(byte_data, tmp_path):
    settings = {"optimizer": {"lr": 1.0}, "schedule": {"kind": "constant", "warmup_steps": 0},
                "health": {"loss_spike_factor": 1.5, "spike_window": 2, "spike_action": "stop"},
                "checkpoint": {"save_every": 1, "keep_last": 1}, "training": {"train_steps": 12}}  # fmt: skip
    config = write_config(tmp_path / "train.yaml", byte_data["mix"], settings)
    run = tmp_path / "run"
    stopped = llm_train(config, run, timeout=BOUND)
    text = stopped.stderr.decode()
    assert stopped.returncode == 1, text[-3000:]
    assert "the cause is the config or the state" in text, text[-3000:]
    stop = int(text.split("stopped at step ")[1].split(":")[0])
    named = re.search(r"the last good state is (\S+), whose weights then passed", text)
    assert named, text[-3000:]
    good = Path(named.group(1))
    good_step = int(good.name.removeprefix("step_"))
    assert f"--resume {good_step} --rollback" in text
    # the newest checkpoint (saved after step stop - 1) held the update that led to the divergence
    assert good_step == stop - 2, (good_step, stop)
    assert good.is_dir() and json.loads((good / "meta.json").read_text())["complete"] is True
    # keep_last 1 keeps the newest; the good one is kept beside it, the older ones are pruned
    kept = sorted(p.name for p in (run / "checkpoints").glob("step_*"))
    assert kept == [f"step_{good_step:08d}", f"step_{stop - 1:08d}"], kept
    # the step after the good state passed the gate: no health event there, one at the stop
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    flagged = {
        r["step"] for r in records if r["kind"] == "event" and r["event"] in ("nan", "spike", "loss_spike")
    }
    assert good_step + 1 not in flagged and stop in flagged, flagged
