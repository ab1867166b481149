"""SIGTERM / SIGINT / SIGHUP in the middle of every long command (llm-train has its own handling: it saves).

Each case starts the real console script with a pause injected at a point where its work is provably
half done (``hooks/sitecustomize.py``: after the first batch reached the writer's temporaries, after
the first shard or event was written...), waits for the pause, sends the signal, and asserts: exit
128 + the signal (143, 130, 129), one line on stderr saying so, and the command's folder exactly as it
was before — no temporary, no output, inputs and earlier outputs unchanged. A case with stdin blocks on
its input instead, with no pause at all: the plain situation of a pipeline stopped by ``timeout``.

``kill -9`` cannot be handled; for it the guarantee is weaker and tested too: what a killed
``llm-mix --materialize`` leaves never looks finished, so a re-run is not refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import SHARED_DATA
from tests.contract.conftest import (
    HOOKS,
    REPO,
    World,
    changes,
    contract_env,
    script,
    start_cli,
    temporaries,
    tree_state,
)
from tests.contract.test_bad_inputs import BIG, CHAT, PAIR, copy_world_prefix, lines

DS = REPO / "configs" / "deepspeed"
WRITER = "llmtools.formats.indexed:IndexedDatasetWriter"


@dataclass
class Case:
    name: str
    argv: list[str]
    pause: str | None  # module:Qualified.name[@N], or None: the case blocks on stdin
    signum: int = signal.SIGTERM
    files: dict[str, bytes] = field(default_factory=dict)
    copies: tuple[str, ...] = ()  # copies of the world's dataset (prefixes in the folder)

    @property
    def code(self) -> int:
        return 128 + self.signum


CASES = [
    Case(
        "json2bin",
        ["llm-prep", "json2bin", "big.jsonl", "-t", "{w.gpt2}", "-o", "out/x"],
        f"{WRITER}.add_documents",
        files={"big.jsonl": BIG},
    ),
    Case(
        "json2bin-sigint",
        ["llm-prep", "json2bin", "big.jsonl", "-t", "byte", "-o", "out/x"],
        f"{WRITER}.add_documents",
        signal.SIGINT,
        files={"big.jsonl": BIG},
    ),
    Case(
        "json2bin-sighup-processes",
        [
            "llm-prep",
            "json2bin",
            "big.jsonl",
            "-t",
            "{w.gpt2}",
            "-o",
            "out/x",
            "--backend",
            "tokenizers",
            "--workers",
            "2",
        ],
        f"{WRITER}.add_documents",
        signal.SIGHUP,
        files={"big.jsonl": BIG},
    ),
    Case("json2bin-stdin", ["llm-prep", "json2bin", "-", "-t", "{w.gpt2}", "-o", "out/x"], None),
    # every mode of reading a stream: with worker processes, and a pipe given as a path (as <(...) is)
    Case(
        "json2bin-stdin-workers",
        ["llm-prep", "json2bin", "-", "-t", "{w.gpt2}", "-o", "out/x", "--workers", "3"],
        None,
    ),
    Case(
        "json2bin-pipe-path",
        ["llm-prep", "json2bin", "/dev/stdin", "-t", "byte", "-o", "out/x", "--workers", "2"],
        None,
        signal.SIGINT,
    ),
    Case(
        "sft",
        ["llm-prep", "sft", "chats.jsonl", "-t", "byte", "--chat-template", "chatml", "-o", "out/s"],
        f"{WRITER}.add_document@3",
        files={"chats.jsonl": lines(*[CHAT] * 50)},
    ),
    Case(
        "sft-stdin",
        ["llm-prep", "sft", "-", "-t", "byte", "--chat-template", "chatml", "-o", "out/s"],
        None,
        signal.SIGINT,
    ),
    Case(
        "pref",
        ["llm-prep", "pref", "pairs.jsonl", "-t", "byte", "--chat-template", "chatml", "-o", "out/p"],
        f"{WRITER}.add_document@6",  # the second pair half written: two of four datasets have it
        files={"pairs.jsonl": lines(*[PAIR] * 50)},
    ),
    Case(
        "merge",
        ["llm-prep", "merge", "a", "b", "c", "-o", "out/m"],
        f"{WRITER}.add_index@2",  # two of three inputs copied into the temporaries
        copies=("a", "b", "c"),
    ),
    Case("hf2bin", ["llm-prep", "hf2bin", "{w.hf}", "-o", "out/h"], f"{WRITER}.add_documents"),
    Case(
        "tokenizer-train",
        ["llm-prep", "tokenizer", "train", "big.jsonl", "--vocab-size", "300", "-o", "tok/tokenizer.json"],
        "llmtools.fsutil:tmp_sibling",
        files={"big.jsonl": BIG},
    ),
    Case(
        "sample-corpus",
        ["llm-prep", "sample-corpus", "-o", "raw", "--docs", "50"],
        "llmtools.fsutil:tmp_sibling@2",
    ),
    Case(
        "mix",
        ["llm-mix", "{w.prefix}", "--seq-length", "16", "--num-samples", "64", "-o", "out/mix.json"],
        "llmtools.fsutil:tmp_sibling@3",
    ),
    Case(
        "mix-materialize",
        [
            "llm-mix",
            "{w.prefix}",
            "--seq-length",
            "16",
            "--num-samples",
            "64",
            "-o",
            "out/mix.json",
            "--materialize",
            "out/samples",
        ],
        f"{WRITER}.add_documents",
    ),
    Case(
        "export",
        ["llm-export", "hf", "{w.prefix}", "-o", "out/hf"],
        "llmtools.export.hf_export:_ShardWriter.write",
    ),
    Case(
        "export-sigint",
        ["llm-export", "hf", "{w.prefix}", "-o", "out/pq", "--format", "parquet"],
        "llmtools.export.hf_export:_ShardWriter.write",
        signal.SIGINT,
    ),
    Case(
        "convert-hf",
        ["llm-ckpt", "convert", "{w.run}", "--to", "hf", "-o", "out/hf"],
        "llmtools.model.hf:write_safetensors",
    ),
    Case(
        "convert-safetensors",
        ["llm-ckpt", "convert", "{w.run}", "--to", "safetensors", "-o", "out/m.safetensors"],
        "llmtools.model.hf:_write_safetensors",
    ),
    Case(
        "convert-universal",
        ["llm-ckpt", "convert", "{w.checkpoint}", "--to", "universal", "-o", "out/univ"],
        "llmtools.fsutil:tmp_folder",
    ),
    Case(
        "log-tb",
        ["llm-log", "tb", "{w.metrics}", "--logdir", "tb"],
        "llmtools.logs.tfevents:EventFileWriter.write@2",
    ),
    Case("log-tb-stdin", ["llm-log", "tb", "-", "--logdir", "tb", "--run", "piped"], None),
    Case(
        "log-plot",
        ["llm-log", "plot", "{w.metrics}", "-o", "plots/curves.png"],
        "llmtools.fsutil:tmp_sibling",
    ),
]


def _feed(stdin) -> None:
    block = lines(*[{"text": "x " * 50, **CHAT}] * 100)
    with contextlib.suppress(BrokenPipeError):
        for _ in range(max(1, (512 << 10) // len(block))):
            stdin.write(block)
            stdin.flush()


def run_case(case: Case, d: Path, w: World, mark: Path):
    copy_world_prefix(case.copies, d, w)
    for relative, content in case.files.items():
        (d / relative).parent.mkdir(parents=True, exist_ok=True)
        (d / relative).write_bytes(content)
    before = tree_state(d)
    argv = [a.format(w=w) if "{w." in a else a for a in case.argv]
    env = contract_env()
    if case.pause:
        env.update(PYTHONPATH=f"{HOOKS}{os.pathsep}{env['PYTHONPATH']}", LLMTOOLS_TEST_PAUSE=case.pause,
                   LLMTOOLS_TEST_PAUSE_MARK=str(mark))  # fmt: skip
    proc = start_cli(argv, d, env=env, stdin=subprocess.PIPE)
    try:
        if case.pause:
            deadline = time.monotonic() + 180
            while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            paused = mark.exists()
        else:
            # 512 KB through a 64 KB pipe: once written, the command is past its start-up and reading;
            # then nothing more comes (the pipe stays open) and it blocks on stdin, as behind `timeout`.
            feed = threading.Thread(target=_feed, args=(proc.stdin,), daemon=True)
            feed.start()
            feed.join(timeout=180)
            time.sleep(1.0)
            paused = not feed.is_alive() and proc.poll() is None
        in_flight = temporaries(d)
        proc.send_signal(case.signum)
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            err = _diagnose_stuck(proc, case).encode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return {"code": proc.returncode, "err": err.decode("utf-8", "replace"), "paused": paused,
            "in_flight": in_flight, "changes": changes(before, tree_state(d))}  # fmt: skip


def _diagnose_stuck(proc: subprocess.Popen, case: Case) -> str:
    """What a command that outlived its signal was doing: its signal masks, then every thread's stack
    (the pause hook dumps them on SIGUSR2). A failure of one case, not an error of the whole module."""
    try:
        status = Path(f"/proc/{proc.pid}/status").read_text()
        masks = " ".join(line.replace("\t", "") for line in status.splitlines() if line.startswith("Sig"))
    except OSError as error:
        masks = f"(no /proc status: {error})"
    ours = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    report = [f"still running 120 s after {signal.Signals(case.signum).name}; its {masks}; "
              f"blocked in the test's thread: {sorted(s.name for s in ours) or 'none'}"]  # fmt: skip
    if case.pause:  # the hook that pauses also dumps the stacks
        proc.send_signal(signal.SIGUSR2)
        time.sleep(2)
    proc.kill()
    _, err = proc.communicate()
    return "\n".join([*report, err.decode("utf-8", "replace")])


@pytest.fixture(scope="module")
def outcomes(world, tmp_path_factory, request):
    root = tmp_path_factory.mktemp("signals")
    selected = {
        item.callspec.params["case"].name
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_signal_cleans_up"
    } or {case.name for case in CASES}

    def one(case: Case):
        d = root / case.name
        d.mkdir()
        return case.name, run_case(case, d, world, root / f"{case.name}.paused")

    with ThreadPoolExecutor(max_workers=max(2, min(6, (os.cpu_count() or 2) + 1))) as pool:
        return dict(pool.map(one, [case for case in CASES if case.name in selected]))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_signal_cleans_up(case: Case, outcomes):
    got = outcomes[case.name]
    assert got["paused"], f"the command never reached its pause point:\n{got['err'][-2000:]}"
    assert got["code"] == case.code, f"exit {got['code']}, expected {case.code}:\n{got['err'][-2000:]}"
    lines_ = [line for line in got["err"].splitlines() if line.strip()]
    assert len(lines_) == 1 and "Traceback" not in got["err"], got["err"]
    assert f"interrupted by {signal.Signals(case.signum).name}" in lines_[0]
    assert got["changes"] == [], "left behind or changed"


def test_the_pause_was_mid_write(outcomes):
    """The cases really interrupt work in progress: most had temporaries on disk when signalled."""
    with_temporaries = [name for name, got in outcomes.items() if got["in_flight"]]
    assert len(with_temporaries) >= len(CASES) // 2, with_temporaries


def test_a_command_started_with_its_signals_blocked_still_stops(world, tmp_path):
    """A blocked signal mask survives exec, and a launcher may hand one down: the command unblocks the
    signals it handles, so SIGTERM still stops it cleanly instead of waiting for a kill -9."""
    block = ("import os, signal, sys; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGHUP});"
             " os.execv(sys.argv[1], sys.argv[1:])")  # fmt: skip
    argv = [sys.executable, "-c", block, script("llm-log"), "tb", "{w.metrics}", "--logdir", "tb"]
    case = Case("log-tb-blocked", argv, "llmtools.logs.tfevents:EventFileWriter.write@2")
    (tmp_path / "d").mkdir()
    got = run_case(case, tmp_path / "d", world, tmp_path / "paused")
    assert got["paused"], got["err"]
    assert got["code"] == 143, got["err"]
    assert "interrupted by SIGTERM" in got["err"] and got["changes"] == [], got


def test_kill_9_during_materialize_leaves_nothing_that_looks_finished(world, tmp_path):
    """mix.json is written after the samples it goes with: a kill -9 while they are written leaves no
    mix.json and no samples (only .tmp- files), and the same command then runs without --force."""
    mark = tmp_path / "paused"
    argv = ["llm-mix", world.prefix, "--seq-length", "16", "--num-samples", "64", "-o", "out/mix.json",
            "--materialize", "out/samples"]  # fmt: skip
    env = contract_env()
    env.update(PYTHONPATH=f"{HOOKS}{os.pathsep}{env['PYTHONPATH']}", LLMTOOLS_TEST_PAUSE=f"{WRITER}.add_documents",
               LLMTOOLS_TEST_PAUSE_MARK=str(mark))  # fmt: skip
    proc = start_cli(argv, tmp_path, env=env)
    deadline = time.monotonic() + 180
    while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert mark.exists(), proc.stderr.read().decode()
    proc.kill()
    proc.wait()
    out = tmp_path / "out"
    assert not (out / "mix.json").exists()
    assert not (out / "samples.bin").exists() and not (out / "samples.idx").exists()
    again = start_cli(argv, tmp_path)
    _, err = again.communicate(timeout=180)
    assert again.returncode == 0, err.decode()
    assert (out / "mix.json").exists() and (out / "samples.idx").exists()


def test_a_signal_inside_one_long_native_call_ends_the_command_within_the_bound(world, tmp_path):
    """Python runs a signal handler only between bytecodes: one document of 64 MB is tens of seconds
    inside ``tokenizers``' encoding in the main process, where a scheduler's grace period would run out
    and its kill -9 leave the temporaries and the lock file behind. The watchdog ends the command
    ``STOP_BOUND_S`` after the signal: exit 143, one line, nothing left."""
    from llmtools.interrupt import STOP_BOUND_S

    text = (SHARED_DATA / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    document = json.dumps({"text": (text * (64_000_000 // len(text) + 1))[:64_000_000]}).encode() + b"\n"
    argv = ["llm-prep", "json2bin", "-", "-t", str(world.gpt2), "--backend", "tokenizers", "--workers", "1",
            "-o", "out/x"]  # fmt: skip
    before = tree_state(tmp_path)
    proc = start_cli(argv, tmp_path, stdin=subprocess.PIPE)
    try:
        proc.stdin.write(document)
        proc.stdin.close()  # read to the end: from here on the command parses, then encodes, one document
        time.sleep(2.0)
        assert proc.poll() is None, proc.stderr.read().decode()
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)  # a line or two on stderr: no pipe fills meanwhile
        took = time.monotonic() - signalled
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines_ = [line for line in err.decode("utf-8", "replace").splitlines() if line.strip()]
    assert proc.returncode == 143, err.decode()[-2000:]
    assert len(lines_) == 1 and "interrupted by SIGTERM" in lines_[0], lines_
    assert took < STOP_BOUND_S + 10, f"ended {took:.1f} s after SIGTERM"
    assert changes(before, tree_state(tmp_path)) == [], "left behind"
