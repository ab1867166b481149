"""llm-log tb as a library: every format reads back right, exactly once, however the log arrives."""

from __future__ import annotations

import gzip
import json
import shutil
import threading
import time
from pathlib import Path

import pytest

from llmtools.errors import InputError, UsageError
from llmtools.logs.tb import STATE_NAME, TbConfig, convert, run_name
from tests.logs.helpers import FIXTURES, expected, f32, raw_points, scalars, texts

FORMAT_FIXTURES = [
    ("metrics.jsonl", "metrics", "jsonl"),
    ("megatron.log", "megatron", "megatron"),
    ("megatron_deepspeed.log", "megatron_deepspeed", "megatron"),
    ("deepspeed.log", "deepspeed", "deepspeed"),
    ("deepspeed_pipe.log", "deepspeed_pipe", "deepspeed"),
    ("mindformers.log", "mindformers", "mindformers"),
    ("generic.log", "generic", "generic"),
]


def assert_matches(run_dir: Path, want: dict[str, dict[int, float]]) -> None:
    got = scalars(run_dir)
    for tag, points in want.items():
        assert tag in got, f"missing tag {tag}; have {sorted(got)}"
        assert sorted(got[tag]) == sorted(points), tag
        for step, value in points.items():
            assert got[tag][step] == f32(value), (tag, step)


@pytest.mark.parametrize("fixture,name,fmt", FORMAT_FIXTURES)
def test_every_scalar_reads_back_at_its_step(tmp_path, fixture, name, fmt):
    result = convert([str(FIXTURES / fixture)], TbConfig(tmp_path, run="r"))
    assert_matches(tmp_path / "r", expected(name))
    assert result.counts.by_kind["invalid"] == 0
    state = json.loads((tmp_path / "r" / STATE_NAME).read_text())
    assert [s["format"] for s in state["sources"].values()] == [fmt]


@pytest.mark.filterwarnings("ignore:The inplace keyword")  # inside tbparse, with pandas 3
def test_tbparse_reads_the_same_scalars(tmp_path):
    from tbparse import SummaryReader

    convert([str(FIXTURES / "mindformers.log")], TbConfig(tmp_path, run="mf"))
    frame = SummaryReader(str(tmp_path / "mf")).scalars
    got = {(row.tag, int(row.step)): float(row.value) for row in frame.itertuples()}
    want = {
        (tag, step): f32(v) for tag, points in expected("mindformers").items() for step, v in points.items()
    }
    assert got == want


def test_follow_waits_for_a_log_that_does_not_exist_yet(tmp_path):
    log = tmp_path / "later" / "metrics.jsonl"
    stop = threading.Event()
    config = TbConfig(tmp_path / "tb", run="r", follow=True, poll_s=0.02, commit_every_s=0.0)
    thread = threading.Thread(target=convert, args=([str(log)], config), kwargs={"should_stop": stop.is_set})
    thread.start()
    try:
        time.sleep(0.2)
        log.parent.mkdir()
        shutil.copy(FIXTURES / "metrics.jsonl", log)
        time.sleep(0.4)
    finally:
        stop.set()
        thread.join(10)
    assert_matches(tmp_path / "tb" / "r", expected("metrics"))


def test_forced_format_and_gzip_input(tmp_path):
    gz = tmp_path / "train.log.gz"
    gz.write_bytes(gzip.compress((FIXTURES / "megatron.log").read_bytes()))
    convert([str(gz)], TbConfig(tmp_path / "tb", fmt="megatron"))
    assert_matches(tmp_path / "tb" / "train", expected("megatron"))


def test_zstd_input(tmp_path):
    import zstandard

    log = tmp_path / "mf.log.zst"
    log.write_bytes(zstandard.ZstdCompressor().compress((FIXTURES / "mindformers.log").read_bytes()))
    convert([str(log)], TbConfig(tmp_path / "tb"))
    assert_matches(tmp_path / "tb" / "mf", expected("mindformers"))


def test_null_or_nan_loss_becomes_a_nan_marker(tmp_path):
    log = tmp_path / "metrics.jsonl"
    rows = [{"kind": "train", "step": s, "time": 1.0 + s, "loss": 2.0, "lr": 1e-3} for s in range(1, 4)]
    rows[1]["loss"] = None  # what llm-train writes for a non-finite loss
    log.write_text(
        "".join(json.dumps(r) + "\n" for r in rows) + '{"kind": "train", "step": 4, "loss": NaN}\n'
    )
    convert([str(log)], TbConfig(tmp_path / "tb", run="r"))
    got = scalars(tmp_path / "tb" / "r")
    assert got["markers/nan"] == {2: 1.0, 4: 1.0}
    assert [step for step, text in texts(tmp_path / "tb" / "r") if "non-finite loss" in text] == [2, 4]


