"""A signal stops a checkpoint reader inside unpickling within the interrupt bound: exit 128 + the signal,
our one line, no traceback, nothing left behind.

The pickle is large but allowed (:func:`tests.trust.bombs.storage_refs_item`: 300,000 references to one
storage, 1.7 MB; nothing hashed, nothing nested): every bound of ``picklebounds`` passes, and it takes
seconds to check and seconds to unpickle (measured on a loaded 2-core machine: 10-20 s to check, the
walk of its tree included, and 5-10 s to unpickle by the lazy reader of ``verify`` and ``inspect``). Both
phases are pure Python, so the handler runs between two opcodes.

Where the signal lands is not left to timing. The check and the unpickling of a pickle this large report
their progress on stderr (``check FILE:data.pkl`` lines, then ``unpickle FILE:data.pkl`` lines, one every
``LLMTOOLS_PROGRESS_INTERVAL`` seconds; the check alone is as long as the unpickling, so a signal sent
after a guessed delay would most often land in the check). The test sends the signal only once an
``unpickle`` line has appeared, and afterwards checks that no later phase had begun: the last progress
line before the interrupt line is an ``unpickle`` line short of 100%.

Two bounds. The handler: the unpickler yields between any two opcodes and its longest opcode is one C
call over at most a few MB (a string decoded, a batch of items appended), so the interrupt line comes
within milliseconds of the signal (measured: 1-90 ms); :data:`HANDLED_S` leaves room for a loaded
machine's scheduling. The exit: the watchdog's bound (:data:`llmtools.interrupt.STOP_BOUND_S`), which
covers the interpreter's teardown after the line (measured signal to exit: 0.3-1.6 s; 6-7 s before a
stopped command froze its objects out of the interpreter's last garbage collection). The watchdog's
own line ("inside a native call") must not appear: the handler stopped the command, not the watchdog.
"""

from __future__ import annotations

import functools
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from llmtools.interrupt import STOP_BOUND_S
from tests.conftest import REPO
from tests.trust.bombs import storage_refs_item, with_value
from tests.trust.conftest import rehash, snapshot
from tests.trust.zipcraft import records_of, write

pytestmark = pytest.mark.slow

STEP4 = "checkpoints/step_00000004"
MODEL = f"{STEP4}/mp_rank_00_model_states.pt"
REFERENCES = 300_000
REACHED = 300  # seconds to reach the unpickling: startup, hashing and the check (about 25 s here)
HANDLED_S = 2.0  # seconds from the signal to the interrupt line


def _plant_slow_pickle(run: Path) -> Path:
    """The model states' data.pkl with :data:`REFERENCES` references to its first float storage."""
    file = run / MODEL
    records = records_of(file)
    folder = records[0][0].split("/", 1)[0]
    storages = {
        name.rsplit("/", 1)[1]: len(data) for name, data in records if name.startswith(f"{folder}/data/")
    }
    key = min(storages, key=int)
    item = functools.partial(storage_refs_item, count=REFERENCES, key=key, numel=storages[key] // 4)
    write(file, [(n, with_value(d, item) if n.endswith("/data.pkl") else d) for n, d in records])
    rehash(run / STEP4)
    return file


class _Stderr:
    """The lines a process writes on stderr, as they come, each with the time it was read."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[tuple[float, str]] = []
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._read, args=(proc.stderr,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            with self.changed:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self.changed.notify_all()
        with self.changed:
            self.lines.append((time.monotonic(), None))
            self.changed.notify_all()

    def wait_for(self, prefix: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                texts = [text for _, text in self.lines]
                if any(text is not None and text.startswith(prefix) for text in texts) or None in texts:
                    return None not in texts
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(left)

    def text(self) -> str:
        return "\n".join(text for _, text in self.lines if text is not None)


def _interrupt_in_unpickling(command: list[str], marker: str, signum: int, env: dict, cwd: Path):
    """Start ``command``, wait for ``marker`` on stderr, send ``signum``: (process, stderr, seconds from
    the signal to the interrupt line, seconds from the signal to the exit)."""
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd
    )
    stderr = _Stderr(proc)
    try:
        reached = stderr.wait_for(marker, REACHED)
        assert reached, f"{marker!r} never appeared:\n{stderr.text()[-3000:]}"
        sent = time.monotonic()
        proc.send_signal(signum)
        proc.wait(timeout=60)
        latency = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr.thread.join(10)
    proc.stdout.close()
    handled = next((when - sent for when, text in stderr.lines if text and "interrupted by" in text), None)
    return proc, stderr.text(), handled, latency


def _check_stopped(proc, stderr: str, handled, latency: float, prog: str, signum: int, marker: str) -> None:
    name = signal.Signals(signum).name
    print(
        f"{prog}: {name} inside unpickling: line after {handled} s, exit {proc.returncode} after {latency:.2f} s"
    )
    assert proc.returncode == 128 + signum, stderr[-3000:]
    assert "Traceback" not in stderr, stderr
    assert f"{prog}: interrupted by {name}; temporaries removed" in stderr, stderr[-3000:]
    assert "native call" not in stderr, stderr[-3000:]  # the handler stopped it, not the watchdog
    assert handled is not None and handled < HANDLED_S, (handled, stderr[-3000:])
    assert latency < STOP_BOUND_S, (latency, stderr[-3000:])
    # Still inside the unpickling when the signal was handled: no phase after it had begun.
    progress = [line for line in stderr.splitlines() if re.match(r"(check|unpickle|sha256) ", line)]
    assert progress[-1].startswith(marker) and "100%" not in progress[-1], progress[-5:]


def _env(env: dict, temporaries: Path) -> dict:
    temporaries.mkdir()
    return {**env, "LLMTOOLS_PROGRESS_INTERVAL": "0.3", "TMPDIR": str(temporaries)}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_signal_inside_unpickling_stops_within_the_bound(run, env, tmp_path, command, signum):
    model = _plant_slow_pickle(run)
    before = snapshot(run)
    env = _env(env, tmp_path / "tmp")
    marker = f"unpickle {model}:data.pkl"
    script = str(Path(sys.executable).parent / "llm-ckpt")
    proc, stderr, handled, latency = _interrupt_in_unpickling(
        [script, command, str(run / STEP4)], marker, signum, env, REPO
    )
    _check_stopped(proc, stderr, handled, latency, "llm-ckpt", signum, marker)
    assert snapshot(run) == before
    assert not list((tmp_path / "tmp").iterdir())


def test_sigterm_inside_unpickling_stops_a_resume_within_the_bound(run, env, tmp_path, train_files):
    """``llm-train --resume auto`` reads the checkpoint before its training loop (whose own handler
    finishes a step and saves) has started: the common handler stops it like any command."""
    model = _plant_slow_pickle(run)
    before = snapshot(run)
    env = _env(env, tmp_path / "tmp")
    marker = f"unpickle {model}:data.pkl"
    config, ds = train_files
    script = str(Path(sys.executable).parent / "llm-train")
    command = [script, str(config), "--deepspeed", str(ds), "-o", str(run), "--resume", "auto"]
    proc, stderr, handled, latency = _interrupt_in_unpickling(command, marker, signal.SIGTERM, env, REPO)
    _check_stopped(proc, stderr, handled, latency, "llm-train", signal.SIGTERM, marker)
    assert snapshot(run) == before
    assert not list((tmp_path / "tmp").iterdir())
