"""MoE routing collapse is a health signal, not only a metric: most experts idle or most token
assignments dropped in a logging window warns (an event and a stderr line) or, with
``health.moe_collapse_action: stop``, stops with a checkpoint. The real ``llm-train`` on the tiny MoE
preset, with experts' capacity cut so that most assignments are dropped."""

from __future__ import annotations

import json

from llmtools.train.config_sections import HealthSection
from llmtools.train.health import routing_collapse
from tests.train.conftest import TINY
from tests.train.test_exactness import llm_train, write_config


def test_a_collapsed_router_stops_the_run_with_a_checkpoint(byte_data, tmp_path):
    settings = {"model": {"preset": "tiny-moe", **TINY, "moe_capacity_factor": 0.1},
                "health": {"moe_collapse_action": "stop"}, "training": {"train_steps": 4}}  # fmt: skip
    run = tmp_path / "run"
    stopped = llm_train(write_config(tmp_path / "c.yaml", byte_data["mix"], settings), run, timeout=300)
    text = stopped.stderr.decode()
    assert stopped.returncode == 1, text[-3000:]
    assert "stopped at step 1: health.moe_collapse_action=stop (MoE routing collapse in layer" in text
    assert "of token assignments dropped" in text and (run / "checkpoints" / "step_00000001").is_dir()
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events if e["kind"] == "event"][-3:] == ["moe_collapse", "checkpoint", "stop"]


def test_idle_experts_and_dropped_tokens_are_a_collapse():
    health = HealthSection()
    even = {"layer": 0, "load": [0.25] * 4, "dropped": 0.0}
    idle = {"layer": 1, "load": [0.97, 0.01, 0.01, 0.01], "dropped": 0.0}  # 3 of 4 experts under 1/40
    dropping = {"layer": 2, "load": [0.25] * 4, "dropped": 0.6}
    assert routing_collapse([even], health) is None
    assert routing_collapse([even, idle], health).startswith(
        "MoE routing collapse in layer 1: 3 of 4 experts idle"
    )
    assert "60% of token assignments dropped" in routing_collapse([dropping], health)
    assert routing_collapse([idle, dropping], HealthSection(moe_collapse_action="off")) is None
