"""Tokens per source in metrics.jsonl: llm-log reads them, plots each source's share, writes them to TensorBoard."""

from __future__ import annotations

import json

import pytest

from llmtools.logs.plot import PANELS, SOURCE_PANELS, PlotConfig, plot_runs
from llmtools.logs.runs import collect_curves
from llmtools.logs.tb import TbConfig, convert
from tests.logs.helpers import scalars


def write_log(path, switch_at=20, steps=40, tokens_per_step=1000):
    """A run that blends wiki:code 70:30, then wiki:stories 50:50 from step ``switch_at`` on."""
    totals = {"wiki": 0, "code": 0}
    lines = []
    for step in range(1, steps + 1):
        if step <= switch_at:
            totals["wiki"] += 700
            totals["code"] += 300
        else:
            totals["wiki"] += 500
            totals["stories"] = totals.get("stories", 0) + 500
        record = {
            "kind": "train",
            "step": step,
            "time": 1000.0 + step,
            "consumed_samples": step * 8,
            "consumed_tokens": step * tokens_per_step,
            "loss": 5.0 - step / 20,
            "grad_norm": 1.0,
            "lr": 1e-3,
            "step_time_s": 0.1,
            "tokens_per_s": 10000.0,
            "mfu": None,
            "memory_mb": None,
            "source_tokens": dict(totals),
        }
        lines.append(json.dumps(record))
        if step == switch_at:
            event = {
                "kind": "event",
                "step": step,
                "time": 1000.0 + step,
                "event": "data",
                "message": "mix changed",
            }
            lines.append(json.dumps({**event, "change": "continued", "sources": {"code": "stops"}}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_share_of_each_source_is_plotted_per_window(tmp_path):
    log = write_log(tmp_path / "metrics.jsonl")
    runs, counts = collect_curves([str(log)], x="steps")
    (run,) = runs
    assert run.sources() == ["wiki", "code", "stories"]
    shares = run.shares()
    # shares are float64 ratios of sample counts: default rel=1e-6 is far above their ulps
    assert shares["wiki"][1][:3] == pytest.approx([0.7, 0.7, 0.7])
    # shares are float64 ratios of sample counts: default rel=1e-6 is far above their ulps
    assert shares["code"][1][19] == pytest.approx(0.3) and shares["code"][1][20] == pytest.approx(0.0)
    # shares are float64 ratios of sample counts: default rel=1e-6 is far above their ulps
    assert shares["stories"][1][-1] == pytest.approx(0.5) and shares["stories"][1][:20] == [0.0] * 20
    assert counts[0].by_kind["invalid"] == 0
    out = tmp_path / "curves.png"
    drawn = plot_runs(runs, PlotConfig(output=out, dpi=40))
    assert set(drawn) == set(PANELS + SOURCE_PANELS)
    assert drawn["share"] == {f"{run.name}:{name}": 40 for name in ("wiki", "code", "stories")}
    import matplotlib.image as mpimg

    assert mpimg.imread(out).shape[:2] == (12 * 40, 12 * 40)  # a third row of panels


def test_a_log_without_sources_keeps_four_panels(tmp_path):
    log = tmp_path / "m.jsonl"
    log.write_text(write_log(tmp_path / "x.jsonl").read_text().replace('"source_tokens"', '"other"'))
    runs, _ = collect_curves([str(log)])
    drawn = plot_runs(runs, PlotConfig(output=tmp_path / "c.png", dpi=40))
    assert set(drawn) == set(PANELS)


def test_tensorboard_gets_one_scalar_per_source(tmp_path):
    log = write_log(tmp_path / "metrics.jsonl")
    convert([str(log)], TbConfig(tmp_path / "tb", run="r"))
    got = scalars(tmp_path / "tb" / "r")
    assert got["train/source_tokens/wiki"][40] == 700 * 20 + 500 * 20
    assert got["train/source_tokens/stories"][21] == 500 and 20 not in got["train/source_tokens/stories"]


def test_a_blend_of_many_shards_draws_the_largest_and_one_band_for_the_rest(tmp_path):
    """30 sources: the 19 largest by tokens keep their band (one of them new halfway through, as a
    changed mix adds it); the 11 others are summed into one."""
    lines, totals = [], {}
    for step in range(1, 11):
        for k in range(30):
            if k < 29 or step > 5:  # source 29 starts at step 6
                totals[f"shard{k:02d}"] = totals.get(f"shard{k:02d}", 0) + (k + 1) * 10
        lines.append(json.dumps({"kind": "train", "step": step, "time": 1000.0 + step, "loss": 1.0,
                                 "lr": 1e-3, "grad_norm": 1.0, "source_tokens": dict(totals)}))  # fmt: skip
    log = tmp_path / "metrics.jsonl"
    log.write_text("\n".join(lines) + "\n")
    runs, _ = collect_curves([str(log)], x="steps")
    drawn = plot_runs(runs, PlotConfig(output=tmp_path / "c.png", dpi=40))
    name = runs[0].name
    kept = {f"shard{k:02d}" for k in range(11, 30)}  # shard29 started late but is the largest per step
    assert set(drawn["source_tokens"]) == {f"{name}:{n}" for n in kept | {"11 other sources"}}
    other = runs[0].series["source_tokens/11 other sources"][1]
    assert list(other) == [sum((k + 1) * 10 * step for k in range(11)) for step in range(1, 11)]
    shares = runs[0].shares()
    # shares are float64 ratios of sample counts: default rel=1e-6 is far above their ulps
    assert all(sum(s[1][i] for s in shares.values()) == pytest.approx(1.0) for i in range(10))
