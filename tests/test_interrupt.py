"""The signal watchdog acts only where it should: each case is a real Python process (signals, fork and
``_exit`` are properties of one), with a short bound. Where it must act, inside a long native call, the
real command is tested in tests/contract/test_signals.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.conftest import REPO

PRELUDE = """
import os, signal, sys, time
from llmtools import interrupt
from llmtools.errors import Interrupted
previous = interrupt.install("probe", 0.5)
"""


def run(body: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    code = PRELUDE + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)


def test_a_handled_signal_in_a_process_that_goes_on_is_not_cut_short():
    """A command run inside a longer-lived process (the in-process runner): the signal becomes the
    exception, restore() follows, and the process lives past the bound."""
    proc = run("""
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except Interrupted:
            pass
        interrupt.restore(previous)
        time.sleep(1.5)
        print("alive")
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "alive", proc.stderr


def test_a_signal_to_a_forked_worker_does_not_wake_the_parents_watchdog():
    """A forked child shares the wakeup pipe's descriptors until it drops them: a signal sent to a worker
    (a pool's terminate()) must not count as one sent to the parent."""
    proc = run("""
        child = os.fork()
        if child == 0:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
            os._exit(0)
        os.waitpid(child, 0)
        time.sleep(1.5)
        print("alive")
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "alive", proc.stderr


def test_a_command_with_its_own_handler_keeps_its_own_timing():
    """llm-train replaces the handler while it trains (it finishes the step and saves): the watchdog
    leaves such a signal alone."""
    proc = run("""
        seen = []
        signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1.5)
        print("alive", seen)
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "alive [15]", proc.stderr


def test_a_held_signal_waits_for_the_critical_section_then_the_watchdog_ends_the_process():
    """Inside critical() a signal is held; a section that outlasts the bound is still let finish (a set of
    renames is committed whole), then the watchdog ends the process with the signal's exit status."""
    proc = run("""
        try:
            with interrupt.critical():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1.5)  # past the bound: the watchdog waits for the section
                print("section done", flush=True)
        except Interrupted:
            time.sleep(5)  # unwinding that does not end: the watchdog stops it
        print("never", flush=True)
    """)
    assert proc.returncode == 143, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout.strip() == "section done"
    assert "probe: interrupted by SIGTERM" in proc.stderr
