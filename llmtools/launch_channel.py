"""What a worker tells the ``llm-train`` launcher that started it, and what that launcher tells its workers.

``llm-train --nproc-per-node N ...`` runs torch's elastic agent in its own process and starts N workers
(``python -m llmtools.cli.train ...``). It gives them a private folder (``LLMTOOLS_LAUNCH_DIR``) and its
process id (``LLMTOOLS_LAUNCH_PID``). A worker whose parent is that process:

- writes its last words there instead of on stderr: its exit code, its one line (a refusal, an error, an
  interruption) and its resume line (``rank<R>.json``, renamed into place whole). The launcher, which sees
  every rank's outcome, prints what is due once (one refusal line, not one per rank; the resume line after
  every worker has ended, so it is the last line printed; one line per crashed rank);
- learns from the mark ``launcher-stops`` that a SIGTERM is the launcher's own, sent because a peer ended
  (torch's agent stops every worker of a round once one has ended): the worker then announces no stop of
  its own, and its ending is not shown as the user's interruption.

The parent check keeps an inherited environment (a worker that starts a tool of ours) from reporting into
a folder that is not its launcher's.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from llmtools.formats import jsonfile

ENV_DIR = "LLMTOOLS_LAUNCH_DIR"
ENV_PID = "LLMTOOLS_LAUNCH_PID"
STOP_MARK = "launcher-stops"
MAX_REPORT_BYTES = 1 << 16

_hint: list[str] = []  # this worker's resume line, kept for its report


def folder(env=None) -> Path | None:
    """The launcher's folder when this process is a worker of an ``llm-train`` launcher, else None."""
    env = os.environ if env is None else env
    where, pid = env.get(ENV_DIR), env.get(ENV_PID, "")
    if not where or not pid.isdigit() or int(pid) != os.getppid():
        return None
    return Path(where)


def stopped_by_launcher() -> bool:
    """Whether the launcher has marked the signal its workers get as its own (a peer ended)."""
    where = folder()
    return where is not None and (where / STOP_MARK).exists()


def keep_hint(hint: str) -> bool:
    """Keep the resume line for the report; True when it is the launcher's to print (under one)."""
    if folder() is None:
        return False
    _hint[:] = [hint]
    return True


def finish(code: int, line: str | None) -> bool:
    """Write this worker's report (exit code, last line, resume line). True when written: the launcher
    prints ``line`` (or not, when it ended the worker itself), so the worker does not."""
    where = folder()
    if where is None:
        return False
    rank = os.environ.get("RANK", "")
    if not rank.isdigit():
        return False
    report = {
        "rank": int(rank),
        "pid": os.getpid(),
        "code": code,
        "line": line,
        "hint": _hint[0] if _hint else None,
    }
    target = where / f"rank{rank}.json"
    tmp = where / f".rank{rank}.{os.getpid()}.tmp"
    try:
        tmp.write_text(jsonfile.dumps(report), encoding="utf-8")
        os.replace(tmp, target)
    except OSError:  # the launcher's folder is gone (it ended): say it ourselves
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False
    return True


def read_reports(where: Path) -> dict[int, dict]:
    """Every rank's report in ``where``, by rank (the launcher's side; unreadable ones are left out)."""
    out: dict[int, dict] = {}
    for path in sorted(where.glob("rank*.json")):
        try:
            with path.open("rb") as handle:
                raw = handle.read(MAX_REPORT_BYTES + 1)
            if len(raw) > MAX_REPORT_BYTES:
                continue
            report = jsonfile.loads(raw)
        except (OSError, ValueError):
            continue
        if (
            isinstance(report, dict)
            and isinstance(report.get("rank"), int)
            and isinstance(report.get("code"), int)
        ):
            out[report["rank"]] = report
    return out
