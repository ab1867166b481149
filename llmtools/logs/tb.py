"""``llm-log tb``: logs to TensorBoard event files, exactly once, finished or live.

Idempotence. Each run folder holds ``.llm-log-state.json``: for every source log, the byte offset
and line number converted so far, hashes of the content before that offset, the last step, the
parser's and the spike detector's state; plus the event file we append to and its size at the last
commit. A re-run checks the hashes: if the log only grew it seeks to the offset and converts the
new lines; if the log was replaced (rotated, rewritten) it reads it from the start but drops
records at or before the last converted step. Commits are ordered: events are flushed (and
fsynced) first, then the state is replaced atomically. After a crash between the two, the next run
truncates our event file back to the committed size, so nothing is ever written twice. Deleting
the state file starts over: our event files (``*.llmtools``) of that run are then removed too.

Follow. ``--follow`` polls the logs; a line is converted once its newline is there; the file
being renamed away (rotation) or shrinking (truncation) is detected and the new content read from
its start. Ctrl-C (or SIGTERM) stops after committing what was converted.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from llmtools.errors import InputError, UsageError
from llmtools.formats import jsonfile
from llmtools.fsutil import disk_full_guard, make_parents, write_text_atomic
from llmtools.logs import tfevents
from llmtools.logs.analysis import SpikeConfig, SpikeDetector, spike_message
from llmtools.logs.parsers import FORMATS
from llmtools.logs.reader import LogReader, check_seq_length
from llmtools.logs.records import Counts, Record, tb_tags
from llmtools.logs.sources import check_readable, display_name, same_content

STATE_NAME = ".llm-log-state.json"
LOCK_NAME = ".llm-log.lock"
STATE_VERSION = 1


@dataclass
class TbConfig:
    """Options of ``llm-log tb`` (validated here, so the library refuses bad values too)."""

    logdir: Path
    run: str | None = None
    fmt: str = "auto"
    pattern: str | None = None
    follow: bool = False
    poll_s: float = 0.5
    commit_every_s: float = 2.0
    spikes: SpikeConfig = field(default_factory=SpikeConfig)
    seq_length: int | None = None  # derive token counts from samples (logs that print only samples)

    def __post_init__(self) -> None:
        self.logdir = Path(self.logdir)
        if self.fmt not in FORMATS:
            raise UsageError(f"--format: unknown format {self.fmt!r} (choose from {', '.join(FORMATS)})")
        if self.run is not None and (not self.run or "/" in self.run or self.run in (".", "..")):
            raise UsageError(f"--run: {self.run!r} is not a plain folder name")
        if not 0 < self.poll_s <= 3600:
            raise UsageError(f"--poll must be > 0 and at most 3600 seconds, got {self.poll_s}")
        check_seq_length(self.seq_length)


def run_name(path: str) -> str:
    """``run/metrics.jsonl`` -> ``run``; ``logs/train.log.gz`` -> ``train``; ``-`` -> ``stdin``."""
    if path == "-":
        return "stdin"
    p = Path(path).resolve()
    name = p.name
    for suffix in (".gz", ".zst", ".jsonl", ".json", ".log", ".txt", ".out"):
        name = name.removesuffix(suffix)
    if name in ("metrics", "log", "stdout", "output", "") and p.parent.name:
        return p.parent.name
    return name or "run"


def source_key(path: str) -> str:
    return "-" if path == "-" else str(Path(path).resolve())


@dataclass
class TbResult:
    runs: dict[str, dict] = field(default_factory=dict)  # run -> {"dir", "events_file", "points", ...}
    counts: Counts = field(default_factory=Counts)
    stopped: bool = False  # follow mode ended by should_stop (Ctrl-C / SIGTERM in the CLI)


class RunWriter:
    """One TensorBoard run folder: lock, state, the event file, spike detection, commits."""

    def __init__(self, folder: Path, spikes: SpikeConfig) -> None:
        self.folder = folder
        self.spike_config = spikes
        self.state: dict = {
            "version": STATE_VERSION,
            "events_file": None,
            "events_size": 0,
            "seq": 0,
            "sources": {},
        }
        self.writer: tfevents.EventFileWriter | None = None
        self.points = 0  # scalar + text values written by this process
        self.events = 0
        self._lock = None
        self._last_wall = time.time()

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> RunWriter:
        make_parents(self.folder)  # removed again, when empty, if the command fails
        self._fresh = not (self.folder / STATE_NAME).exists()
        self._created_events: Path | None = None
        self._committed = False
        lock_was_there = (self.folder / LOCK_NAME).exists()
        from llmtools.dirfd import open_path

        # never through a link planted at the lock path
        self._lock = os.fdopen(open_path(self.folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_APPEND), "a+")
        try:
            fcntl.flock(self._lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.close()
            raise UsageError(f"{self.folder}: another llm-log tb is writing to this run") from None
        try:
            self._load_state()
            self._repair()
            self._open_events()
        except BaseException:
            self._lock.close()
            if not lock_was_there:
                (self.folder / LOCK_NAME).unlink(missing_ok=True)
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.writer is not None:
                # Close without flushing: everything wanted was flushed by commit(); an
                # uncommitted tail (after an error) is cut off by the next run's _repair().
                self.writer.__exit__(RuntimeError, None, None)
            if exc[0] is not None and not self._committed:
                # Failed before its first commit: what this run created holds nothing of value.
                if self._created_events is not None:
                    self._created_events.unlink(missing_ok=True)
                if self._fresh:
                    (self.folder / LOCK_NAME).unlink(missing_ok=True)
        finally:
            if self._lock is not None:
                self._lock.close()

    def _load_state(self) -> None:
        path = self.folder / STATE_NAME
        if not path.exists():
            return
        try:
            state = jsonfile.loads(path.read_text(encoding="utf-8"), ours=True)
        except (OSError, ValueError) as error:
            raise InputError(
                f"{path}: unreadable llm-log state ({error}); delete it to convert from scratch"
            ) from None
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise InputError(f"{path}: not an llm-log state file of version {STATE_VERSION}")
        self.state = state

    def _repair(self) -> None:
        """Undo whatever a crashed run wrote after its last commit."""
        committed = self.state.get("events_file")
        for path in self.folder.glob("events.out.tfevents.*.llmtools"):
            if path.name != committed:
                path.unlink()  # written but never committed: its points will be converted again
        if committed:
            from llmtools.dirfd import refuse_link

            path = refuse_link(self.folder / committed)  # appended to below: never through a link
            size = int(self.state.get("events_size", 0))
            if path.exists() and path.stat().st_size > size:
                from llmtools.dirfd import open_path

                with os.fdopen(open_path(path, os.O_RDWR), "r+b") as handle:  # never through a link
                    handle.truncate(size)
            elif not path.exists() or path.stat().st_size < size:
                self.state["events_file"] = None  # lost or damaged by someone else: start a new file

    def _open_events(self) -> None:
        name = self.state.get("events_file")
        newest = max((p.name for p in self.folder.glob("*tfevents*")), default=None)
        if not name or newest != name:
            # TensorBoard reads a folder's event files in name order and only ever appends to
            # the last one; a file that is no longer the last must not grow.
            self.state["seq"] = int(self.state.get("seq", 0)) + 1
            name = tfevents.new_event_file_name(self.state["seq"])
            self.state["events_file"] = name
            self.state["events_size"] = 0
        path = self.folder / name
        if not path.exists():
            self._created_events = path
        self.writer = tfevents.EventFileWriter(path).__enter__()

    @property
    def events_path(self) -> Path:
        return self.folder / self.state["events_file"]

    # -- writing -------------------------------------------------------------------------------
    def source(self, key: str) -> dict:
        return self.state["sources"].setdefault(key, {})

    def write(self, record: Record, detector: SpikeDetector) -> None:
        wall = record.time
        if wall is None:
            wall = self._last_wall  # text logs without timestamps: the last time seen (or now)
        else:
            self._last_wall = wall
        if record.kind == "train":
            payload = tfevents.scalar_values("train/", record.values)
            count = len(record.values)
            loss = record.values.get("loss")
            if loss is not None:
                extra = self._loss_markers(record.step, loss, detector)
                if extra:
                    payload += b"".join(extra)
                    count += len(extra)
        else:
            parts = [tfevents.scalar_value(tag, value) for tag, value in tb_tags(record)]
            if record.kind == "event":
                text = f"step {record.step}: {record.event}" + (
                    f": {record.message}" if record.message else ""
                )
                parts.append(tfevents.text_value("events", text))
            payload = b"".join(parts)
            count = len(parts)
        if count:
            self.writer.write(tfevents.event(wall, record.step, [payload]))
            self.points += count
            self.events += 1

    @staticmethod
    def _loss_markers(step: int, loss: float, detector: SpikeDetector) -> list[bytes]:
        """Marker scalar + text for a NaN/inf loss or a loss spike (shown in TensorBoard's text tab)."""
        if not math.isfinite(loss):
            return [
                tfevents.scalar_value("markers/nan", 1.0),
                tfevents.text_value("events", f"step {step}: non-finite loss {loss}"),
            ]
        median = detector.check(loss)
        if median is None:
            return []
        return [
            tfevents.scalar_value("markers/spike", loss),
            tfevents.text_value("events", spike_message(step, loss, median)),
        ]

    def commit(self, readers: list[tuple[str, LogReader, SpikeDetector, dict]]) -> None:
        """Flush events durably, then record how far every source got (atomically)."""
        with disk_full_guard(self.events_path):
            self.state["events_size"] = self.writer.flush(durable=True)
        for key, reader, detector, extra in readers:
            entry = self.source(key)
            entry.update(extra)
            entry.update(
                {
                    "name": reader.name,
                    "offset": reader.offset,
                    "line": reader.line,
                    "format": reader.fmt,
                    "parser_state": reader.parser.state() if reader.parser else {},
                    "spike_window": list(detector.recent),
                    "inode": reader.tailer.inode(),
                }
            )
            # the bytes before the committed offset (which lags the tailer while sniffing)
            fp = reader.tailer.fingerprint(reader.offset)
            if fp is not None:
                entry.update(fp)
        write_text_atomic(self.folder / STATE_NAME, jsonfile.dumps(self.state, indent=1) + "\n")
        self._committed = True


@dataclass
class _Stream:
    """One source log feeding one run: where it is read, what was converted, the spike window."""

    writer: RunWriter
    key: str
    reader: LogReader
    detector: SpikeDetector
    step_filter: int | None  # for replaced content: only records beyond this step
    extra: dict  # last_step, records: kept in the state file

    def pump(self, final: bool) -> int:
        batches = [self.reader.poll(), self.reader.settle()]
        if final:
            batches.append(self.reader.finish(take_torn=False))
        written = 0
        extra = self.extra
        for batch in batches:
            for record in batch:
                if self.step_filter is not None and record.step <= self.step_filter:
                    continue
                self._note_restart(record)
                self.writer.write(record, self.detector)
                written += 1
                if extra["last_step"] is None or record.step > extra["last_step"]:
                    extra["last_step"] = record.step
        extra["records"] += written
        return written

    def _note_restart(self, record: Record) -> None:
        """A train step lower than the previous one is a restart from an earlier checkpoint: mark it,
        unless the log announced it itself (llm-train's resume event, Megatron's load message)."""
        extra = self.extra
        if record.kind == "event":
            if record.event == "resume":
                extra["announced"] = True
            return
        if record.kind != "train":
            return
        previous = extra.get("last_train_step")
        if previous is not None and record.step < previous and not extra.get("announced"):
            message = (
                f"step went back from {previous} to {record.step} (restarted from an earlier checkpoint?)"
            )
            self.writer.write(
                Record("event", record.step, record.time, event="resume", message=message), self.detector
            )
        extra["last_train_step"] = record.step
        extra["announced"] = False


def _open_reader(path: str, config: TbConfig, saved: dict) -> tuple[LogReader, int | None, str]:
    """A reader positioned after what was converted before, and the step filter to apply (if any)."""
    fmt = saved.get("format") or config.fmt
    if config.fmt != "auto":
        fmt = config.fmt
    if saved and path != "-" and saved.get("offset") and same_content(path, saved):
        reader = LogReader(
            path,
            fmt,
            config.pattern,
            offset=int(saved["offset"]),
            line=int(saved.get("line", 0)),
            live=config.follow,
            parser_state=saved.get("parser_state"),
            seq_length=config.seq_length,
        )
        return reader, None, "resumed"
    reader = LogReader(path, config.fmt, config.pattern, live=config.follow, seq_length=config.seq_length)
    if saved.get("last_step") is not None:
        # replaced or unseekable content: keep only what lies beyond the last converted step
        return reader, int(saved["last_step"]), "replaced"
    return reader, None, "new"


def _wait_for(path: str, config: TbConfig, should_stop, on_progress) -> None:
    """Following a run that has not written its log yet: wait for the file to appear."""
    if Path(path).exists():
        return
    if on_progress:
        on_progress(f"{path}: does not exist yet; waiting for it (Ctrl-C to stop)")
    while not Path(path).exists() and not (should_stop and should_stop()):
        time.sleep(config.poll_s)


def convert(
    logs: list[str],
    config: TbConfig,
    should_stop: Callable[[], bool] | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> TbResult:
    """Convert (and with ``config.follow``, keep converting) logs into TensorBoard runs."""
    if not logs:
        raise UsageError("give at least one LOG (or - for stdin)")
    if logs.count("-") > 1:
        raise UsageError("stdin (-) can be read only once")
    for path in logs:
        if config.follow and path != "-":
            _wait_for(path, config, should_stop, on_progress)
        check_readable(path)
    result = TbResult()
    groups: dict[str, list[str]] = {}
    for path in logs:
        name = config.run or run_name(path)
        if config.run is None and name in groups:
            index = 2
            while f"{name}-{index}" in groups:
                index += 1
            name = f"{name}-{index}"
        groups.setdefault(name, []).append(path)

    with contextlib.ExitStack() as stack:
        streams: list[_Stream] = []
        writers: dict[str, RunWriter] = {}
        for name, paths in groups.items():
            writer = stack.enter_context(RunWriter(config.logdir / name, config.spikes))
            writers[name] = writer
            for path in paths:
                key = source_key(path)
                saved = dict(writer.source(key))
                reader, step_filter, how = _open_reader(path, config, saved)
                stack.callback(reader.close)
                history = saved.get("spike_window") if how == "resumed" else None
                extra = {
                    "last_step": saved.get("last_step"),
                    "records": int(saved.get("records", 0)),
                    "last_train_step": saved.get("last_train_step") if how == "resumed" else None,
                }
                streams.append(
                    _Stream(writer, key, reader, SpikeDetector(config.spikes, history), step_filter, extra)
                )
                if on_progress and how != "new":
                    on_progress(f"{reader.name}: {how} (converted before up to line {saved.get('line', 0)})")

        def pump(final: bool) -> int:
            written = 0
            for stream in streams:
                written += stream.pump(final)
            return written

        def commit_all() -> None:
            for writer in writers.values():
                writer.commit([(s.key, s.reader, s.detector, s.extra) for s in streams if s.writer is writer])

        # A KeyboardInterrupt escaping from here commits nothing: the next run cuts the event
        # file back to the last commit. Follow mode stops through ``should_stop`` instead (the CLI
        # turns the first Ctrl-C / SIGTERM into that), between polls, after a final commit.
        if not config.follow:
            pump(final=True)
            commit_all()
        else:
            last_commit = time.monotonic()
            pump(final=False)
            commit_all()
            dirty = 0
            while not (should_stop and should_stop()):
                dirty += pump(final=False)
                if all(stream.reader.tailer.eof for stream in streams):
                    break  # nothing can grow any more (a pipe closed, a .gz read to its end)
                now = time.monotonic()
                if dirty and now - last_commit >= config.commit_every_s:
                    commit_all()
                    dirty, last_commit = 0, now
                time.sleep(config.poll_s)
            pump(final=all(stream.reader.tailer.eof for stream in streams))
            commit_all()
            result.stopped = True

        for stream in streams:
            result.counts.merge(stream.reader.counts)
        for name, writer in writers.items():
            result.runs[name] = {
                "dir": str(writer.folder),
                "events_file": str(writer.events_path),
                "points": writer.points,
                "events": writer.events,
                "sources": [display_name(p) for p in groups[name]],
            }
    return result
