"""Signals as exceptions: every ``with`` block and ``finally`` of the library cleans up on SIGTERM, SIGHUP
and SIGINT exactly as it does on an error.

:func:`install` is called once by every command (``cli._common.run``). The first signal raises
:class:`~llmtools.errors.Interrupted` in the main thread (for SIGINT too: click would turn a
``KeyboardInterrupt`` into "Aborted!" and exit 1); the writers' context managers remove their
temporaries as it unwinds, and the command exits 128 + the signal number. A signal that arrives inside
:func:`critical` (the few renames that commit a set of outputs) is held until the section ends, so a set
is committed whole or not at all. A second signal while the first is still unwinding runs the abort
hooks (fsutil's: remove the temporaries that are left) and exits at once.

Python runs signal handlers in the main thread only, between bytecodes: worker threads are never
interrupted, and the main thread notices a signal as soon as it returns from the C call it is in.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

from llmtools.errors import Interrupted

HANDLED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)

_abort_hooks: list = []  # run before exiting on a second signal (fsutil registers its cleanup here)
_depth = 0  # nesting of critical() in the main thread
_held: int | None = None  # a signal that arrived inside critical()
_raised: int | None = None  # the signal already turned into an exception
_blocked_before: set = set()  # what install() unblocked, blocked again by restore()


def _handle(signum: int, _frame) -> None:
    global _held, _raised
    if _raised is not None:
        # Asked twice: stop now, but still leave nothing half-written behind.
        for hook in _abort_hooks:
            with contextlib.suppress(Exception):
                hook()
        os._exit(128 + signum)
    if _depth:
        _held = signum
        return
    _raised = signum
    raise Interrupted(signum)


def on_abort(hook) -> None:
    """Run ``hook()`` before the process exits at once on a second signal (no exception unwinds then)."""
    if hook not in _abort_hooks:
        _abort_hooks.append(hook)


def install() -> dict:
    """Turn SIGTERM/SIGHUP/SIGINT into exceptions in this process (main thread only; no-op elsewhere).
    Returns the handlers it replaced, for :func:`restore`."""
    global _raised, _held, _blocked_before
    if threading.current_thread() is not threading.main_thread():
        return {}
    _raised = _held = None
    previous = {}
    for signum in HANDLED:
        if signal.getsignal(signum) is signal.SIG_IGN:
            continue  # nohup and friends asked for this signal to be ignored: keep it so
        previous[signum] = signal.signal(signum, _handle)
    # A blocked mask survives fork and exec (a launcher that blocked these around its own spawn, a
    # thread of a thread pool that had them blocked): left so, the handlers would never run, and a
    # scheduler's SIGTERM would wait in vain before its kill -9 left our temporaries behind.
    _blocked_before = signal.pthread_sigmask(signal.SIG_UNBLOCK, previous.keys()) & previous.keys()
    return previous


def restore(previous: dict) -> None:
    """Put back what :func:`install` replaced (a command run inside a longer-lived process, e.g. a test)."""
    for signum, handler in previous.items():
        signal.signal(signum, handler)
    if _blocked_before:
        signal.pthread_sigmask(signal.SIG_BLOCK, _blocked_before)


def reset_in_child() -> None:
    """For worker processes: ignore the signals, the parent decides (and kills its workers itself)."""
    for signum in HANDLED:
        signal.signal(signum, signal.SIG_IGN)


@contextlib.contextmanager
def critical() -> Iterator[None]:
    """Hold SIGTERM/SIGHUP/SIGINT until the block ends (renames that must happen together)."""
    global _depth, _held, _raised
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    except BaseException:
        _depth -= 1
        raise  # already unwinding: a held signal changes nothing (the command stops either way)
    _depth -= 1
    if _depth == 0 and _held is not None:
        signum, _held = _held, None
        _raised = signum
        raise Interrupted(signum)


def exit_code(error: BaseException) -> int:
    """128 + the signal number, as a shell reports a process killed by it (KeyboardInterrupt: SIGINT)."""
    if isinstance(error, Interrupted):
        return 128 + error.signum
    return 128 + signal.SIGINT
