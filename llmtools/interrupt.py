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
interrupted, and the main thread notices a signal only when it returns from the C call it is in. One
call can take minutes (a tokenizer encoding a 60 MB document, a regex, a compressor), and a scheduler
sends its kill -9 after a grace period (Slurm's KillWait: 30 s), which would leave temporaries behind.
So :func:`install` also starts a watchdog thread, woken by the C-level handler itself (Python's
``set_wakeup_fd``: a byte written the moment a signal arrives, whatever the main thread is doing).
If the process still runs :data:`STOP_BOUND_S` seconds later, the watchdog does what a second signal
does: it waits for a :func:`critical` section to end, runs the abort hooks, says so in one line and
exits 128 + the signal. Native calls that run long release the GIL (tokenizers' batch encoding,
compression, hashing, file I/O), so the watchdog can run beside them. It acts only while this module's
handler is the one installed for that signal: a command that installs its own (llm-train finishes its
step and saves a checkpoint) decides its own timing.
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
_ending = False  # the command has ended: a signal no longer raises (see ending())
_blocked_before: set = set()  # what install() unblocked, blocked again by restore()
_commit = threading.Lock()  # held by the outermost critical() section; the watchdog takes it to stop
_watch: dict = {}  # the running watchdog: its pipe, thread and the wakeup fd it replaced

STOP_BOUND_S = 5.0
"""Seconds a signalled command may keep running inside one native call before the watchdog stops it."""


def _handle(signum: int, _frame) -> None:
    global _held, _raised
    if _raised is not None:
        # Asked twice: stop now, but still leave nothing half-written behind.
        _run_abort_hooks()
        os._exit(128 + signum)
    if _ending:
        return  # the command is ending with its own exit status; its work is done or abandoned
    if _depth:
        _held = signum
        return
    _raised = signum
    raise Interrupted(signum)


def on_abort(hook) -> None:
    """Run ``hook()`` before the process exits at once on a second signal (no exception unwinds then)."""
    if hook not in _abort_hooks:
        _abort_hooks.append(hook)


def _run_abort_hooks() -> None:
    # Last registered first, as unwinding would: a lock file inside a folder made for an output goes
    # before that folder is removed (locks registers after fsutil, which it imports).
    for hook in reversed(_abort_hooks):
        with contextlib.suppress(Exception):
            hook()


def install(prog: str = "llmtools", bound_s: float | None = STOP_BOUND_S) -> dict:
    """Turn SIGTERM/SIGHUP/SIGINT into exceptions in this process (main thread only; no-op elsewhere),
    and end the process at most ``bound_s`` seconds after one of them (``None``: no bound), naming
    ``prog`` in the line it writes then. Returns the handlers it replaced, for :func:`restore`."""
    global _raised, _held, _blocked_before, _ending
    if threading.current_thread() is not threading.main_thread():
        return {}
    _raised = _held = None
    _ending = False
    previous = {}
    for signum in HANDLED:
        if signal.getsignal(signum) is signal.SIG_IGN:
            continue  # nohup and friends asked for this signal to be ignored: keep it so
        previous[signum] = signal.signal(signum, _handle)
    if bound_s is not None and previous:
        _start_watchdog(prog, bound_s)
    # A blocked mask survives fork and exec (a launcher that blocked these around its own spawn, a
    # thread of a thread pool that had them blocked): left so, the handlers would never run, and a
    # scheduler's SIGTERM would wait in vain before its kill -9 left our temporaries behind.
    _blocked_before = signal.pthread_sigmask(signal.SIG_UNBLOCK, previous.keys()) & previous.keys()
    return previous


def restore(previous: dict) -> None:
    """Put back what :func:`install` replaced (a command run inside a longer-lived process, e.g. a test)."""
    _stop_watchdog()
    for signum, handler in previous.items():
        signal.signal(signum, handler)
    if _blocked_before:
        signal.pthread_sigmask(signal.SIG_BLOCK, _blocked_before)


def _start_watchdog(prog: str, bound_s: float) -> None:
    _stop_watchdog()
    read, write = os.pipe()  # close-on-exec: a program we exec never writes into it
    os.set_blocking(write, False)  # the C handler must never block on a full pipe
    try:
        replaced = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except ValueError:  # not the main thread of the main interpreter
        os.close(read)
        os.close(write)
        return
    try:
        # Where stderr is now: a native call may have fd 2 pointed elsewhere when the line is due.
        stderr = os.dup(2)
    except OSError:
        stderr = -1
    cancel = threading.Event()
    thread = threading.Thread(target=_watchdog, args=(read, cancel, prog, bound_s, stderr), daemon=True,
                              name="llmtools-signal-watchdog")  # fmt: skip
    _watch.update(read=read, write=write, replaced=replaced, thread=thread, cancel=cancel, stderr=stderr)
    thread.start()


def _stop_watchdog() -> None:
    if not _watch:
        return
    _watch["cancel"].set()  # a signal being handled in a longer-lived process (a test) ends here
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(_watch["replaced"])
    os.close(_watch["write"])  # the watchdog reads end-of-file and returns
    _watch["thread"].join()
    _close(_watch["read"], _watch["stderr"])
    _watch.clear()


def _close(*fds: int) -> None:
    for fd in fds:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


def _disarm_in_child() -> None:
    # A forked child shares the pipe: a signal sent to a worker must not wake the parent's watchdog.
    if _watch:
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(-1)
        _close(_watch["write"], _watch["read"], _watch["stderr"])
        _watch.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_disarm_in_child)


def _watchdog(read: int, cancel: threading.Event, prog: str, bound_s: float, stderr: int) -> None:
    while True:
        try:
            received = os.read(read, 64)
        except OSError:
            return
        if not received:
            return
        ours = [s for s in received if s in HANDLED and signal.getsignal(s) is _handle]
        if ours:
            break
    if cancel.wait(bound_s):  # the process normally ends long before this
        return
    _commit.acquire()  # never in the middle of a set of renames; held until the exit
    if cancel.is_set():
        _commit.release()
        return
    signum = ours[0]
    _run_abort_hooks()
    line = (f"{prog}: interrupted by {signal.Signals(signum).name}; stopped {bound_s:g} s later inside a "
            "native call; temporaries removed, nothing half-written left\n")  # fmt: skip
    with contextlib.suppress(OSError):
        os.write(stderr if stderr >= 0 else 2, line.encode("utf-8", "replace"))
    os._exit(128 + signum)


def ending() -> None:
    """The command has ended (its exit status is decided, its cleanup under way): from now on a signal is
    no longer raised as an exception: the process ends with the status its command decided. A launcher that stops
    every rank once one has ended sends its SIGTERM just as a rank finishes; raised then, in the last
    cleanup, it would end a finished command with a traceback and another exit status."""
    global _ending
    _ending = True


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
    if _depth == 0:
        _commit.acquire()
    _depth += 1
    try:
        yield
    except BaseException:
        _leave_critical()
        raise  # already unwinding: a held signal changes nothing (the command stops either way)
    _leave_critical()
    if _depth == 0 and _held is not None:
        signum, _held = _held, None
        _raised = signum
        raise Interrupted(signum)


def _leave_critical() -> None:
    global _depth
    _depth -= 1
    if _depth == 0:
        _commit.release()


def exit_code(error: BaseException) -> int:
    """128 + the signal number, as a shell reports a process killed by it (KeyboardInterrupt: SIGINT)."""
    if isinstance(error, Interrupted):
        return 128 + error.signum
    return 128 + signal.SIGINT
