"""How this process was started, as a command line a user can paste to start it the same way again.

A worker of ``llm-train --nproc-per-node ...`` is the child of that llm-train, which names itself in the
environment (``llmtools.launch_channel``); a worker of ``torchrun`` (or ``python -m torch.distributed.run``)
is the child of the launcher's agent; a worker of the ``deepspeed`` launcher the grandchild of the
``deepspeed`` command (through ``deepspeed.launcher.launch``); under Slurm the job itself is requeued. The
launchers' command lines are read from ``/proc/<pid>/cmdline``; where that is not readable the plain command
is what is known.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from llmtools.launch_channel import ENV_PID

# Flags of ours that start a run over or pick a checkpoint: the continuation passes --resume auto instead.
_DROP_WITH_VALUE = ("--resume",)
_DROP = ("--force", "--reset-data", "--rollback")


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part] or None


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # the name in (...) may hold spaces


def _readable(argv: list[str]) -> list[str]:
    """``/venv/bin/python /venv/bin/torchrun ...`` -> ``torchrun ...`` (the console script by name)."""
    if len(argv) > 1 and Path(argv[0]).name.startswith("python") and not argv[1].startswith("-"):
        argv = argv[1:]
    return [Path(argv[0]).name, *argv[1:]] if argv else argv


def _without_our_flags(argv: list[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in _DROP_WITH_VALUE:
            skip = True
            continue
        if arg in _DROP or any(arg.startswith(f"{flag}=") for flag in _DROP_WITH_VALUE):
            continue
        out.append(arg)
    return out


def _is_torchrun(argv: list[str]) -> bool:
    names = [Path(a).name for a in argv[:3]]
    return (
        "torchrun" in names or "torch.distributed.run" in argv[:3] or "torch.distributed.launch" in argv[:3]
    )


def _as_typed(argv: list[str], orig_argv: list[str] | None) -> list[str]:
    """The plain command as the user typed it: under ``python -m MODULE`` ``sys.argv[0]`` is the module's
    file (``.../train.py``, no command), so the interpreter and ``-m MODULE`` are taken from the
    interpreter's own command line (``sys.orig_argv``), its options kept, followed by our arguments."""
    at = 1
    while orig_argv and at < len(orig_argv) - 1:  # the interpreter's own options only: a -m of ours is not
        option = orig_argv[at]
        if option == "-m":
            return [*orig_argv[: at + 2], *argv[1:]]
        if option in ("-c", "-") or not option.startswith("-"):
            break
        at += 2 if option in ("-X", "-W") else 1
    return _readable(argv)


def launcher_argv(
    env: dict | None = None, argv: list[str] | None = None, orig_argv: list[str] | None = None
) -> tuple[str, list[str]]:
    """(kind, command line) of how this process was started: kind is ``llm-train`` (a worker of
    ``llm-train --nproc-per-node ...``), ``torchrun``, ``deepspeed``,
    ``slurm`` (the command line is then the job's id) or ``plain``. ``orig_argv``: the interpreter's
    command line (``sys.orig_argv`` when ``argv`` is this process's own)."""
    env = os.environ if env is None else env
    if argv is None:
        argv, orig_argv = list(sys.argv), list(getattr(sys, "orig_argv", []))
    argv = list(argv)
    parent = _parent(os.getpid())
    if parent is not None and env.get(ENV_PID, "").isdigit() and int(env[ENV_PID]) == parent:
        launcher = _cmdline(parent)  # llm-train --nproc-per-node ...: its own launcher
        if launcher:
            return "llm-train", _readable(launcher)
    if env.get("TORCHELASTIC_RUN_ID") and parent is not None:
        launcher = _cmdline(parent)
        if launcher and _is_torchrun(launcher):
            return "torchrun", _readable(launcher)
    if (
        "--local_rank" in " ".join(argv)
        or env.get("DS_LAUNCHER")
        or (parent is not None and "deepspeed.launcher.launch" in (_cmdline(parent) or []))
    ):
        grand = _parent(parent) if parent is not None else None
        runner = _cmdline(grand) if grand is not None else None
        if runner and any(Path(a).name == "deepspeed" for a in runner[:2]):
            return "deepspeed", _readable(runner)
    if env.get("SLURM_JOB_ID") and env.get("SLURM_JOB_ID").isdigit():
        return "slurm", [env["SLURM_JOB_ID"]]
    return "plain", _as_typed(argv, orig_argv)


def resume_command(
    env: dict | None = None, argv: list[str] | None = None, orig_argv: list[str] | None = None
) -> str:
    """The command line that continues this run, ``--resume auto`` included."""
    kind, line = launcher_argv(env, argv, orig_argv)
    if kind == "slurm":
        return f"scontrol requeue {line[0]} (the job's script passes --resume auto)"
    return shlex.join([*_without_our_flags(line), "--resume", "auto"])
