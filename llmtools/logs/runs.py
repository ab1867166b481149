"""Reading whole logs as named runs, for ``summary`` and ``plot`` (``tb`` streams on its own)."""

from __future__ import annotations

from collections.abc import Callable

from llmtools.errors import UsageError
from llmtools.logs.analysis import RunSummary, SpikeConfig
from llmtools.logs.plot import Curves
from llmtools.logs.reader import LogReader
from llmtools.logs.records import Record
from llmtools.logs.sources import check_readable
from llmtools.logs.tb import run_name


def name_runs(logs: list[str], names: list[str] | None = None) -> list[str]:
    """One name per log: given ones first, else derived from the path (made unique)."""
    if names and len(names) > len(logs):
        raise UsageError(f"--name given {len(names)} times for {len(logs)} logs")
    out: list[str] = []
    for index, path in enumerate(logs):
        name = names[index] if names and index < len(names) else run_name(path)
        base, n = name, 2
        while name in out:
            name, n = f"{base}-{n}", n + 1
        out.append(name)
    return out


def _check_inputs(logs: list[str]) -> None:
    if not logs:
        raise UsageError("give at least one LOG (or - for stdin)")
    if logs.count("-") > 1:
        raise UsageError("stdin (-) can be read only once")
    for path in logs:
        check_readable(path)


def _each_record(path: str, fmt: str, pattern: str | None, sink: Callable[[Record], None], seq_length=None):
    with LogReader(path, fmt, pattern, seq_length=seq_length) as reader:
        for record in reader.poll():
            sink(record)
        for record in reader.finish(take_torn=True):
            sink(record)
        return reader.counts, reader.fmt


def summarize(
    logs: list[str],
    fmt: str = "auto",
    pattern: str | None = None,
    names: list[str] | None = None,
    spikes: SpikeConfig | None = None,
    seq_length: int | None = None,
) -> list[RunSummary]:
    _check_inputs(logs)
    out = []
    for path, name in zip(logs, name_runs(logs, names), strict=True):
        summary = RunSummary(name, sources=[path], spike_config=spikes or SpikeConfig())
        counts, found = _each_record(path, fmt, pattern, summary.add, seq_length)
        summary.counts = counts
        summary.formats.append(found)
        out.append(summary)
    return out


def collect_curves(
    logs: list[str],
    x: str = "steps",
    fmt: str = "auto",
    pattern: str | None = None,
    names: list[str] | None = None,
    seq_length: int | None = None,
) -> tuple[list[Curves], list]:
    _check_inputs(logs)
    runs, all_counts = [], []
    for path, name in zip(logs, name_runs(logs, names), strict=True):
        curves = Curves(name)
        last_tokens = [None]
        counts, _ = _each_record(
            path, fmt, pattern, lambda r, c=curves, t=last_tokens: c.add(r, x, t), seq_length
        )
        runs.append(curves)
        all_counts.append(counts)
    return runs, all_counts
