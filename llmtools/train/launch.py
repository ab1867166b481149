"""``llm-train`` as its own launcher: torch's elastic agent in this process, ``python -m llmtools.cli.train``
workers, and their outcome mapped onto the contract of one process.

``llm-train --nproc-per-node 2 tiny --deepspeed zero2 -o runs/t2`` is ``torchrun`` with the same options
(parsed by torchrun's own parser, so the names, spellings and defaults are torchrun's) and one difference:
how the run ends. Stock torchrun reports any non-zero exit of a worker as its own failure (its 27-line
summary, exit 1), a refusal included, and stops the other ranks with SIGTERM, which they report as an
interruption. Here:

- every rank exits 0: exit 0; rank 0's stdout (the ``--json`` object) has passed through unchanged;
- a rank refuses (exit 2): exit 2 and the refusal line, once;
- a signal stops the run (sent to this process, which forwards it, to the workers, or by a scheduler to
  all of them): the workers save, this process waits for them at most ``--shutdown-timeout`` seconds
  (torch's bound, then SIGKILL), exits 128 + the signal, and prints the resume line last; with
  ``--max-restarts`` a stop is not restarted (it is not a failure);
- a rank crashes (exit 1, or killed): exit 1 and one line per failed rank.

The workers' last words come through :mod:`llmtools.launch_channel` (a private folder of this process):
a worker writes its exit code, its line and its resume line there instead of on stderr, so this process,
which alone sees every rank's outcome, prints each once and after the workers have ended. Before torch's
agent stops the workers of a round because one ended, it marks the stop as its own there, so those
workers neither announce a stop nor are shown as interrupted by the user.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from llmtools import launch_channel
from llmtools.errors import RuntimeFailure, UsageError

OPTIONS = (
    "nproc-per-node", "nnodes", "node-rank", "master-addr", "master-port", "rdzv-backend", "rdzv-endpoint",
    "rdzv-id", "rdzv-conf", "local-addr", "max-restarts", "shutdown-timeout",
)  # fmt: skip
"""The launcher's options: torchrun's, by torchrun's names (each also with underscores, as torchrun takes)."""

_SPELLINGS = {f"--{name}": name for name in OPTIONS} | {
    f"--{name.replace('-', '_')}": name for name in OPTIONS
}
STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
_STOP_CODES = {128 + signal.Signals[name].value: name for name in STOP_SIGNALS}
WORKER_MODULE = "llmtools.cli.train"


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the launcher's options, the rest: the workers' arguments), each in the order given."""
    launcher: list[str] = []
    worker: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.split("=", 1)[0] in _SPELLINGS:
            take = 1 if "=" in arg else 2
            launcher += argv[i : i + take]
            i += take
            continue
        worker.append(arg)
        i += 1
    return launcher, worker


@dataclass
class Outcome:
    """How the launch ended: the exit code and the lines for stderr (the resume line, if any, last)."""

    code: int
    lines: list[str] = field(default_factory=list)


def launch(launcher_argv: list[str], worker_argv: list[str], prog: str = "llm-train") -> Outcome:
    """Run the workers under torch's elastic agent and map how they ended (module docstring)."""
    folder = Path(tempfile.mkdtemp(prefix="llm-train-launch-"))
    try:
        with _quiet_torch():
            config, entrypoint, args = _config(launcher_argv, worker_argv, folder / "torch")
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    handlers = {name: signal.getsignal(signal.Signals[name]) for name in STOP_SIGNALS}
    saved_env = {key: os.environ.get(key) for key in (launch_channel.ENV_DIR, launch_channel.ENV_PID)}
    os.environ[launch_channel.ENV_DIR] = str(folder)
    os.environ[launch_channel.ENV_PID] = str(os.getpid())
    agents: list = []
    try:
        with _quiet_torch():
            return _run(config, entrypoint, args, folder, agents, prog)
    finally:
        # torch's agent leaves its own handlers installed (they raise its SignalException): ours again
        for name, handler in handlers.items():
            if handler is not None:
                signal.signal(signal.Signals[name], handler)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(folder, ignore_errors=True)


