"""stdout holds results only: every command that has ``--json`` prints exactly one JSON document there
(``llm-prep cat --json``: one per line), whatever the libraries it loads print; llm-train included, as a
dry run and as real 3-step runs with one process and with two under torchrun (DeepSpeed's accelerator
banner and its logs go to stderr)."""

from __future__ import annotations

import json
import os
import pty
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.contract.conftest import BIN, REPO, contract_env, run_cli, script
from tests.ports import free_port

DS = REPO / "configs" / "deepspeed"


def _user_env() -> dict[str, str]:
    """As a user runs the commands: DS_ACCELERATOR unset (DeepSpeed then detects the CPU, and says so in
    a warning that its logger would print on stdout)."""
    env = contract_env()
    env.pop("DS_ACCELERATOR")
    return env


def _json(proc, lines: bool = False):
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 0, err[-3000:]
    if lines:
        return [json.loads(line) for line in out.splitlines()]
    return json.loads(out)  # the whole of stdout: one document, nothing before or after it


def _commands(w, t: Path) -> dict[str, list]:
    """Every (command, subcommand) with --json, on the contract world's files, writing under ``t``."""
    (t / "prefs.jsonl").write_text(
        "".join(
            json.dumps({"prompt": f"{i} + {i}?", "chosen": f"{2 * i}", "rejected": "no"}) + "\n"
            for i in range(8)
        )
    )
    for name in ("a", "b"):
        for suffix in (".bin", ".idx", ".json"):
            shutil.copy(f"{w.prefix}{suffix}", t / f"{name}_text_document{suffix}")
    return {
        "prep json2bin": ["llm-prep", "json2bin", w.corpus, "-t", "byte", "-o", t / "j", "--json"],
        "prep tokenizer train": ["llm-prep", "tokenizer", "train", w.corpus, "--vocab-size", "300", "-o", t / "tok.json", "--json"],
        "prep inspect": ["llm-prep", "inspect", w.prefix, "--json"],
        "prep merge": ["llm-prep", "merge", t / "a_text_document", t / "b_text_document", "-o", t / "ab_text_document", "--json"],
        "prep hf2bin": ["llm-prep", "hf2bin", w.hf, "-o", t / "h", "--json"],
        "prep sft": ["llm-prep", "sft", w.chats, "-t", "byte", "--chat-template", "chatml", "-o", t / "sft", "--json"],
        "prep pref": ["llm-prep", "pref", t / "prefs.jsonl", "-t", "byte", "--chat-template", "chatml", "-o", t / "pref", "--json"],
        "mix": ["llm-mix", w.prefix, "--seq-length", "16", "--num-samples", "32", "-o", t / "mix" / "mix.json", "--json"],
        "export hf": ["llm-export", "hf", w.prefix, "-o", t / "hf", "--json"],
        "ckpt list": ["llm-ckpt", "list", w.run, "--json"],
        "ckpt verify": ["llm-ckpt", "verify", w.checkpoint, "--json"],
        "ckpt inspect": ["llm-ckpt", "inspect", w.checkpoint, "--json"],
        "log tb": ["llm-log", "tb", w.metrics, "--logdir", t / "tb", "--json"],
        "log summary": ["llm-log", "summary", w.metrics, "--json"],
        "train --dry-run": ["llm-train", w.tiny_yaml, "--deepspeed", DS / "zero1.json", "--dry-run", "--json"],
    }  # fmt: skip


def test_every_json_output_is_json_alone(world, tmp_path):
    bad = {}
    for name, argv in _commands(world, tmp_path).items():
        proc = run_cli(argv, tmp_path, timeout=300, env=_user_env())
        try:
            _json(proc)
        except (AssertionError, json.JSONDecodeError) as error:
            bad[name] = f"{error}: {proc.stdout.decode()[:300]!r}"
    cat = run_cli(["llm-prep", "cat", world.prefix, "--json"], tmp_path, env=_user_env())
    assert len(_json(cat, lines=True)) == 300
    assert bad == {}


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_real_training_prints_its_result_alone(world, tmp_path, nproc):
    train = [world.tiny_yaml, "--deepspeed", DS / "zero1.json", "-o", tmp_path / "run", "--json",
             "--set", "training.train_steps=3", "--set", "training.micro_batch_size=1"]  # fmt: skip
    if nproc == 1:
        argv = ["llm-train", *train]
    else:
        argv = [BIN / "torchrun", "--nproc_per_node", "2", "--master_port", str(free_port()),
                "-m", "llmtools.cli.train", *train]  # fmt: skip
    proc = run_cli(argv, tmp_path, timeout=600, env=_user_env())
    result = _json(proc)
    assert result["steps"] == 3 and result["checkpoint"].endswith("step_00000003")
    # the progress lines (stderr) carry the time so far and the time left
    assert re.search(r"step +3/3 \|.* \| elapsed \d+:\d\d eta 0:00", proc.stderr.decode()), (
        proc.stderr.decode()
    )


