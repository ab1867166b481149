"""llm-prep filter through the installed console script: the pipe into json2bin with provenance, shards,
determinism, bad input, --force, a signal mid-run, the removed and stats files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

BIN = Path(sys.executable).parent
EXTRA = [
    {"text": "Das Wetter ist heute schön und die Kinder spielen im Park am Fluss.", "id": "de-1"},
    {"text": "Write to john.doe@gmail.com or visit 8.8.8.8 for the weather report today.", "url": "u"},
    {"text": "short", "metadata": {"source": "x"}},
]


def cli(*args, stdin=None, cwd=None, check=None):
    proc = subprocess.run([str(BIN / "llm-prep"), *map(str, args)], input=stdin, capture_output=True, cwd=cwd)
    if check is not None:
        assert proc.returncode == check, proc.stderr.decode()
    return proc


def corpus(tmp_path: Path) -> list[Path]:
    cli("sample-corpus", "-o", tmp_path / "raw", "--docs", "150", check=0)
    extra = tmp_path / "raw" / "extra.jsonl"
    extra.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in EXTRA), encoding="utf-8")
    return sorted((tmp_path / "raw").glob("*.jsonl"))


def test_pipe_into_json2bin_carries_provenance_to_the_sidecar_and_mix_explain(tmp_path):
    import jsonschema

    files = [f for f in corpus(tmp_path) if f.stem != "arith"]  # numbers are no language
    stats = tmp_path / "clean.stats.json"
    pipe = (
        f"{BIN}/llm-prep filter {' '.join(map(str, files))} -o - --stats {stats} --language en "
        f"--pii email,ip --min-chars 10 -q | {BIN}/llm-prep json2bin - -t byte -o {tmp_path}/data/web "
        f"--provenance {stats} -q"
    )
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", pipe], capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()
    record = json.loads(stats.read_text())
    assert record["documents"] == {"in": 153, "kept": 151, "removed": 2, "changed": 1}
    assert set(record["rules"]) == {"language.not_wanted", "length.min_chars"}
    assert record["rules"]["length.min_chars"] == {"documents": 1, "characters": 5, "share": round(1 / 153, 6),
                                                   "character_share": record["rules"]["length.min_chars"]["character_share"]}  # fmt: skip
    assert record["changes"]["pii"]["documents"] == 1 and record["changes"]["pii"]["changes"] == 2
    assert record["languages"]["en"]["kept"] == 151 and record["languages"]["de"] == {"documents": 1, "kept": 0, "characters": 67}
    removed = [json.loads(x) for x in (tmp_path / "clean.removed").read_text().splitlines()]
    assert [(r["source"].endswith("extra.jsonl"), r["line"], r["rule"]) for r in removed] == [
        (True, 1, "language.not_wanted"), (True, 3, "length.min_chars")]  # fmt: skip
    assert removed[0]["id"] == "de-1" and removed[0]["values"]["language"] == "de" and "text" not in removed[0]

    sidecar = json.loads((tmp_path / "data" / "web_text_document.json").read_text())
    jsonschema.validate(sidecar, json.loads((REPO / "schemas" / "sidecar.schema.json").read_text()))
    (stage,) = sidecar["curation"]
    assert stage["documents"] == record["documents"] and stage["rules"] == record["rules"]
    assert stage["output_sha256"] == sidecar["inputs"][0]["sha256"]

    mix = subprocess.run([str(BIN / "llm-mix"), f"{tmp_path}/data/web_text_document", "--seq-length", "32",
                          "--num-samples", "10", "--explain"], capture_output=True, text=True)  # fmt: skip
    assert mix.returncode == 0, mix.stderr
    assert "filter: 153 documents in, 2 removed (1.31%)" in mix.stdout
    assert "language.not_wanted: 1 documents (0.65%)" in mix.stdout and "~ pii: 2 changes in 1 documents" in mix.stdout

    # stats of other bytes are refused in one line
    other = cli("json2bin", files[0], "-t", "byte", "-o", tmp_path / "data" / "x", "--provenance", stats, "-q")
    assert other.returncode == 2 and b"none of the inputs read" in other.stderr
    assert len(other.stderr.splitlines()) == 1 and not list((tmp_path / "data").glob("x*"))


def test_shards_concatenate_to_the_one_machine_output_and_runs_repeat_bytes(tmp_path):
    files = corpus(tmp_path)
    rules = ["--pii", "email,ip", "--max-chars", "300", "--keep-removed-text", "-q"]
    cli("filter", tmp_path / "raw" / "*.jsonl", "-o", tmp_path / "one.jsonl", *rules, check=0)
    for i in range(3):
        cli("filter", *files, "-o", tmp_path / "part.jsonl", "--shard", f"{i}/3", *rules, check=0)
    for suffix in ("", ".removed"):
        whole = (tmp_path / f"one.jsonl{suffix}").read_bytes()
        parts = b"".join((tmp_path / f"part-0000{i}-of-00003.jsonl{suffix}").read_bytes() for i in range(3))
        assert parts == whole and whole
    removed = [json.loads(x) for x in (tmp_path / "one.jsonl.removed").read_text().splitlines()]
    assert removed and all(r["rule"] == "length.max_chars" and len(r["text"]) == r["values"]["characters"] > 300
                           for r in removed)  # fmt: skip
    kept = (tmp_path / "one.jsonl").read_text().splitlines()
    original = {line for f in files for line in f.read_text().splitlines()}
    assert sum(line in original for line in kept) > 100  # untouched records are their input bytes
    assert any("email@example.com" in line for line in kept)

    first = {p: (tmp_path / p).read_bytes() for p in ("one.jsonl", "one.jsonl.removed", "one.jsonl.stats.json")}
    cli("filter", tmp_path / "raw" / "*.jsonl", "-o", tmp_path / "one.jsonl", *rules, check=2)  # exists
    cli("filter", tmp_path / "raw" / "*.jsonl", "-o", tmp_path / "one.jsonl", *rules, "--force", check=0)
    assert {p: (tmp_path / p).read_bytes() for p in first} == first


@pytest.mark.parametrize(
    "line,kind,words",
    [
        (b'{"text": "ok"', "truncated_line", b"bad.jsonl:3: truncated last line"),
        (b'{"text": ""}\n', "empty_text", b"bad.jsonl:3: key 'text' is an empty string"),
        (b'{"body": "x"}\n', "missing_key", b"bad.jsonl:3: missing key 'text'"),
        (b'{"text": "a\xff"}\n', "invalid_utf8", b"bad.jsonl:3:"),
        (b'[1, 2]\n', "not_an_object", b"bad.jsonl:3: expected a JSON object"),
    ],
)
def test_bad_lines_stop_with_file_line_or_are_counted(tmp_path, line, kind, words):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "one two three"}\n\n' + line + b'{"text": "four five six"}\n' * (kind != "truncated_line"))
    out = tmp_path / "out" / "clean.jsonl"
    proc = cli("filter", bad, "-o", out, "--min-chars", "3")
    assert proc.returncode == 2 and words in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert not (tmp_path / "out").exists()
    cli("filter", bad, "-o", out, "--min-chars", "3", "--skip-bad", "-q", check=0)
    stats = json.loads(Path(f"{out}.stats.json").read_text())
    assert stats["skipped"] == {kind: 1, "blank_line": 1}
    assert stats["documents"]["kept"] == 1 + (kind != "truncated_line")


def test_force_replaces_only_our_own_output(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "hello there"}\n')
    foreign = tmp_path / "clean.jsonl"
    foreign.write_text("mine\n")
    proc = cli("filter", src, "-o", foreign, "--min-chars", "1", "--force")
    assert proc.returncode == 2 and b"a file llmtools did not write" in proc.stderr
    assert foreign.read_text() == "mine\n"
    proc = cli("filter", src, "-o", "-", "--min-chars", "1")
    assert proc.returncode == 2 and b"--stats PATH" in proc.stderr


def test_sigterm_mid_run_leaves_nothing(tmp_path):
    proc = subprocess.Popen([str(BIN / "llm-prep"), "filter", "-", "-o", "out/clean.jsonl", "--pii", "email"],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)  # fmt: skip
    proc.stdin.write(b'{"text": "a@b.com is here"}\n' * 2000)
    proc.stdin.flush()
    deadline = time.monotonic() + 60
    while not list((tmp_path / "out").glob("*.tmp-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list((tmp_path / "out").glob("*.tmp-*")), "the run never started writing"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert b"interrupted by SIGTERM" in err
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")
