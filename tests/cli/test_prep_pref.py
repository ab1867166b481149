"""`llm-prep pref`: the real command, its outputs, bad input (exit 2, file:line, nothing written), --force."""

from __future__ import annotations

import json
import subprocess

from tests.conftest import run_cli_inproc

GOOD = {"prompt": "Name a colour", "chosen": "Blue.", "rejected": "Seven."}


def _jsonl(path, lines):
    path.write_text(
        "".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines), encoding="utf-8"
    )
    return path


def test_real_command_writes_four_aligned_datasets(python, cli_env, tmp_path):
    src = _jsonl(tmp_path / "pairs.jsonl", [GOOD] * 3)
    out = tmp_path / "d" / "pref"
    proc = subprocess.run(
        [python, "-m", "llmtools.cli.prep", "pref", str(src), "-t", "byte", "--chat-template", "chatml",
         "-o", str(out), "--max-length", "160", "--max-prompt-length", "100"],
        capture_output=True, text=True, env=cli_env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    paths = proc.stdout.split()
    assert len(paths) == 12 and all((tmp_path / "d" / p.rsplit("/", 1)[1]).is_file() for p in paths)
    assert {p.rsplit("/", 1)[1].split("_document")[0] for p in paths} == {
        "pref_chosen_input_ids", "pref_chosen_loss_mask", "pref_rejected_input_ids", "pref_rejected_loss_mask"
    }  # fmt: skip
    assert "llm-prep pref: 3 pairs" in proc.stderr


def test_a_bad_line_exits_2_naming_the_place_and_writes_nothing(python, cli_env, tmp_path):
    src = _jsonl(tmp_path / "pairs.jsonl", [GOOD, {"prompt": "q", "chosen": "a", "rejected": [GOOD]}])
    out = tmp_path / "d" / "pref"
    proc = subprocess.run(
        [python, "-m", "llmtools.cli.prep", "pref", str(src), "-t", "byte", "--chat-template", "chatml", "-o", str(out)],
        capture_output=True, text=True, env=cli_env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert f"{src}:2: [chosen] and [rejected]: one is a string" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not (tmp_path / "d").exists() or not list((tmp_path / "d").iterdir())


def test_json_summary_skip_bad_and_refusal_to_overwrite(capsys, monkeypatch, tmp_path):
    src = _jsonl(tmp_path / "pairs.jsonl", [GOOD, "{oops", GOOD])
    args = (
        "pref",
        src,
        "-t",
        "byte",
        "--chat-template",
        "llama3",
        "-o",
        tmp_path / "o",
        "--json",
        "-q",
        "--skip-bad",
    )
    proc = run_cli_inproc(capsys, monkeypatch, "prep", *args)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert (
        summary["pairs"] == 2 and summary["skipped"] == {"malformed_json": 1} and len(summary["paths"]) == 12
    )
    proc = run_cli_inproc(capsys, monkeypatch, "prep", *args)
    assert proc.returncode == 2 and "already exists (use --force" in proc.stderr
    assert run_cli_inproc(capsys, monkeypatch, "prep", *args, "--force").returncode == 0


def test_help_states_the_shapes_and_the_truncation_rules(capsys, monkeypatch):
    proc = run_cli_inproc(capsys, monkeypatch, "prep", "pref", "--help")
    assert proc.returncode == 0 and "Examples:" in proc.stdout
    assert (
        "--max-prompt-length" in proc.stdout
        and "keep_start" in proc.stdout
        and "implicit prompt" in proc.stdout
    )