def test_markers_and_texts_for_events_spikes_and_resumes(tmp_path):
    convert([str(FIXTURES / "metrics.jsonl")], TbConfig(tmp_path, run="ours"))
    notes = texts(tmp_path / "ours")
    assert (37, notes[2][1]) == notes[2] and "loss spike at step 37" in notes[2][1]
    assert [step for step, _ in notes] == [0, 25, 37, 50]
    convert([str(FIXTURES / "megatron.log")], TbConfig(tmp_path, run="meg"))
    assert any("resume" in text and step == 100 for step, text in texts(tmp_path / "meg"))


def test_unannounced_restart_gets_a_resume_marker(tmp_path):
    log = tmp_path / "app.log"
    log.write_text("".join(f"step={s} loss={10 - s * 0.1:.2f}\n" for s in [1, 2, 3, 4, 5, 3, 4, 5, 6]))
    convert([str(log)], TbConfig(tmp_path / "tb", run="r"))
    assert scalars(tmp_path / "tb" / "r")["markers/resume"] == {3: 1.0}
    assert texts(tmp_path / "tb" / "r") == [
        (3, "step 3: resume: step went back from 5 to 3 (restarted from an earlier checkpoint?)")
    ]
    convert([str(FIXTURES / "megatron.log")], TbConfig(tmp_path / "tb", run="meg"))
    assert scalars(tmp_path / "tb" / "meg")["markers/resume"] == {
        100: 1.0
    }  # announced by the log: no second marker


def test_converting_twice_adds_nothing(tmp_path):
    log = FIXTURES / "megatron.log"
    first = convert([str(log)], TbConfig(tmp_path, run="r"))
    before = raw_points(tmp_path / "r")
    second = convert([str(log)], TbConfig(tmp_path, run="r"))
    assert raw_points(tmp_path / "r") == before
    assert second.runs["r"]["points"] == 0 and first.runs["r"]["points"] == sum(before.values())


def _bursts(path: Path, text: str, cuts: list[int]):
    """Write text in pieces, cutting mid-line too (a writer flushing at arbitrary byte counts)."""
    edges = [0, *cuts, len(text)]
    for start, stop in zip(edges, edges[1:], strict=False):
        with open(path, "a") as handle:
            handle.write(text[start:stop])
        yield


