"""End-to-end: the real `llm-log` command in a subprocess (exit codes, stdout, stderr, files)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.logs.helpers import FIXTURES, expected, f32, raw_points, scalars


def llm_log(args, cli_env, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "llmtools.cli.log", *map(str, args)],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=120,
        **kwargs,
    )


def test_help_has_examples_and_imports_nothing_heavy(cli_env):
    for command in ("tb", "wandb", "mlflow", "plot", "summary"):
        result = llm_log([command, "--help"], cli_env)
        assert (
            result.returncode == 0 and "Examples:" in result.stdout and "llm-log " + command in result.stdout
        )
    probe = "import sys, llmtools.cli.log; print(sorted(m for m in ('torch', 'matplotlib', 'tensorboard', 'numpy', 'wandb', 'mlflow') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=cli_env, check=True
    )
    assert out.stdout.strip() == "[]"


def test_tb_prints_event_files_and_is_idempotent(tmp_path, cli_env):
    logs = [FIXTURES / "metrics.jsonl", FIXTURES / "megatron.log"]
    first = llm_log(["tb", *logs, "--logdir", tmp_path], cli_env)
    assert first.returncode == 0, first.stderr
    paths = first.stdout.splitlines()
    assert [p.split("/")[-2] for p in paths] == ["fixtures", "megatron"]
    assert "llm-log: 115 lines read: 85 train, 6 eval, 5 event, 19 other" in first.stderr
    before = raw_points(tmp_path / "megatron")
    second = llm_log(["tb", *logs, "--logdir", tmp_path, "--json"], cli_env)
    assert second.returncode == 0
    report = json.loads(second.stdout)
    assert {name: run["points"] for name, run in report["runs"].items()} == {"fixtures": 0, "megatron": 0}
    assert raw_points(tmp_path / "megatron") == before
    got = scalars(tmp_path / "fixtures")
    for tag, points in expected("metrics").items():
        assert {s: got[tag][s] for s in points} == {s: f32(v) for s, v in points.items()}


def test_tb_from_stdin(tmp_path, cli_env):
    data = (FIXTURES / "deepspeed_pipe.log").read_text()
    result = llm_log(["tb", "-", "--logdir", tmp_path, "--run", "pipe"], cli_env, input=data)
    assert result.returncode == 0, result.stderr
    assert scalars(tmp_path / "pipe")["train/loss"] == {
        s: f32(v) for s, v in expected("deepspeed_pipe")["train/loss"].items()
    }


def test_binary_garbage_exits_2_with_one_line(tmp_path, cli_env):
    garbage = tmp_path / "model.safetensors"
    garbage.write_bytes(b"\x00\x10\xff" * 5000)
    result = llm_log(["tb", garbage, "--logdir", tmp_path / "tb"], cli_env)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"llm-log: error: {garbage}: binary data, not a text training log")
    for command in (["summary", garbage], ["plot", garbage, "-o", tmp_path / "x.png"]):
        result = llm_log(command, cli_env)
        assert result.returncode == 2 and "binary data" in result.stderr and "Traceback" not in result.stderr


def test_torn_last_line_warns_and_succeeds(tmp_path, cli_env):
    log = tmp_path / "run" / "metrics.jsonl"
    log.parent.mkdir()
    text = (FIXTURES / "metrics.jsonl").read_text()
    log.write_text(text[:-40])
    result = llm_log(["tb", log, "--logdir", tmp_path / "tb"], cli_env)
    assert result.returncode == 0
    lines = len(text[:-40].splitlines())
    assert f"warning: {log}:{lines}: last line has no newline" in result.stderr
    assert "1 torn" in result.stderr
    summary = llm_log(["summary", log, "--json"], cli_env)
    assert summary.returncode == 0 and json.loads(summary.stdout)[0]["lines"]["torn"] == 1


def test_missing_file_and_bad_options_exit_2(tmp_path, cli_env):
    result = llm_log(["tb", tmp_path / "nope.log", "--logdir", tmp_path], cli_env)
    assert result.returncode == 2 and "nope.log: no such file" in result.stderr
    result = llm_log(["tb", FIXTURES / "generic.log", "--logdir", tmp_path, "--format", "xml"], cli_env)
    assert result.returncode == 2 and "--format" in result.stderr


def test_summary_table_and_json(cli_env):
    table = llm_log(["summary", FIXTURES / "megatron.log", FIXTURES / "mindformers.log"], cli_env)
    assert table.returncode == 0
    assert "resumes / gaps       1 / 0: 150->110 (resume)" in table.stdout
    data = json.loads(
        llm_log(["summary", FIXTURES / "metrics.jsonl", "--json", "--name", "tiny"], cli_env).stdout
    )
    assert data[0]["run"] == "tiny" and data[0]["spike_steps"] == [37]


def test_plot_writes_png_and_refuses_overwrite(tmp_path, cli_env):
    out = tmp_path / "curves.png"
    result = llm_log(
        ["plot", FIXTURES / "metrics.jsonl", FIXTURES / "mindformers.log", "-o", out, "--dpi", "40"], cli_env
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(out) and out.stat().st_size > 10_000
    again = llm_log(["plot", FIXTURES / "metrics.jsonl", "-o", out], cli_env)
    assert again.returncode == 2 and "already exists" in again.stderr


@pytest.mark.slow
def test_follow_three_bursts_and_ctrl_c(tmp_path, cli_env):
    text = (FIXTURES / "megatron.log").read_text()
    log = tmp_path / "train.log"
    log.write_text("")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmtools.cli.log",
            "tb",
            str(log),
            "--logdir",
            str(tmp_path / "tb"),
            "--follow",
            "--poll",
            "0.05",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env,
    )
    try:
        # Following once its first (empty) commit is there: its Ctrl-C handler is in place by then,
        # however long a loaded machine takes to start Python.
        state = tmp_path / "tb" / "train" / ".llm-log-state.json"
        deadline = time.monotonic() + 120
        while not state.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        thirds = [0, len(text) // 3 + 7, 2 * len(text) // 3 + 3, len(text)]
        for start, stop in zip(thirds, thirds[1:], strict=False):
            with open(log, "a") as handle:
                handle.write(text[start:stop])
            time.sleep(0.4)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, err  # stopped by a signal, as every command
    assert "stopping" in err and "Traceback" not in err
    assert out.strip().endswith(".llmtools")
    got = scalars(tmp_path / "tb" / "train")
    for tag, points in expected("megatron").items():
        assert {s: got[tag][s] for s in points} == {s: f32(v) for s, v in points.items()}, tag
