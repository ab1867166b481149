"""Line parsers and format detection, on lines as the trainers print them."""

from __future__ import annotations

import math

import pytest

from llmtools.logs.parsers import (
    DeepSpeedParser,
    GenericParser,
    JsonlParser,
    MegatronParser,
    MindFormersParser,
    detect_format,
    to_float,
)
from llmtools.logs.reader import read_log
from tests.logs.helpers import FIXTURES


@pytest.mark.parametrize(
    "text,value",
    [
        ("3.2E+00", 3.2),
        ("[1.e-05]", 1e-5),
        ("1234ms", 1234.0),
        ("98.765T", 98.765),
        ("nan", math.nan),
        ("0.53GB", 0.53),
        ("[2.1000000]", 2.1),
        ("oops", None),
    ],
)
def test_to_float(text, value):
    got = to_float(text)
    if value is None:
        assert got is None
    elif math.isnan(value):
        assert math.isnan(got)
    else:
        assert got == value


@pytest.mark.parametrize(
    "fixture,fmt",
    [
        ("metrics.jsonl", "jsonl"),
        ("megatron.log", "megatron"),
        ("megatron_deepspeed.log", "megatron"),
        ("deepspeed.log", "deepspeed"),
        ("deepspeed_pipe.log", "deepspeed"),
        ("mindformers.log", "mindformers"),
        ("generic.log", "generic"),
    ],
)
def test_detection(fixture, fmt):
    lines = (FIXTURES / fixture).read_text(encoding="utf-8").splitlines()
    assert detect_format(lines) == fmt


def test_megatron_wins_over_deepspeed_lines_in_one_log():
    ds = (FIXTURES / "deepspeed.log").read_text().splitlines()
    meg = (FIXTURES / "megatron.log").read_text().splitlines()
    assert detect_format(ds[:40] + meg[7:9]) == "megatron"


def test_megatron_validation_and_test_lines():
    parser = MegatronParser()
    kind, [rec] = parser.parse(
        " validation loss at iteration 500 on test set | lm loss value: 2.500000E+00 | lm loss PPL: 1.218249E+01 | ",
        1,
    )
    assert (kind, rec.step, rec.values) == ("eval", 500, {"test_loss": 2.5, "test_ppl": 12.18249})
    kind, [rec] = parser.parse(
        " validation-wiki loss at iteration 40 | lm loss value: 3.000000E+00 | mtp_1 loss value: 3.5E+00 | ",
        2,
    )
    assert rec.values == {"eval_wiki_loss": 3.0, "eval_wiki_mtp_1_loss": 3.5}


def test_deepspeed_timer_before_any_report_is_other():
    parser = DeepSpeedParser()
    assert parser.parse("[Rank 0] time (ms) | fwd: 1.00 | bwd: 2.00", 1) == ("other", [])


def test_mindformers_sink_line_values():
    line = (FIXTURES / "mindformers.log").read_text(encoding="utf-8").splitlines()[1]
    kind, [rec] = MindFormersParser().parse(line, 2)
    assert kind == "train" and rec.step == 5
    assert (
        rec.values["grad_norm"] == 2.1 and rec.values["step_time_s"] == 1.239 and rec.values["loss"] == 10.304
    )


def test_mindformers_second_epoch_global_step():
    line = "{ Epoch:[  2/  2], step:[    3/   50], loss:[2.000/2.100], per_step_time: 10ms, overflow cond: False, loss_scale: 1.0, global_norm: [1.0]"
    kind, [rec] = MindFormersParser().parse(line, 1)
    assert rec.step == 53 and rec.values["loss_avg"] == 2.1 and "lr" not in rec.values


def test_jsonl_kinds_and_errors():
    parser = JsonlParser()
    kind, [rec] = parser.parse(
        '{"kind": "train", "step": 3, "time": 1.5, "loss": NaN, "grad_norm": null, "skipped": true, "note": "x"}',
        1,
    )
    assert kind == "train" and math.isnan(rec.values["loss"]) and rec.values["skipped"] == 1.0
    assert "grad_norm" not in rec.values and "note" not in rec.values
    assert (
        parser.parse('{"kind": "event", "step": 4, "event": "resume", "message": "from step 3"}', 2)[1][
            0
        ].event
        == "resume"
    )
    assert parser.parse('{"kind": "weird", "step": 1}', 3)[0] == "invalid"
    assert parser.parse('{"kind": "train", "step": 1.5}', 4)[0] == "invalid"
    assert parser.parse("[1, 2]", 5)[0] == "invalid"
    assert parser.parse("Traceback (most recent call last):", 6) == ("other", [])


def test_generic_pattern_with_named_groups():
    parser = GenericParser(r"epoch \d+ it (?P<step>\d+) .*?ppl (?P<ppl>[\d.]+)")
    kind, [rec] = parser.parse("epoch 1 it 40 | ppl 33.5 | junk=7", 1)
    assert (rec.step, rec.values) == (40, {"ppl": 33.5})
    assert parser.parse("epoch 1 eval ppl 30", 2) == ("other", [])


def test_generic_pattern_selects_lines_for_key_values(tmp_path):
    log = tmp_path / "app.log"
    log.write_text("TRAIN step=1 loss=2.0\nEVAL step=1 loss=9.0\nTRAIN step=2 loss=1.5\n")
    records, counts, fmt = read_log(str(log), pattern=r"^TRAIN ")
    assert fmt == "generic" and [(r.step, r.values["loss"]) for r in records] == [(1, 2.0), (2, 1.5)]
    assert counts.by_kind["other"] == 1


def test_read_log_counts_every_line_kind():
    records, counts, fmt = read_log(str(FIXTURES / "megatron.log"))
    assert fmt == "megatron"
    assert counts.lines == len((FIXTURES / "megatron.log").read_text().splitlines())
    assert (counts.by_kind["train"], counts.by_kind["eval"], counts.by_kind["event"]) == (25, 3, 2)


def test_text_without_metrics_is_not_an_error(tmp_path):
    log = tmp_path / "notes.txt"
    log.write_text("hello\nnothing to see\n")
    records, counts, fmt = read_log(str(log))
    assert (records, fmt, counts.by_kind["other"]) == ([], None, 2)
