"""Metrics sinks, torchtitan style: ``log(record, step)`` and ``close()``; only rank 0 writes.

``metrics.jsonl`` gets one JSON object per line (schema: ``schemas/metrics.schema.json``, the contract
with ``llm-log``); TensorBoard gets every numeric field as a scalar ``{kind}/{name}`` when enabled.
The JSONL file is flushed after every record so ``tail -f`` and ``llm-log`` see progress while training.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

from llmtools.dirfd import append_file
from llmtools.formats import jsonfile


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
        self._file = append_file(self.path, encoding="utf-8")  # never through a planted link

    def log(self, record: dict, step: int) -> None:
        self._file.write(jsonfile.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


class TensorBoardLogger:
    """Scalars under ``RUN/tensorboard``: ``train/loss``, ``eval/eval_ppl``, ... (x axis: step).

    ``purge_step``: the first step this session writes; TensorBoard hides what earlier sessions wrote
    from that step on (a resumed run replaces the steps after its checkpoint)."""

    SKIP = {"kind", "step", "time", "event", "message", "skipped"}

    def __init__(self, folder: str | os.PathLike, purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder), purge_step=purge_step)

    def log(self, record: dict, step: int) -> None:
        kind = record.get("kind", "train")
        if kind == "event":
            self.writer.add_text("events", f"{record.get('event')}: {record.get('message', '')}", step)
            return
        for key, value in record.items():
            if isinstance(value, dict):  # a group of scalars (source_tokens): one tag per member
                for name, item in value.items():
                    self._scalar(f"{kind}/{key}/{name}", item, step, record)
            elif key not in self.SKIP:
                self._scalar(f"{kind}/{key}", value, step, record)

    def _scalar(self, tag: str, value, step: int, record: dict) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return
        if isinstance(value, float) and not math.isfinite(value):
            return
        self.writer.add_scalar(tag, value, step, walltime=record.get("time"))

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

    @property
    def trackers(self) -> list:
        return [sink for sink in self.sinks if hasattr(sink, "finish")]

    def finish(self, summary: dict[str, str], picture: Path | None) -> None:
        """The end of a run, for the experiment trackers: the final checkpoint and the curves picture."""
        for sink in self.trackers:
            sink.finish(summary, picture)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def event(metrics, step: int, name: str, message: str, **extra) -> None:
    """An ``event`` record (a start, a resume, a checkpoint, a stop, a health finding...) in the run's log."""
    metrics.log(
        {"kind": "event", "step": step, "time": time.time(), "event": name, "message": message, **extra},
        step,
    )


def build_metrics_logger(
    run_dir: str | os.PathLike,
    rank: int,
    tensorboard: bool = False,
    trackers: list | None = None,
    from_step: int | None = None,
) -> MetricsLogger:
    """metrics.jsonl (+ TensorBoard, + the experiment trackers already opened) on rank 0, nothing elsewhere.

    ``from_step``: the run (re)starts after this step (0 for a run starting over in its folder): what the
    log holds beyond it belongs to a timeline the run no longer has (rolled back, or replayed after a
    kill), so metrics.jsonl keeps only the history as it now stands and TensorBoard purges the rest."""
    if rank != 0:
        return MetricsLogger([NullLogger()])
    run_dir = Path(run_dir)
    if from_step is not None:
        keep_history(run_dir / "metrics.jsonl", from_step)
    sinks: list = [JsonlLogger(run_dir / "metrics.jsonl")]
    if tensorboard:
        folder = run_dir / "tensorboard"
        purge = from_step + 1 if from_step is not None and folder.is_dir() else None
        sinks.append(TensorBoardLogger(folder, purge_step=purge))
    return MetricsLogger(sinks + list(trackers or []))


def keep_history(path: Path, upto: int) -> bool:
    """Rewrite ``path`` (metrics.jsonl) without the records of steps after ``upto`` (-1: none kept) and
    without a line torn by a kill; untouched when there is nothing to drop. True when rewritten."""
    from llmtools.fsutil import write_text_atomic

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return False
    kept, dropped = [], False
    for line in text.splitlines(keepends=True):
        try:
            record = jsonfile.loads(line, ours=True) if line.endswith("\n") else None
        except ValueError:
            record = None
        step = record.get("step") if isinstance(record, dict) else None
        if isinstance(step, int) and not isinstance(step, bool) and step <= upto:
            kept.append(line)
        else:
            dropped = True
    if dropped:
        write_text_atomic(path, "".join(kept))
    return dropped


# Dense bf16 peak of one device, for MFU (TFLOP/s). CPU peaks are unknown: MFU is null there unless
# LLMTOOLS_PEAK_TFLOPS says; the record still carries the achieved TFLOP/s.
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "4090": 165.0}


def peak_tflops(device: str) -> float | None:
    env = os.environ.get("LLMTOOLS_PEAK_TFLOPS")
    if env:
        return float(env)
    if device.startswith("cuda"):
        import torch

        name = torch.cuda.get_device_name()
        for key, value in PEAK_TFLOPS.items():
            if key in name:
                return value
    return None