def test_hashing_reports_rate_and_time_left_off_a_terminal(world, tmp_path):
    """Off a terminal, long work prints a plain progress line every LLMTOOLS_PROGRESS_INTERVAL seconds (0
    here: every chunk), with the rate and the time left; stdout keeps the result alone."""
    proc = run_cli(["llm-ckpt", "verify", world.checkpoint, "--json"], tmp_path,
                   env=contract_env(LLMTOOLS_PROGRESS_INTERVAL="0"))  # fmt: skip
    _json(proc)
    lines = [line for line in proc.stderr.decode().splitlines() if line.startswith("sha256 step_00000002")]
    assert lines and re.search(r"\[\d\d:\d\d<\d\d:\d\d, .*B/s\]", lines[-1]), proc.stderr.decode()


# The label of each long command's progress lines, and the command (from _commands) that shows it.
PROGRESS = {
    "prep json2bin": "json2bin",
    "prep tokenizer train": "tokenizer: read",
    "prep merge": "merge",
    "prep hf2bin": "hf2bin",
    "mix": "mix train indices",
    "export hf": "export",
}
# tqdm's meter: [elapsed<left, rate] (a rate such as 1.2MB/s, 3.40source/s or 512tok/s).
METER = re.compile(r"\[\d\d:\d\d<\d\d:\d\d, [\d.]+[kMGT]?(B|[a-z]+)/s")


def test_long_commands_report_rate_and_time_left_off_a_terminal(world, tmp_path):
    """Each long command, off a terminal and with LLMTOOLS_PROGRESS_INTERVAL=0 (a line per update),
    prints progress lines with the rate and the time left on stderr, and only its result on stdout."""
    env = contract_env(LLMTOOLS_PROGRESS_INTERVAL="0")
    commands = _commands(world, tmp_path)
    runs = {name: (commands[name], label) for name, label in PROGRESS.items()}
    runs["ckpt convert"] = (
        ["llm-ckpt", "convert", world.checkpoint, "--to", "hf", "-o", tmp_path / "c"],
        "convert",
    )
    # after the convert above: its HF folder is the import's input
    runs["ckpt import-hf"] = (["llm-ckpt", "import-hf", tmp_path / "c", "-o", tmp_path / "i"], "import-hf")
    missing = {}
    for name, (argv, label) in runs.items():
        proc = run_cli(argv, tmp_path, env=env)
        if name.startswith("ckpt "):
            output = argv[argv.index("-o") + 1]
            assert proc.returncode == 0 and proc.stdout.decode() == f"{output}\n", proc.stderr.decode()
        else:
            _json(proc)
        lines = [line for line in proc.stderr.decode().splitlines() if line.startswith(f"{label}:")]
        if not lines or not METER.search(lines[-1]):
            missing[name] = proc.stderr.decode()[-1000:]
    assert missing == {}


def test_a_terminal_gets_a_bar(world, tmp_path):
    """With stderr on a terminal the same progress is tqdm's bar (drawn with \\r), and stdout still holds
    the result alone."""
    leader, follower = pty.openpty()
    out = tmp_path / "hf"
    proc = subprocess.Popen([script("llm-export"), "hf", str(world.prefix), "-o", str(out)], cwd=tmp_path,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=follower, env=contract_env())  # fmt: skip
    os.close(follower)
    drawn = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the command closed its end
            break
        if not chunk:
            break
        drawn += chunk
    os.close(leader)
    stdout = proc.communicate(timeout=240)[0].decode()
    assert proc.returncode == 0 and stdout == f"{out}\n", drawn.decode(errors="replace")
    assert re.search(rb"\rexport: +\d+%\|.*\| [\d.]+[kM]?/[\d.]+[kM]?", drawn), drawn.decode(errors="replace")