def test_three_bursts_give_each_point_once(tmp_path):
    text = (FIXTURES / "metrics.jsonl").read_text()
    log = tmp_path / "run" / "metrics.jsonl"
    log.parent.mkdir()
    cuts = [len(text) // 3 + 17, 2 * len(text) // 3 + 5]  # both inside a line
    for _ in _bursts(log, text, cuts):
        convert([str(log)], TbConfig(tmp_path / "tb"))
    once = raw_points(tmp_path / "tb" / "run")
    assert max(once.values()) == 1
    reference = tmp_path / "ref"
    convert([str(FIXTURES / "metrics.jsonl")], TbConfig(reference, run="run"))
    assert once == raw_points(reference / "run")
    assert_matches(tmp_path / "tb" / "run", expected("metrics"))


def test_follow_three_bursts_then_stop(tmp_path):
    text = (FIXTURES / "deepspeed.log").read_text()
    log = tmp_path / "ds.log"
    log.write_text("")
    stop = threading.Event()
    config = TbConfig(tmp_path / "tb", follow=True, poll_s=0.02, commit_every_s=0.0)
    box = {}
    thread = threading.Thread(
        target=lambda: box.setdefault("r", convert([str(log)], config, should_stop=stop.is_set))
    )
    thread.start()
    try:
        for _ in _bursts(log, text, [len(text) // 3 + 3, 2 * len(text) // 3 + 11]):
            time.sleep(0.15)
    finally:
        time.sleep(0.15)
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    assert box["r"].stopped
    assert max(raw_points(tmp_path / "tb" / "ds").values()) == 1
    assert_matches(tmp_path / "tb" / "ds", expected("deepspeed"))


def _committed_records(run_dir: Path) -> int:
    try:
        state = json.loads((run_dir / STATE_NAME).read_text())
    except (OSError, ValueError):
        return 0
    return sum(int(source.get("records", 0)) for source in state["sources"].values())


def _records_in(text: str, tmp_path: Path) -> int:
    """How many records llm-log finds in ``text`` (converted once, on the side)."""
    scratch = tmp_path / f"count-{len(text)}"
    scratch.mkdir()
    (scratch / "metrics.jsonl").write_text(text)
    convert([str(scratch / "metrics.jsonl")], TbConfig(scratch / "tb", run="r"))
    return _committed_records(scratch / "tb" / "r")


def _wait_for_committed(run_dir: Path, records: int, thread: threading.Thread) -> None:
    """Until the follower has committed ``records``: what a rotation or a truncation then takes away
    was read before it, however slowly the machine runs the follower."""
    deadline = time.monotonic() + 60
    while _committed_records(run_dir) < records and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _committed_records(run_dir) >= records


def test_follow_survives_rotation_and_truncation(tmp_path):
    lines = (FIXTURES / "metrics.jsonl").read_text().splitlines(keepends=True)
    first, second = _records_in("".join(lines[:20]), tmp_path), _records_in("".join(lines[:40]), tmp_path)
    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(lines[:20]))
    stop = threading.Event()
    run = tmp_path / "tb" / "r"
    config = TbConfig(tmp_path / "tb", run="r", follow=True, poll_s=0.02, commit_every_s=0.0)
    thread = threading.Thread(target=convert, args=([str(log)], config), kwargs={"should_stop": stop.is_set})
    thread.start()
    try:
        _wait_for_committed(run, first, thread)
        log.rename(tmp_path / "metrics.jsonl.1")  # logrotate: rename, then the writer opens a new file
        log.write_text("".join(lines[20:40]))
        _wait_for_committed(run, second, thread)
        log.write_text("")  # copytruncate: same file, cut to zero, then written again
        time.sleep(0.2)
        with open(log, "a") as handle:
            handle.write("".join(lines[40:]))
        time.sleep(0.3)
    finally:
        stop.set()
        thread.join(10)
    points = raw_points(tmp_path / "tb" / "r")
    assert max(points.values()) == 1
    assert_matches(tmp_path / "tb" / "r", expected("metrics"))


def test_a_file_cut_and_written_past_our_offset_between_two_looks_is_read_from_its_start(tmp_path):
    """copytruncate under a slow reader: by the next look the file is longer than before, so its size
    cannot tell; the bytes last read, no longer where they were, do."""
    from llmtools.logs.sources import Tailer

    log = tmp_path / "train.log"
    log.write_text("old 1\nold 2\n")
    tailer = Tailer(str(log), live=True)
    assert [raw for _, _, raw in tailer.poll()] == [b"old 1", b"old 2"]
    log.write_text("new 1\nnew 2\nnew 3\n")  # truncated and written again, longer than before
    assert [raw for _, _, raw in tailer.poll()] == [b"new 1", b"new 2", b"new 3"]
    assert tailer.truncations == 1
    with open(log, "a") as handle:  # plain appends stay appends
        handle.write("new 4\n")
    assert [raw for _, _, raw in tailer.poll()] == [b"new 4"] and tailer.truncations == 1
    tailer.close()


def test_torn_last_line_waits_until_complete(tmp_path):
    text = (FIXTURES / "metrics.jsonl").read_text()
    lines = text.splitlines(keepends=True)
    log = tmp_path / "metrics.jsonl"
    torn = lines[-1][: len(lines[-1]) // 2]
    log.write_text("".join(lines[:-1]) + torn)  # the writer died mid-line
    result = convert([str(log)], TbConfig(tmp_path / "tb", run="r"))
    assert result.counts.by_kind["torn"] == 1
    assert any(
        "last line has no newline" in p and f":{len(lines)}" in p for p in result.counts.first_problems
    )
    last_step = json.loads(lines[-1])["step"]
    with open(log, "a") as handle:
        handle.write(lines[-1][len(torn) :])  # the rest arrives (the run resumed writing)
    convert([str(log)], TbConfig(tmp_path / "tb", run="r"))
    points = raw_points(tmp_path / "tb" / "r")
    assert max(points.values()) == 1
    assert any(step == last_step for (_, step, _) in points)


def test_invalid_json_lines_are_counted_not_fatal(tmp_path):
    log = tmp_path / "metrics.jsonl"
    good = (FIXTURES / "metrics.jsonl").read_text().splitlines(keepends=True)
    log.write_text(
        good[0]
        + '{"kind": "train", "step": \n'
        + "plain text line\n"
        + '{"kind": "train", "step": "7"}\n'
        + "".join(good[1:])
    )
    result = convert([str(log)], TbConfig(tmp_path / "tb", run="r"))
    assert result.counts.by_kind["invalid"] == 2 and result.counts.by_kind["other"] == 1
    assert result.counts.first_problems[0].startswith(f"{log}:2: not valid JSON")
    assert_matches(tmp_path / "tb" / "r", expected("metrics"))


def test_binary_garbage_is_refused_with_a_clear_message(tmp_path):
    garbage = tmp_path / "core.bin"
    garbage.write_bytes(bytes(range(256)) * 64 + b"\x00\x01iteration 5/ 10 |\x00")
    with pytest.raises(InputError, match=r"core\.bin: binary data, not a text training log"):
        convert([str(garbage)], TbConfig(tmp_path / "tb"))


def test_crash_after_write_before_commit_is_repaired(tmp_path):
    lines = (FIXTURES / "metrics.jsonl").read_text().splitlines(keepends=True)
    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(lines[:30]))
    convert([str(log)], TbConfig(tmp_path / "tb", run="r"))
    events = next((tmp_path / "tb" / "r").glob("*.llmtools"))
    committed = events.read_bytes()
    # a crash: events of lines 30.. reached the file, the state did not (and a stray new file too)
    scratch = tmp_path / "scratch"
    convert([str(FIXTURES / "metrics.jsonl")], TbConfig(scratch, run="r"))
    extra = next((scratch / "r").glob("*.llmtools")).read_bytes()[len(committed) :]
    events.write_bytes(committed + extra[: len(extra) // 2])
    (tmp_path / "tb" / "r" / "events.out.tfevents.9999999999.x.000009.llmtools").write_bytes(extra[:100])
    log.write_text("".join(lines))
    convert([str(log)], TbConfig(tmp_path / "tb", run="r"))
    assert max(raw_points(tmp_path / "tb" / "r").values()) == 1
    assert_matches(tmp_path / "tb" / "r", expected("metrics"))


def test_replaced_log_only_adds_later_steps(tmp_path):
    lines = (FIXTURES / "metrics.jsonl").read_text().splitlines(keepends=True)
    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(lines[:30]))
    convert([str(log)], TbConfig(tmp_path / "tb", run="r"))
    log.unlink()
    log.write_text("".join(lines))  # rewritten from scratch, e.g. regenerated by a tool
    convert([str(log)], TbConfig(tmp_path / "tb", run="r"))
    assert max(raw_points(tmp_path / "tb" / "r").values()) == 1
    assert_matches(tmp_path / "tb" / "r", expected("metrics"))


def test_stdin_source(tmp_path, monkeypatch):
    import io
    import sys

    data = (FIXTURES / "mindformers.log").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(data))))
    convert(["-"], TbConfig(tmp_path, run="live"))
    assert_matches(tmp_path / "live", expected("mindformers"))