def memory_mb(device: str) -> float | None:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.max_memory_allocated() / 2**20
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except ImportError:
        return None


class StepWindow:
    """The steps since the last train record: their loss, time, tokens and skips, averaged into the
    next record of ``metrics.jsonl`` (schemas/metrics.schema.json) and its line on stderr."""

    def __init__(self) -> None:
        self.loss, self.n, self.time, self.tokens, self.skipped, self.steps = 0.0, 0, 0.0, 0, 0, 0
        self.overflows = 0
        self.task_sums: dict[str, float] = {}
        self.task_counts: dict[str, int] = {}

    def add(
        self,
        loss: float,
        seconds: float,
        tokens: int,
        skipped: bool,
        task_metrics: dict[str, float] | None = None,
        overflow: bool = False,
    ) -> None:
        """One step; ``task_metrics`` are the task's own (averaged over the window's finite values);
        ``overflow``: fp16 gradients overflowed and the loss scaler skipped the update."""
        if math.isfinite(loss):
            self.loss += loss
            self.n += 1
        for name, value in (task_metrics or {}).items():
            self.task_sums.setdefault(name, 0.0)
            self.task_counts.setdefault(name, 0)
            if math.isfinite(value):
                self.task_sums[name] += value
                self.task_counts[name] += 1
        self.time += seconds
        self.steps += 1
        self.tokens += tokens
        self.skipped += int(skipped)
        self.overflows += int(overflow)

    def record(self, step: int, **fields) -> dict:
        """The train record for ``step``; ``fields`` are the step's own values (consumed counts, grad
        norm, lr, device, flops_per_token, peak_tflops, world)."""
        tokens_per_s = self.tokens / max(self.time, 1e-9)
        achieved = fields.pop("flops_per_token") * tokens_per_s / fields.pop("world")
        peak = fields.pop("peak_tflops")
        record = {
            "kind": "train",
            "step": step,
            "time": time.time(),
            "consumed_samples": fields.pop("consumed_samples"),
            "consumed_tokens": fields.pop("consumed_tokens"),
            "loss": self.loss / self.n if self.n else float("nan"),
            "grad_norm": fields.pop("grad_norm"),
            "lr": fields.pop("lr"),
            "step_time_s": self.time / self.steps,
            "tokens_per_s": tokens_per_s,
            "mfu": achieved / (peak * 1e12) if peak else None,
            "memory_mb": memory_mb(fields.pop("device")),
            "tflops_per_device": achieved / 1e12,
        }
        if fields:
            raise TypeError(f"StepWindow.record: unknown fields {sorted(fields)}")
        for name, total in self.task_sums.items():
            count = self.task_counts[name]
            record[name] = total / count if count else float("nan")
        if self.skipped:
            record["skipped"] = True
            record["skipped_steps"] = self.skipped
        if self.overflows:
            record["overflow_steps"] = self.overflows
        return record


def clock(seconds: float) -> str:
    """1:02:03 or 2:03 (hours only when there are some)."""
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def step_line(
    record: dict,
    total_steps: int,
    elapsed_s: float | None = None,
    eta_s: float | None = None,
    shown: tuple[tuple[str, str], ...] = (),
) -> str:
    """The readable stderr line of a train record (with the time since this process started training and
    the time left at its mean pace so far, when given); ``shown``: the task's ``(key, label)`` metrics."""
    mfu = f" | mfu {record['mfu']:.1%}" if record["mfu"] is not None else ""
    norm = f"{record['grad_norm']:.3f}" if record["grad_norm"] is not None else "n/a"
    mem = f" | mem {record['memory_mb']:.0f} MB" if record["memory_mb"] is not None else ""
    moe = ""
    if "moe_aux_loss" in record:
        dropped = f" drop {record['moe_dropped']:.1%}" if record["moe_dropped"] else ""
        moe = f" | router aux {record['moe_aux_loss']:.3f} load cv {record['moe_load_cv']:.2f}{dropped}"
    update = f" | update/param {record['update_ratio']:.2e}" if record.get("update_ratio") is not None else ""
    scale = f" | loss scale {record['loss_scale']:g}" if record.get("loss_scale") is not None else ""
    task = "".join(
        f" | {label} {record[key]:.4f}" for key, label in shown if isinstance(record.get(key), (int, float))
    )
    times = ""
    if elapsed_s is not None:
        times = f" | elapsed {clock(elapsed_s)}" + (f" eta {clock(eta_s)}" if eta_s is not None else "")
    return (
        f"step {record['step']:>6}/{total_steps} | loss {record['loss']:.4f} | lr {record['lr']:.3e} | "
        f"grad norm {norm}{update}{scale}{task} | {record['tokens_per_s']:,.0f} tok/s | "
        f"{1000 * record['step_time_s']:.0f} ms/step{mfu}{mem}{moe}{times}"
    )
