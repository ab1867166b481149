"""Every reader of JSON lines goes through one bounded parser: a hostile line (see ``hostile_json``) is
either read as Python's json reads it, or refused in one line naming FILE:LINE with exit 2 (or, with
``--skip-bad``, skipped and counted by kind) -- never an exit 1, a traceback, Python's own "Exceeds the
limit (4300 digits)" or a RecursionError. Checked through the real commands (json2bin with and without
--skip-bad, sft, pref, the task files of llm-ckpt eval, llm-log) for every hostile kind, and through the
library readers by a generator."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmtools.errors import InputError
from llmtools.formats import jsonfile
from tests.trust.hostile_json import (
    HOSTILE,
    constant,
    deep_array,
    deep_object,
    huge_float,
    huge_int,
    record_with,
)

BIN = Path(sys.executable).parent
DEPTH = getattr(jsonfile, "MAX_DEPTH", 512)
CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
PAIR = {"prompt": "p", "chosen": "a", "rejected": "b"}
TEXT = {"text": "hello"}
METRIC = {"step": 2, "loss": 1.5}

# reader -> (the good record it reads, the hostile kinds it must refuse beyond the "refused" ones)
READERS = {
    "json2bin": (TEXT, set()),  # Megatron's json takes NaN and a surrogate in a key it does not use
    "sft": (CHAT, {"lone-surrogate", "lone-surrogate-key"}),  # no text of a record may hold one
    "pref": (PAIR, {"lone-surrogate", "lone-surrogate-key"}),
    "eval-tasks": (TEXT, {k for k in HOSTILE} | {"lone-surrogate-key"}),  # strict: lm-eval reads it again
    "llm-log": (METRIC, {"lone-surrogate", "lone-surrogate-key"}),  # names are tags, strings are text
}
KINDS = [*HOSTILE, "lone-surrogate-key"]


def _line(base: dict, kind: str) -> str:
    if kind == "lone-surrogate-key":
        return record_with(base, HOSTILE["lone-surrogate"][0], as_key=True)
    return record_with(base, HOSTILE[kind][0])


def _command(reader: str, path: Path, out: Path, skip_bad: bool) -> list[str]:
    skip = ["--skip-bad"] if skip_bad else []
    if reader == "json2bin":
        return [str(BIN / "llm-prep"), "json2bin", str(path), "-t", "byte", "-o", str(out / "x"), *skip]
    if reader in ("sft", "pref"):
        return [str(BIN / "llm-prep"), reader, str(path), "-t", "byte", "--chat-template", "chatml",
                "-o", str(out / "x"), *skip]  # fmt: skip
    if reader == "eval-tasks":  # the task files are read first, before the checkpoint is looked for
        return [str(BIN / "llm-ckpt"), "eval", str(out / "no-checkpoint"), "--tasks", str(path)]
    return [str(BIN / "llm-log"), "tb", str(path), "--logdir", str(out / "tb")]


def _write(tmp_path: Path, reader: str, kinds: list[str]) -> Path:
    base = READERS[reader][0]
    lines = [json.dumps({**base, "step": 1} if reader == "llm-log" else base)]
    lines += [
        _line({**base, "step": 2 + i} if reader == "llm-log" else base, kind) for i, kind in enumerate(kinds)
    ]
    path = tmp_path / f"{reader}.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _run(args, cli_env, cwd):
    return subprocess.run(args, capture_output=True, text=True, env=cli_env, cwd=cwd, timeout=300)


def _refused(reader: str, kind: str) -> bool:
    return kind in READERS[reader][1] or (kind in HOSTILE and HOSTILE[kind][1] == "refused")


def _no_internal_error(proc) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for word in ("internal error", "Exceeds the limit", "RecursionError", "set_int_max_str_digits"):
        assert word not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("reader", list(READERS))
def test_a_hostile_line_is_read_or_refused_in_one_line_naming_file_and_line(tmp_path, cli_env, reader, kind):
    path = _write(tmp_path, reader, [kind])
    proc = _run(_command(reader, path, tmp_path / "out", skip_bad=False), cli_env, tmp_path)
    _no_internal_error(proc)
    place = f"{path}:2"
    if reader == "llm-log":  # llm-log reads a log with bad lines: each is warned about (FILE:LINE), counted
        assert proc.returncode == 0, proc.stderr
        warned = [line for line in proc.stderr.splitlines() if place in line]
        assert bool(warned) == _refused(reader, kind), proc.stderr
        assert ("1 invalid" in proc.stderr) == _refused(reader, kind), proc.stderr
        return
    if reader == "eval-tasks":  # a good task file gets as far as the missing checkpoint
        assert proc.returncode == 2, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert (place in line) == _refused(reader, kind), line
        return
    if _refused(reader, kind):
        assert proc.returncode == 2, proc.stderr[-3000:]
        (line,) = proc.stderr.strip().splitlines()
        assert place in line, line
        assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    else:
        assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("reader", ["json2bin", "sft", "pref"])
def test_skip_bad_skips_and_counts_every_hostile_line(tmp_path, cli_env, reader):
    path = _write(tmp_path, reader, KINDS)
    proc = _run(_command(reader, path, tmp_path / "out", skip_bad=True), cli_env, tmp_path)
    _no_internal_error(proc)
    assert proc.returncode == 0, proc.stderr[-3000:]
    refused = [kind for kind in KINDS if _refused(reader, kind)]
    sidecar = json.loads(next((tmp_path / "out").glob("*.json")).read_text())
    skipped = sidecar["counts"]["skipped"]
    assert sum(v for k, v in skipped.items() if k != "blank_line") == len(refused), (skipped, refused)
    assert sidecar["counts"]["documents"] == len(KINDS) + 1 - len(refused)


# -- the library readers, by a generator -------------------------------------------------------------------
_HOSTILE_VALUE = st.one_of(  # (refused by every reader, the value's JSON text)
    st.tuples(st.just(True), st.builds(huge_int, st.integers(4_301, 20_000), st.sampled_from(["", "-"]))),
    st.tuples(st.just(True), st.builds(deep_array, st.integers(DEPTH + 1, 60_000))),
    st.tuples(st.just(True), st.builds(deep_object, st.integers(DEPTH + 1, 20_000))),
    st.tuples(st.just(False), st.builds(constant, st.sampled_from(["NaN", "Infinity", "-Infinity"]))),
    st.tuples(st.just(False), st.builds(huge_float, st.integers(309, 10**9))),
    st.tuples(st.just(False), st.just('"\\udfff"')),
)


@st.composite
def _hostile_line(draw):
    """A line with a hostile value at a random place: the whole line, a member, inside a list."""
    always, value = draw(_HOSTILE_VALUE)
    shape = draw(st.sampled_from(["alone", "member", "in-list", "nested"]))
    return always, {
        "alone": value,
        "member": f'{{"text": "x", "v": {value}}}',
        "in-list": f'{{"text": "x", "v": [1, {value}, 3]}}',
        "nested": f'{{"a": {{"b": [{{"c": {value}}}]}}}}',
    }[shape]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hostile=_hostile_line(), strict=st.booleans())
def test_the_bounded_parser_answers_every_hostile_line_with_a_value_or_a_bad_line(tmp_path, hostile, strict):
    """parse_line and read_lines (every JSON-lines reader's parser) give a value or a BadLine naming
    FILE:LINE: huge integers and deep nesting always a BadLine; strict (finite + strings) refuses every
    non-finite number and lone surrogate as well, lenient reads them as Python's json does."""
    always, line = hostile
    refused = always or strict
    try:
        jsonfile.parse_line(line.encode(), "f.jsonl:7", finite=strict, strings=strict)
    except jsonfile.BadLine as error:
        assert refused, (line[:80], error)
        assert str(error).startswith("f.jsonl:7: ") and "\n" not in str(error)
        assert error.kind in ("malformed_json", "invalid_utf8")
    else:
        assert not refused, line[:80]
    path = tmp_path / "h.jsonl"
    path.write_text('{"ok": 1}\n' + line + '\n{"ok": 2}\n')
    skipped: dict[str, int] = {}
    got = list(jsonfile.read_lines(path, skip_bad=True, skipped=skipped, finite=strict, strings=strict))
    assert [n for n, _ in got] == ([1, 3] if refused else [1, 2, 3])
    assert sum(skipped.values()) == int(refused)
    with pytest.raises(jsonfile.BadLine, match=f"^{path}:2: ") if refused else _nothing():
        list(jsonfile.read_lines(path, finite=strict, strings=strict))


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_the_interpreter_s_own_digit_bound_does_not_decide(tmp_path):
    """The bound is ours: a raised interpreter limit does not let a longer integer through, nor a lowered
    one turn a short integer into an exception without a place."""
    code = (
        "import sys; sys.set_int_max_str_digits({limit});\n"
        "from llmtools.formats import jsonfile\n"
        "try:\n    jsonfile.loads('[' + '7' * {digits} + ']'); print('read')\n"
        "except ValueError as error:\n    print(type(error).__name__)\n"
    )
    for limit, digits, expect in ((0, 5_000, "JSONDecodeError"), (100_000, 50_000, "JSONDecodeError"),
                                  (640, 1_000, "JSONDecodeError"), (0, 4_300, "read")):  # fmt: skip
        out = subprocess.run([sys.executable, "-c", code.format(limit=limit, digits=digits)],
                             capture_output=True, text=True, check=True)  # fmt: skip
        assert out.stdout.strip() == expect, (limit, digits, out.stdout, out.stderr)


def test_a_task_file_line_nested_deep_is_an_input_error_naming_its_line(tmp_path):
    from llmtools.formats.tasks import read_task_files

    path = tmp_path / "t.jsonl"
    path.write_text('{"text": "a"}\n{"text": "b", "x": ' + deep_array() + "}\n")
    with pytest.raises(InputError, match=rf"{path}:2: not JSON \(nested too deeply"):
        read_task_files([str(path)], None, where="--tasks")
