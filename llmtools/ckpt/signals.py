"""Stop cleanly on SIGTERM / SIGINT / SIGHUP / SIGQUIT: finish the current step, save, exit 128 + the
signal (stopped before the end, resumable) with a resume hint.

Batch schedulers send SIGTERM some time before they kill a job. The handler only sets a flag; the training
loop asks :meth:`StopRequested.should_stop` after each step (all ranks together, so they agree) and, when
true, saves a checkpoint and returns. A second SIGINT (Ctrl-C twice) interrupts at once.

Why the signal came decides whether that save can happen, and the signal itself does not say: under
torchrun, the agent forwards a scheduler's SIGTERM (preemption, ``scancel``, Slurm's ``--signal``) to its
workers, and sends the very same SIGTERM when it tears them down because a peer is gone. The agreement
tells them apart: it is a collective, so it succeeds only while every rank is there (preemption: every
rank saves) and fails — at once for a peer whose process died, within ``distributed.timeout_s`` for a host
that vanished — when one is gone; then no save is attempted and the rank reports the lost peer instead.

``DEFAULT_SIGNALS`` is the set handled; add a signal there to give it the same meaning.

    with StopRequested() as stop:
        for step in ...:
            train_step()
            if stop.should_stop():
                manager.save(engine, step, state)
                print(stop.resume_hint("llm-train cfg.yaml"), file=sys.stderr)
                break
"""

from __future__ import annotations

import signal
import sys

from llmtools.ckpt import dist
from llmtools.launch_channel import stopped_by_launcher

# SIGHUP (the terminal or ssh session closed) and SIGQUIT (some schedulers' quit) would otherwise end the
# run at once without a checkpoint; they are a request to stop like SIGTERM.
DEFAULT_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT") if hasattr(signal, name)
)


class StopRequested:
    """A flag set by the signals it is installed for; falsy until one arrives."""

    def __init__(self, signals: tuple[int, ...] = DEFAULT_SIGNALS, announce: bool = True) -> None:
        self.signals = tuple(signals)
        self.announce = announce
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    # The handler runs between bytecodes of the main thread: it only records, never saves.
    def _handle(self, signum, _frame) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum
        # llm-train's launcher stopping this rank because a peer ended: not a stop the user asked for.
        if self.announce and not stopped_by_launcher():
            print(
                f"received {self.signal_name}: finishing the current step, then saving a checkpoint if every "
                "rank is still there (press Ctrl-C again to abort at once)",
                file=sys.stderr,
                flush=True,
            )

    def install(self) -> StopRequested:
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def __enter__(self) -> StopRequested:
        return self.install()

    def __exit__(self, *_exc) -> None:
        self.restore()

    def request(self, signum: int = signal.SIGTERM) -> None:
        """Ask for a stop from code (tests, a max-time limit)."""
        self.signum = signum

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def __bool__(self) -> bool:
        return self.requested

    @property
    def signal_name(self) -> str:
        if self.signum is None:
            return "no signal"
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"

    def should_stop(self, sync: bool = True) -> bool:
        """Whether to stop now; with ``sync`` every rank gets the same answer (one tiny all-reduce)."""
        if not sync:
            return self.requested
        stop = dist.any_rank(self.requested)
        if stop and self.signum is None:
            self.signum = signal.SIGTERM  # another rank got the signal
        return stop

    def resume_hint(self, command: str, checkpoint: str | None = None) -> str:
        saved = f"saved {checkpoint}; " if checkpoint else ""
        if "--resume auto" not in command:  # a bare command line: the continuation resumes
            command = f"{command} --resume auto"
        return f"stopped by {self.signal_name}: {saved}resume with: {command}"


def resume_command(argv: list[str] | None = None) -> str:
    """The command line that continues this run as it was launched (torchrun, the deepspeed launcher,
    Slurm or the plain command), ``--resume auto`` included (:mod:`llmtools.ckpt.launch`)."""
    from llmtools.ckpt.launch import resume_command as launched

    return launched(argv=argv)