def test_follow_stops_when_stdin_closes(tmp_path, monkeypatch):
    import io
    import sys

    data = (FIXTURES / "deepspeed_pipe.log").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(data))))
    result = convert(["-"], TbConfig(tmp_path, run="pipe", follow=True, poll_s=0.01))  # returns: no hang
    assert result.stopped
    assert_matches(tmp_path / "pipe", expected("deepspeed_pipe"))


def test_one_writer_per_run_folder(tmp_path):
    import fcntl

    folder = tmp_path / "r"
    folder.mkdir()
    with open(folder / ".llm-log.lock", "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        with pytest.raises(UsageError, match="another llm-log tb is writing"):
            convert([str(FIXTURES / "generic.log")], TbConfig(tmp_path, run="r"))


def test_config_validation_names_the_flag(tmp_path):
    with pytest.raises(UsageError, match="--format"):
        TbConfig(tmp_path, fmt="tensorflow")
    with pytest.raises(UsageError, match="--run"):
        TbConfig(tmp_path, run="a/b")
    with pytest.raises(UsageError, match="--pattern"):
        convert([str(FIXTURES / "generic.log")], TbConfig(tmp_path, pattern="(unclosed"))


def test_run_names():
    assert run_name("/x/run7/metrics.jsonl") == "run7"
    assert run_name("logs/gpt-345m.log.gz") == "gpt-345m"
    assert run_name("-") == "stdin"


def test_several_logs_into_one_run_keep_separate_positions(tmp_path):
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    shutil.copy(FIXTURES / "generic.log", a)
    shutil.copy(FIXTURES / "deepspeed_pipe.log", b)
    convert([str(a), str(b)], TbConfig(tmp_path / "tb", run="both"))
    convert([str(a), str(b)], TbConfig(tmp_path / "tb", run="both"))
    state = json.loads((tmp_path / "tb" / "both" / STATE_NAME).read_text())
    assert len(state["sources"]) == 2
    assert max(raw_points(tmp_path / "tb" / "both").values()) == 1
