"""Metrics sinks, torchtitan style: ``log(record, step)`` and ``close()``; only rank 0 writes.

``metrics.jsonl`` gets one JSON object per line (schema: ``schemas/metrics.schema.json``, the contract
with ``llm-log``); TensorBoard gets every numeric field as a scalar ``{kind}/{name}`` when enabled.
The JSONL file is flushed after every record so ``tail -f`` and ``llm-log`` see progress while training.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    # JSON has no NaN/inf: write null so every line stays parseable by strict readers.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class NullLogger:
    """What ranks other than 0 get."""

    def log(self, record: dict, step: int) -> None:  # noqa: D102
        pass

    def close(self) -> None:  # noqa: D102
        pass


class JsonlLogger:
    """Append records to ``path`` (a resumed run keeps one file)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def log(self, record: dict, step: int) -> None:
        self._file.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


class TensorBoardLogger:
    """Scalars under ``RUN/tensorboard``: ``train/loss``, ``eval/eval_ppl``, ... (x axis: step)."""

    SKIP = {"kind", "step", "time", "event", "message", "skipped"}

    def __init__(self, folder: str | os.PathLike) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder))

    def log(self, record: dict, step: int) -> None:
        kind = record.get("kind", "train")
        if kind == "event":
            self.writer.add_text("events", f"{record.get('event')}: {record.get('message', '')}", step)
            return
        for key, value in record.items():
            if key in self.SKIP or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if isinstance(value, float) and not math.isfinite(value):
                continue
            self.writer.add_scalar(f"{kind}/{key}", value, step, walltime=record.get("time"))

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class MetricsLogger:
    """Fan a record out to every sink."""

    def __init__(self, sinks: list) -> None:
        self.sinks = sinks

    def log(self, record: dict, step: int) -> None:
        for sink in self.sinks:
            sink.log(record, step)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def build_metrics_logger(run_dir: str | os.PathLike, rank: int, tensorboard: bool = False) -> MetricsLogger:
    """metrics.jsonl (+ TensorBoard) on rank 0, nothing elsewhere."""
    if rank != 0:
        return MetricsLogger([NullLogger()])
    run_dir = Path(run_dir)
    sinks: list = [JsonlLogger(run_dir / "metrics.jsonl")]
    if tensorboard:
        sinks.append(TensorBoardLogger(run_dir / "tensorboard"))
    return MetricsLogger(sinks)
