"""``llm-log wandb`` / ``llm-log mlflow``: any run's log into an experiment tracker, exactly once, finished
or live.

A LOG is a run folder of llm-train (its ``metrics.jsonl``), a ``metrics.jsonl``, or a Megatron-LM /
DeepSpeed / MindFormers / generic log (the parsers of ``llm-log tb``). Each becomes one tracker run, with
the names llm-train's own reporting uses (``train/loss``, ``eval/eval_loss``, events as keys
``event/<step>/<name>``).

Idempotence. ``DIR/.llm-log-trackers.json`` keeps the tracker run id of every source (written as soon as
the run exists). Uploading again continues that run: the tracker is asked which step each metric already
has (:mod:`llmtools.logs.trackers`) and only what lies beyond is logged, so a second upload adds nothing
and a grown log adds its new steps. ``--follow`` keeps reading the growing log (rotation and truncation
as ``llm-log tb``) until Ctrl-C.

A rewritten history. After ``llm-train --resume N --rollback`` (or a replay after a kill) the run's
metrics.jsonl holds new values from step N+1 on, and may stop short of steps the tracker run has. Before
logging, the tracker run's history (read back through its own library) is compared with the log, step by
step up to the last step the tracker has: from the first step where they differ (a value, or a step one
of them lacks), the tracker's values are superseded, as the in-run trackers supersede them on a resume
(:func:`llmtools.logs.trackers.mark_superseded`: an event says which steps, and the log's values at them
are logged again, the value logged last at a step being the run's). The log's value of a step is its
first, as logged. An unchanged log compares equal: uploading it again still adds nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmtools.errors import InputError, RuntimeFailure, UsageError
from llmtools.formats import jsonfile
from llmtools.fsutil import write_text_atomic
from llmtools.logs.parsers import FORMATS
from llmtools.logs.reader import LogReader, check_seq_length
from llmtools.logs.records import Counts, Record
from llmtools.logs.sources import check_readable
from llmtools.logs.tb import run_name, source_key
from llmtools.logs.trackers import (
    TRACKERS,
    Tracker,
    TrackerState,
    check_available,
    check_tracking_uri,
    mark_superseded,
    open_trackers,
    scalars,
)

STATE_NAME = ".llm-log-trackers.json"
STATE_VERSION = 1


@dataclass
class UploadConfig:
    """Options of ``llm-log wandb|mlflow`` (validated here, so the library refuses bad values too)."""

    tracker: str
    folder: Path  # W&B's offline files / MLflow's local store, and the state file
    project: str = "llmtools"
    tracking_uri: str | None = None
    fmt: str = "auto"
    pattern: str | None = None
    follow: bool = False
    poll_s: float = 0.5
    seq_length: int | None = None

    def __post_init__(self) -> None:
        self.folder = Path(self.folder)
        if self.tracker not in TRACKERS:
            raise UsageError(f"unknown tracker {self.tracker!r} (choose from {', '.join(TRACKERS)})")
        if self.fmt not in FORMATS:
            raise UsageError(f"--format: unknown format {self.fmt!r} (choose from {', '.join(FORMATS)})")
        if not 0 < self.poll_s <= 3600:
            raise UsageError(f"--poll must be > 0 and at most 3600 seconds, got {self.poll_s}")
        check_seq_length(self.seq_length)


def log_path(path: str) -> str:
    """A run folder stands for its metrics.jsonl."""
    if path != "-" and Path(path).is_dir():
        inner = Path(path) / "metrics.jsonl"
        if not inner.is_file():
            raise InputError(f"{path}: a folder without metrics.jsonl (not a run folder of llm-train)")
        return str(inner)
    return path


def as_record(record: Record) -> dict:
    """A parsed record in the shape of a metrics.jsonl line (what the trackers take)."""
    if record.kind == "event":
        return {"kind": "event", "step": record.step, "event": record.event, "message": record.message or ""}
    return {"kind": record.kind, "step": record.step, **record.values}


def _load_state(path: Path) -> dict:
    if not path.exists():
        return {"version": STATE_VERSION, "sources": {}}
    try:
        state = jsonfile.loads(path.read_text(encoding="utf-8"), ours=True)
    except (OSError, ValueError) as error:
        raise InputError(f"{path}: unreadable llm-log state ({error}); delete it to upload afresh") from None
    if (
        not isinstance(state, dict)
        or state.get("version") != STATE_VERSION
        or not isinstance(state.get("sources"), dict)
    ):
        raise InputError(f"{path}: not an llm-log tracker state file of version {STATE_VERSION}")
    return state


def upload(
    logs: list[str],
    config: UploadConfig,
    should_stop: Callable[[], bool] | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> dict:
    """Upload (with ``config.follow``, keep uploading) ``logs``; returns ``{run: {"id", "points", ...}}``."""
    if not logs:
        raise UsageError("give at least one LOG (a run folder, a metrics.jsonl, a trainer's log)")
    if "-" in logs:
        raise UsageError("stdin (-) has no name to find its tracker run again by: give a file")
    check_available([config.tracker], f"llm-log {config.tracker}")
    check_tracking_uri(config.tracking_uri, "--tracking-uri")
    paths = [log_path(p) for p in logs]
    for path in paths:
        check_readable(path)
    config.folder.mkdir(parents=True, exist_ok=True)
    state_path = config.folder / STATE_NAME
    state = _load_state(state_path)
    warnings: list[str] = []
    opened: list[tuple[str, str, Tracker, LogReader]] = []
    counts = Counts()
    try:
        for path in paths:
            key = source_key(path)
            entry = state["sources"].setdefault(key, {"name": run_name(path)})
            ids = TrackerState()
            ids.load_state_dict(entry)
            trackers = open_trackers(
                [config.tracker], config.folder, config.project, entry["name"], ids, None, warnings.append,
                tracking_uri=config.tracking_uri,
            )  # fmt: skip
            if not trackers:
                raise RuntimeFailure(f"{path}: {_failure(warnings) or 'the tracker did not start'}")
            entry.update(ids.state_dict())
            # the id first, durably: a crash after this continues the same tracker run
            write_text_atomic(state_path, jsonfile.dumps(state, indent=1) + "\n")
            reader = LogReader(
                path, config.fmt, config.pattern, live=config.follow, seq_length=config.seq_length
            )
            opened.append((path, entry["name"], trackers[0], reader))
            _supersede_rewritten(trackers[0], path, config)
            if not trackers[0].alive:
                raise RuntimeFailure(f"{path}: {_failure(warnings)}")

        points = dict.fromkeys((name for _, name, _, _ in opened), 0)

        def pump(final: bool) -> int:
            written = 0
            for _, name, tracker, reader in opened:
                batches = [reader.poll(), reader.settle()]
                if final:
                    batches.append(reader.finish(take_torn=False))
                for batch in batches:
                    for record in batch:
                        fresh = _log(tracker, record)
                        written += fresh
                        points[name] += fresh
                if not tracker.alive:
                    raise RuntimeFailure(f"{reader.name}: {_failure(warnings)}")
            return written

        if not config.follow:
            pump(final=True)
        else:
            pump(final=False)
            while not (should_stop and should_stop()):
                pump(final=False)
                if all(reader.tailer.eof for _, _, _, reader in opened):
                    break
                time.sleep(config.poll_s)
            pump(final=all(reader.tailer.eof for _, _, _, reader in opened))
        for _, _, tracker, reader in opened:
            counts.merge(reader.counts)
            tracker.close()
            if not tracker.alive:
                raise RuntimeFailure(f"{reader.name}: {_failure(warnings)}")
    finally:
        for _, _, _, reader in opened:
            reader.close()
    return {
        "runs": {
            name: {"tracker": config.tracker, "id": tracker.run_id, "points": points[name], "source": path}
            for path, name, tracker, _ in opened
        },
        "lines": counts.as_dict(),
        "counts": counts,
    }


def _failure(warnings: list[str]) -> str:
    """The last tracker warning as the cause of an error: what failed, without its own level."""
    if not warnings:
        return ""
    return getattr(warnings[-1], "failure", warnings[-1].removeprefix("warning: "))


def _log(tracker: Tracker, record: Record) -> int:
    """Log one parsed record; the number of new points it gave the tracker run."""
    shaped = as_record(record)
    if record.kind == "event":
        tracker.log(shaped, record.step)
        return 0
    before = {tag: tracker.last.get(tag, -1) for tag in tracker.last}
    tracker.log(shaped, record.step)
    return sum(1 for tag, step in tracker.last.items() if step != before.get(tag, -1))


def _supersede_rewritten(tracker: Tracker, path: str, config: UploadConfig) -> None:
    """Mark as superseded what the tracker run holds from the first step where the log now differs."""
    upto = max(tracker.last.values(), default=-1)
    if upto < 0:
        return
    differs = first_difference(tracker.history(), _first_values(path, config, upto), tracker.last)
    if differs is not None:
        mark_superseded([tracker], differs - 1)


def _first_values(path: str, config: UploadConfig, upto: int) -> dict[str, dict[int, float]]:
    """``{metric: {step: value}}`` of the log up to step ``upto``, each step's first value (as logged)."""
    out: dict[str, dict[int, float]] = {}
    with LogReader(path, config.fmt, config.pattern, seq_length=config.seq_length) as reader:
        for batch in (reader.poll(), reader.finish(take_torn=False)):
            for record in batch:
                if record.kind == "event" or record.step > upto:
                    continue
                for tag, value in scalars(as_record(record)).items():
                    out.setdefault(tag, {}).setdefault(record.step, value)
    return out


def first_difference(
    held: dict[str, dict[int, float]], log: dict[str, dict[int, float]], last: dict[str, int]
) -> int | None:
    """The first step, up to each metric's ``last`` step in the tracker, where the tracker's values
    (``held``) and the log's differ: a value (beyond float32 rounding, which some stores apply), or a step
    one of them lacks. None when they agree."""
    import math

    first: int | None = None
    for tag in held.keys() | log.keys():
        mine, theirs, upto = held.get(tag, {}), log.get(tag, {}), last.get(tag, -1)
        for step in sorted(s for s in mine.keys() | theirs.keys() if s <= upto):
            a, b = mine.get(step), theirs.get(step)
            numbers = isinstance(a, (int, float)) and b is not None
            if not (numbers and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)):
                first = step if first is None else min(first, step)
                break
    return first