def _run(config, entrypoint, args, folder: Path, agents: list, prog: str) -> Outcome:
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError
    from torch.distributed.launcher import api

    stock = api.LocalElasticAgent
    api.LocalElasticAgent = _agent_class(stock, folder, agents)  # launch_agent builds its agent by this name
    try:
        api.launch_agent(config, entrypoint, list(args))
    except SignalException as stop:
        return _stopped(stop.sigval.name, folder, agents, config.shutdown_timeout, prog)
    except ChildFailedError as failed:
        return _failed(_own(failed.failures, agents[-1].ended_first if agents else None), folder, prog)
    except (RendezvousError, RuntimeError, ValueError, OSError) as error:  # rendezvous, ports, the store
        said = " ".join(str(error).split())
        where = f"{config.rdzv_backend} rendezvous at {config.rdzv_endpoint or 'localhost'}"
        raise RuntimeFailure(
            f"the launcher could not run its workers: {type(error).__name__}{': ' + said if said else ''} "
            f"({where}, {config.min_nodes}..{config.max_nodes} node(s))"
        ) from None
    finally:
        api.LocalElasticAgent = stock
    return Outcome(0)


def _config(launcher_argv: list[str], worker_argv: list[str], log_dir: Path):
    """torchrun's LaunchConfig, entry point and arguments for these options (torchrun's parser and its
    defaults: one node with no rendezvous endpoint and no --master-port takes a free local port). torch's
    own files (its per-worker error files) go under ``log_dir``, removed with the launcher's folder."""
    import uuid

    from torch.distributed import run as torchrun

    parser = torchrun.get_args_parser()
    parser.prog = "llm-train"

    def refuse(message: str):
        raise UsageError(f"launcher options: {message}")

    parser.error = refuse
    args = parser.parse_args([*launcher_argv, "--module", WORKER_MODULE, *worker_argv])
    args.log_dir = str(log_dir)
    try:
        _, max_nodes = torchrun.parse_min_max_nnodes(args.nnodes)
        if (
            args.rdzv_backend == "static"
            and not args.rdzv_endpoint
            and args.master_port is None
            and max_nodes == 1
        ):
            args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
        if args.master_port is None:
            args.master_port = 29500
        return torchrun.config_from_args(args)
    except (AssertionError, ValueError, RuntimeError) as error:
        raise UsageError(f"launcher options: {error}") from None


def _agent_class(stock, folder: Path, agents: list):
    """torch's agent, told to mark its own stops, to remember which workers ended by themselves, and to
    leave a signal stop alone (no restart)."""

    def mark() -> None:
        with contextlib.suppress(OSError):
            (folder / launch_channel.STOP_MARK).touch()

    class Agent(stock):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.ended_first: set[int] | None = None  # local ranks that had ended when the round was closed
            agents.append(self)

        def _start_workers(self, worker_group):
            # A new round: the reports and the mark of the last one are gone before its workers start.
            for path in folder.glob("*"):
                if path.is_file():
                    path.unlink(missing_ok=True)
            self.ended_first = None
            started = super()._start_workers(worker_group)
            self._watch_close()
            return started

        def _watch_close(self) -> None:
            # torch closes a round from inside its poll as soon as one worker has failed: it SIGTERMs the
            # others, then counts their exits among the failures. Before that SIGTERM goes out, the
            # workers that had already ended are noted (only theirs is the round's outcome) and, when
            # one of them failed, the stop is marked as the launcher's own, so the others neither
            # announce a stop nor pass for interrupted by the user. A signal the user sends this process
            # closes the round with every worker still running: no mark, theirs is the user's stop.
            pcontext = self._pcontext
            handlers = getattr(pcontext, "subprocess_handlers", None)
            if pcontext is None or handlers is None:
                return
            close = pcontext.close

            def close_noted(*args, **kwargs):
                if self.ended_first is None:
                    codes = {local: handler.proc.poll() for local, handler in handlers.items()}
                    self.ended_first = {local for local, code in codes.items() if code is not None}
                    if any(code not in (None, 0) for code in codes.values()):
                        mark()
                return close(*args, **kwargs)

            pcontext.close = close_noted

        def _stop_workers(self, worker_group):
            # torch stops a round's workers through this when one has ended or a node joins: the
            # SIGTERM they get is not the user's.
            mark()
            super()._stop_workers(worker_group)

        def _monitor_workers(self, worker_group):
            result = super()._monitor_workers(worker_group)
            failures = _own(result.failures, self.ended_first) if result.is_failed() else {}
            if failures and _all_stops(failures, launch_channel.read_reports(folder)):
                # Workers stopped by a signal saved and said so: that is the end the user asked for,
                # not a failure for --max-restarts to retry.
                self._remaining_restarts = 0
            return result

    return Agent


