"""Per-run summaries and spike detection."""

from __future__ import annotations

import math

import pytest

from llmtools.errors import UsageError
from llmtools.logs.analysis import RunSummary, SpikeConfig, SpikeDetector, format_table
from llmtools.logs.records import Record
from llmtools.logs.runs import name_runs, summarize
from tests.logs.helpers import FIXTURES


def test_metrics_summary():
    [s] = summarize([str(FIXTURES / "metrics.jsonl")], names=["tiny"])
    d = s.as_dict()
    assert (d["run"], d["format"], d["steps"], d["first_step"], d["last_step"]) == (
        "tiny",
        "jsonl",
        60,
        1,
        60,
    )
    assert d["tokens"] == 60 * 8 * 256
    assert d["spikes"] == 1 and d["spike_steps"] == [37]
    # float64 arithmetic on both sides in another order: pytest's default rel=1e-6 is ~2^30 of its ulps
    assert d["eval_ppl"] == pytest.approx(math.exp(d["eval_loss"])) and d["eval_step"] == 60
    # means of a few float64 values: default rel=1e-6 is ~2^30 of their ulps
    assert d["mean_mfu"] == pytest.approx(0.31) and d["mean_tokens_per_s"] == pytest.approx(4096 + 30.5)
    assert d["min_loss"] <= d["last_loss"] < d["first_loss"]
    assert d["gaps"] == [] and d["resumes"] == 0
    assert d["lines"] == {
        "lines": 66,
        "train": 60,
        "eval": 3,
        "event": 3,
        "other": 0,
        "invalid": 0,
        "torn": 0,
    }


def test_megatron_summary_finds_the_resume():
    [s] = summarize([str(FIXTURES / "megatron.log")])
    d = s.as_dict()
    assert d["resumes"] == 1 and {"after": 150, "next": 110, "kind": "resume"} in d["gaps"]
    assert d["eval_loss"] == 2.773573 and d["eval_step"] == 150  # the last validation line, as printed
    assert d["events"] == {"checkpoint": 1, "resume": 1}


def test_seq_length_gives_megatron_token_counts():
    [s] = summarize([str(FIXTURES / "megatron.log")], seq_length=512)
    d = s.as_dict()
    assert d["tokens"] == 200 * 32 * 512  # consumed samples at iteration 200 x 512
    assert d["mean_tokens_per_s"] == pytest.approx(d["mean_samples_per_s"] * 512)
    with pytest.raises(UsageError, match="--seq-length"):
        summarize([str(FIXTURES / "megatron.log")], seq_length=0)


def test_gaps_in_the_step_sequence():
    s = RunSummary("r")
    for step in [10, 20, 30, 60, 70, 40, 50]:
        s.add(Record("train", step, None, {"loss": 1.0}))
    assert s.gaps() == [
        {"after": 30, "next": 60, "kind": "gap", "missing": 2},
        {"after": 70, "next": 40, "kind": "resume"},
    ]


def test_spike_detector():
    detector = SpikeDetector(SpikeConfig(threshold=0.25, window=10))
    flags = [detector.check(v) for v in [5.0, 4.9, 4.8, 4.9, 4.7, 4.6, 7.0, 4.5, float("nan"), 4.4]]
    assert [i for i, f in enumerate(flags) if f is not None] == [6]
    with pytest.raises(UsageError, match="--spike-threshold"):
        SpikeConfig(threshold=0)


def test_table_lists_every_run():
    summaries = summarize([str(FIXTURES / "deepspeed.log"), str(FIXTURES / "mindformers.log")])
    table = format_table([s.as_dict() for s in summaries])
    assert "run                  deepspeed" in table and "mindformers" in table
    assert "loss first/last/min" in table


def test_run_names_are_unique():
    assert name_runs(["a/metrics.jsonl", "b/a.log", "c/a.log"]) == ["a", "a-2", "a-3"]
