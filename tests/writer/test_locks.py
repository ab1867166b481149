"""One writer per output: llmtools.locks, and the prep commands that take it (real processes)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmtools.locks import LockHeld, acquire, lock_output, lock_path, read_holder
from tests.writer.conftest import cli, env, snapshot

HOLD = """
import sys, time
from llmtools.locks import lock_output
with lock_output(sys.argv[1], command="holder-for-test"):
    print("held", flush=True)
    time.sleep(600)
"""


def _start_holder(target: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(target)], stdout=subprocess.PIPE, text=True, env=env()
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_held_lock_names_its_holder_and_a_kill_9_frees_it(tmp_path):
    target = tmp_path / "data" / "web_text_document"
    holder = _start_holder(target)
    try:
        with pytest.raises(LockHeld) as refused:
            acquire(lock_path(target), target)
        message = str(refused.value)
        assert message.startswith(
            f"{target}: in use by holder-for-test (pid {holder.pid} on {socket.gethostname()}, started "
        )
        assert str(lock_path(target)) in message
        found = read_holder(lock_path(target))
        assert found is not None and found.pid == holder.pid and found.started[:4].isdigit()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    # The dead holder's lock file is still there; its lock is not.
    assert lock_path(target).exists()
    with lock_output(target) as held:
        assert read_holder(held[0].path).pid == os.getpid()
    assert not lock_path(target).exists()  # released: the file goes with the lock


def test_the_same_process_may_nest_a_lock_it_holds(tmp_path):
    target = tmp_path / "out"
    with lock_output(target), lock_output([target, tmp_path / "other"]):
        assert lock_path(target).exists()
    assert not lock_path(target).exists() and not lock_path(tmp_path / "other").exists()


def test_a_forked_worker_does_not_keep_the_lock(tmp_path):
    """A worker forked while the lock is held (a json2bin pool) must not hold it once its parent lets go."""
    target = tmp_path / "out"
    with lock_output(target):
        pid = os.fork()
        if pid == 0:  # the child outlives the lock's owner by a while, as an orphaned worker would
            time.sleep(5)
            os._exit(0)
    try:
        with lock_output(target):  # the child is still alive here
            assert os.waitpid(pid, os.WNOHANG) == (0, 0)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _decode(prefix: Path) -> bytes:
    from llmtools.formats.indexed import IndexedDatasetReader

    reader = IndexedDatasetReader(prefix)
    return bytes(int(t) for t in reader.tokens())  # the byte tokenizer's ids are the bytes


def test_two_json2bin_on_one_prefix_started_together(tmp_path):
    """Both start at once; the one that gets the lock writes, the other exits 2 naming it, nothing is
    overwritten. Each reads its stdin, which stays open until the race is decided, so they truly overlap."""
    out = tmp_path / "data" / "corpus"
    command = [*cli("prep"), "json2bin", "-", "-t", "byte", "-o", str(out), "-q"]
    procs = [
        subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env())
        for _ in range(2)
    ]  # fmt: skip
    try:
        deadline = time.time() + 120
        while all(p.poll() is None for p in procs) and time.time() < deadline:
            time.sleep(0.05)
        losers = [p for p in procs if p.poll() is not None]
        assert len(losers) == 1, "exactly one writer is refused while the other holds the prefix"
        loser = losers[0]
        winner = procs[1 - procs.index(loser)]
        _, err = loser.communicate(timeout=60)
        assert loser.returncode == 2
        prefix = f"{out}_text_document"
        assert err.strip().startswith(f"llm-prep: error: {prefix}: in use by ")
        assert f"(pid {winner.pid} on {socket.gethostname()}, started " in err and "Traceback" not in err
        # the winner's temporaries and the lock only: nothing that looks finished
        assert not [p for p in out.parent.iterdir() if ".tmp-" not in p.name and not p.name.endswith(".lock")]
        text = f"written by {winner.pid}"
        _, err = winner.communicate(input=f'{{"text": "{text}"}}\n', timeout=120)
        assert winner.returncode == 0, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert _decode(Path(f"{out}_text_document")) == text.encode()
    assert sorted(p.name for p in out.parent.iterdir()) == [
        "corpus_text_document.bin", "corpus_text_document.idx", "corpus_text_document.json"
    ]  # fmt: skip


@pytest.mark.parametrize(
    "command",
    [
        ["prep", "tokenizer", "train", "{input}", "--vocab-size", "300", "-o", "{target}"],
        ["prep", "sample-corpus", "-o", "{folder}", "--docs", "2", "--style", "arith"],
        ["mix", "{prefix}", "--seq-length", "8", "--num-samples", "4", "-o", "{target}"],
        ["export", "hf", "{prefix}", "-o", "{target}"],
        ["ckpt", "import-hf", "{folder}", "-o", "{target}"],
    ],
    ids=["tokenizer", "sample-corpus", "mix", "export", "import-hf"],
)
def test_every_writing_command_refuses_a_held_output(tmp_path, command):
    """The lock is taken before anything else: with the output held, each writer exits 2 naming the
    holder and leaves the folder as it was."""
    import numpy as np

    from llmtools.formats.indexed import IndexedDatasetWriter

    prefix = tmp_path / "src_text_document"
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        writer.add_document(np.arange(1, 40, dtype=np.uint16))
    (tmp_path / "in.jsonl").write_text('{"text": "hello"}\n')
    folder = tmp_path / "out"
    target = folder / "arith.jsonl" if "sample-corpus" in command else tmp_path / "target"
    if "import-hf" in command:
        folder.mkdir()
    args = [
        a.format(input=tmp_path / "in.jsonl", target=target, folder=folder, prefix=prefix) for a in command
    ]
    holder = _start_holder(target)
    try:
        before = snapshot(tmp_path)
        done = subprocess.run(
            [*cli(args[0]), *args[1:]], capture_output=True, text=True, env=env(), timeout=120
        )
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert done.returncode == 2, done.stderr
    assert f"{target}: in use by holder-for-test (pid {holder.pid} on " in done.stderr
    assert snapshot(tmp_path) == before