def _own(failures: dict, ended_first: set[int] | None) -> dict:
    """The failures of the workers that ended by themselves (not those the agent stopped afterwards)."""
    if not ended_first:
        return failures
    own = {rank: f for rank, f in failures.items() if f.local_rank in ended_first}
    return own or failures


def _all_stops(failures: dict, reports: dict) -> bool:
    return bool(failures) and all(
        f.exitcode in _STOP_CODES and reports.get(rank, {}).get("code") == f.exitcode
        for rank, f in failures.items()
    )


def _stopped(name: str, folder: Path, agents: list, timeout, prog: str) -> Outcome:
    """This process got ``name`` and forwarded it; its workers have ended (or were killed at the bound)."""
    reports = launch_channel.read_reports(folder)
    ranks = _local_ranks(agents) or sorted(reports)
    if ranks and all(reports.get(r, {}).get("code") == 0 for r in ranks):
        return Outcome(0)  # the run reached its end as the signal came
    lines = [
        f"{prog}: rank {r} did not stop within {timeout} s (--shutdown-timeout) and was killed"
        for r in ranks
        if r not in reports
    ]
    hints = [reports[r]["hint"] for r in sorted(reports) if isinstance(reports[r].get("hint"), str)]
    said = [reports[r]["line"] for r in sorted(reports) if isinstance(reports[r].get("line"), str)]
    lines.append(hints[0] if hints else said[0] if said else f"{prog}: interrupted by {name}")
    return Outcome(128 + signal.Signals[name].value, lines)


def _local_ranks(agents: list) -> list[int]:
    group = getattr(agents[-1], "_worker_group", None) if agents else None
    return sorted(
        w.global_rank
        for w in getattr(group, "workers", [])
        if w.global_rank is not None and w.global_rank >= 0
    )


def _failed(failures: dict, folder: Path, prog: str) -> Outcome:
    """Some ranks ended non-zero by themselves (the others were stopped by the agent: not shown)."""
    reports = launch_channel.read_reports(folder)
    ordered = sorted(failures.items())
    if _all_stops(failures, reports):
        code = ordered[0][1].exitcode
        hints = [reports[r]["hint"] for r in sorted(reports) if isinstance(reports[r].get("hint"), str)]
        line = hints[0] if hints else reports[ordered[0][0]].get("line")
        return Outcome(code, [line] if isinstance(line, str) else [])
    refused = [rank for rank, f in ordered if f.exitcode == 2]
    if refused:
        lines: list[str] = []
        for rank in refused:
            line = reports.get(rank, {}).get("line")
            line = line if isinstance(line, str) else f"{prog}: error: rank {rank} refused to start (exit 2)"
            if line not in lines:
                lines.append(line)
        return Outcome(2, lines)
    return Outcome(1, [_crash_line(rank, f, reports.get(rank), prog) for rank, f in ordered])


def _crash_line(rank: int, failure, report: dict | None, prog: str) -> str:
    if failure.exitcode < 0:
        try:
            how = f"was killed by {signal.Signals(-failure.exitcode).name}"
        except ValueError:
            how = f"was killed by signal {-failure.exitcode}"
    else:
        how = f"exited {failure.exitcode}"
    said = report.get("line") if report else None
    if isinstance(said, str) and report.get("code") == failure.exitcode:
        what = said.removeprefix(f"{prog}: ").removeprefix("error: ")
    else:
        what = "it left no message (its output, if any, is above on stderr)"
    return f"{prog}: error: rank {rank} (local rank {failure.local_rank}, pid {failure.pid}) {how}: {what}"


@contextlib.contextmanager
def _quiet_torch():
    """torch's agent logs each worker it signals and each failure: our summary says it once instead
    (LLMTOOLS_DEBUG=1 keeps them)."""
    if os.environ.get("LLMTOOLS_DEBUG", "") not in ("", "0", "false", "no"):
        yield
        return
    import torch.distributed  # noqa: F401 - torch sets up its loggers' handlers on import

    quiet = logging.getLogger("torch.distributed")
    sink = logging.NullHandler()
    before = (quiet.handlers, quiet.propagate)
    quiet.handlers, quiet.propagate = [sink], False
    try:
        yield
    finally:
        quiet.handlers, quiet.propagate = before
