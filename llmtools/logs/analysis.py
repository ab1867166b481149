"""What a run's records say: loss spikes, resumes and gaps, and the per-run summary table.

Everything here streams: a detector or a summary sees one record at a time and keeps bounded
state (a window of recent losses, running sums), so a million-record log costs no more memory
than a small one. Only the step sequence is kept (8 bytes a step) to find gaps at the end.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, insort
from collections import Counter, deque
from dataclasses import dataclass, field

from llmtools.errors import UsageError
from llmtools.logs.records import Counts, Record

# The reward metrics llm-train's preference task (and TRL) log; the summary shows how they moved.
PREFERENCE_METRICS = ("rewards/accuracies", "rewards/margins")


@dataclass
class SpikeConfig:
    """A loss is a spike when it exceeds ``(1 + threshold)`` x the median of the previous ``window`` losses."""

    threshold: float = 0.25
    window: int = 20
    min_points: int = 5

    def __post_init__(self) -> None:
        if not 0 < self.threshold < float("inf"):
            raise UsageError(f"--spike-threshold must be a finite number > 0, got {self.threshold}")
        if self.window < 3:
            raise UsageError(f"--spike-window must be >= 3, got {self.window}")


class SpikeDetector:
    """Flags losses far above the recent median (robust to the spike itself and to noise)."""

    def __init__(self, config: SpikeConfig | None = None, history: list[float] | None = None) -> None:
        self.config = config or SpikeConfig()
        self.recent: deque[float] = deque(maxlen=self.config.window)
        self._sorted: list[float] = []  # the window, kept sorted (insort/remove: no sort per point)
        self._factor = 1 + self.config.threshold
        for loss in history or ():
            self._push(float(loss))

    def _push(self, loss: float) -> None:
        if len(self.recent) == self.recent.maxlen:
            del self._sorted[bisect_left(self._sorted, self.recent[0])]
        self.recent.append(loss)
        insort(self._sorted, loss)

    def check(self, loss: float) -> float | None:
        """The median the loss spiked above, or None. NaN/inf losses are not spikes (see ``nan``)."""
        if not math.isfinite(loss):
            return None
        median = None
        ordered = self._sorted
        n = len(ordered)
        if n >= self.config.min_points:
            mid = n // 2
            median = ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2
        self._push(loss)
        if median is not None and median > 0 and loss > median * self._factor:
            return median
        return None


def spike_message(step: int, loss: float, median: float) -> str:
    return f"loss spike at step {step}: {loss:.4g} is {loss / median:.2f}x the recent median {median:.4g}"


@dataclass
class RunSummary:
    """Streaming per-run statistics for ``llm-log summary``."""

    name: str
    sources: list[str] = field(default_factory=list)
    formats: list[str] = field(default_factory=list)
    spike_config: SpikeConfig = field(default_factory=SpikeConfig)
    counts: Counts = field(default_factory=Counts)

    def __post_init__(self) -> None:
        self.train_records = 0
        self.steps = array("q")
        self.last_tokens: float | None = None
        self.first_loss = self.last_loss = self.min_loss = None
        self.min_loss_step = None
        self.eval_loss = self.eval_ppl = None
        self.eval_accuracy = self.eval_bpb = None
        self.eval_step = None
        self._sums: Counter = Counter()
        self._ns: Counter = Counter()
        self.spikes: list[int] = []
        self.nan_steps: list[int] = []
        self.events: Counter = Counter()
        self.resume_steps: list[int] = []
        self._detector = SpikeDetector(self.spike_config)
        self._last_step_seen: int | None = None
        self.preference: dict[str, list[float]] = {}  # name -> [first, last] of a preference run's rewards

    def add(self, record: Record) -> None:
        if record.kind == "event":
            self.events[record.event] += 1
            if record.event == "resume":
                self.resume_steps.append(record.step)
            return
        values = record.values
        if record.kind == "eval":
            for name, value in values.items():
                if name == "eval_loss":
                    self.eval_loss, self.eval_step = value, record.step
                elif name == "eval_ppl":
                    self.eval_ppl = value
                elif name == "eval_accuracy":
                    self.eval_accuracy = value
                elif name == "eval_bpb":
                    self.eval_bpb = value
            if "eval_loss" in values and "eval_ppl" not in values and math.isfinite(values["eval_loss"]):
                self.eval_ppl = math.exp(min(values["eval_loss"], 700.0))
            return
        # several train records can share a step (DeepSpeed: progress, timers, throughput)
        if record.step != self._last_step_seen:
            self.train_records += 1
            self.steps.append(record.step)
            self._last_step_seen = record.step
        tokens = values.get("consumed_tokens")
        if tokens is not None:
            self.last_tokens = tokens
        loss = values.get("loss")
        if loss is not None:
            if not math.isfinite(loss):
                self.nan_steps.append(record.step)
            else:
                if self.first_loss is None:
                    self.first_loss = loss
                self.last_loss = loss
                if self.min_loss is None or loss < self.min_loss:
                    self.min_loss, self.min_loss_step = loss, record.step
                if self._detector.check(loss) is not None:
                    self.spikes.append(record.step)
        for name in ("tokens_per_s", "mfu", "samples_per_s", "step_time_s", "grad_norm", "update_ratio"):
            value = values.get(name)
            if value is not None and math.isfinite(value):
                self._sums[name] += value
                self._ns[name] += 1
        for name in PREFERENCE_METRICS:
            value = values.get(name)
            if value is not None and math.isfinite(value):
                self.preference.setdefault(name, [value, value])[1] = value

    def mean(self, name: str) -> float | None:
        return self._sums[name] / self._ns[name] if self._ns[name] else None

    def gaps(self) -> list[dict]:
        """Where the step sequence breaks: it goes back or repeats (a resume), or jumps (missing steps)."""
        steps = self.steps
        if len(steps) < 2:
            return []
        diffs = Counter(b - a for a, b in zip(steps, steps[1:], strict=False) if b > a)
        interval = diffs.most_common(1)[0][0] if diffs else 1
        out = []
        for a, b in zip(steps, steps[1:], strict=False):
            if b <= a:
                out.append({"after": a, "next": b, "kind": "resume"})
            elif b - a > interval:
                out.append({"after": a, "next": b, "kind": "gap", "missing": (b - a) // interval - 1})
        return out

    def as_dict(self) -> dict:
        steps = self.steps
        gaps = self.gaps()
        return {
            "run": self.name,
            "sources": self.sources,
            "format": ",".join(sorted(set(f for f in self.formats if f))) or None,
            "steps": self.train_records,
            "first_step": steps[0] if steps else None,
            "last_step": max(steps) if steps else None,
            "tokens": self.last_tokens,
            "first_loss": self.first_loss,
            "last_loss": self.last_loss,
            "min_loss": self.min_loss,
            "min_loss_step": self.min_loss_step,
            "eval_loss": self.eval_loss,
            "eval_ppl": self.eval_ppl,
            "eval_step": self.eval_step,
            "eval_accuracy": self.eval_accuracy,
            "eval_bpb": self.eval_bpb,
            "mean_update_ratio": self.mean("update_ratio"),
            "mean_tokens_per_s": self.mean("tokens_per_s"),
            "mean_samples_per_s": self.mean("samples_per_s"),
            "mean_mfu": self.mean("mfu"),
            "mean_step_time_s": self.mean("step_time_s"),
            "spikes": len(self.spikes),
            "spike_steps": self.spikes[:20],
            "nan_losses": len(self.nan_steps),
            "nan_steps": self.nan_steps[:20],
            # a logged resume event and the step going back describe the same resume: count once
            "resumes": max(sum(1 for g in gaps if g["kind"] == "resume"), len(self.resume_steps)),
            "gaps": gaps[:50],
            "events": dict(self.events),
            "lines": self.counts.as_dict(),
            # preference training (llm-train task: dpo): the first and last value of its reward metrics
            "rewards": {name: {"first": a, "last": b} for name, (a, b) in self.preference.items()} or None,
        }


def _fmt(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return f"{int(value):,}"
        if 1000 <= abs(value) < 1e15:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def format_table(summaries: list[dict]) -> str:
    """One block per run: a two-column table a human reads at a glance."""
    blocks = []
    for s in summaries:
        gap_text = ", ".join(f"{g['after']}->{g['next']} ({g['kind']})" for g in s["gaps"][:5]) + (
            " ..." if len(s["gaps"]) > 5 else ""
        )
        rows = [
            ("run", s["run"]),
            ("format", s["format"]),
            ("steps", f"{_fmt(s['steps'])} ({_fmt(s['first_step'])} .. {_fmt(s['last_step'])})"),
            ("tokens", _fmt(s["tokens"])),
            (
                "loss first/last/min",
                f"{_fmt(s['first_loss'])} / {_fmt(s['last_loss'])} / {_fmt(s['min_loss'])}"
                + (f" (step {s['min_loss_step']})" if s["min_loss_step"] is not None else ""),
            ),
            (
                "eval loss / ppl",
                f"{_fmt(s['eval_loss'])} / {_fmt(s['eval_ppl'])}"
                + (f" (step {s['eval_step']})" if s["eval_step"] is not None else ""),
            ),
            ("eval acc / bpb", f"{_fmt(s['eval_accuracy'])} / {_fmt(s['eval_bpb'])}"),
            *(
                [
                    (
                        "reward acc / margin",
                        " / ".join(
                            f"{_fmt(r['first'])} -> {_fmt(r['last'])}" if r else "-"
                            for r in (s["rewards"].get(n) for n in PREFERENCE_METRICS)
                        ),
                    )
                ]
                if s.get("rewards")
                else []
            ),
            ("mean tokens/s", _fmt(s["mean_tokens_per_s"])),
            ("mean update ratio", _fmt(s["mean_update_ratio"])),
            ("mean samples/s", _fmt(s["mean_samples_per_s"])),
            ("mean MFU", _fmt(s["mean_mfu"])),
            (
                "spikes",
                f"{s['spikes']}"
                + (f" at {', '.join(map(str, s['spike_steps'][:5]))}" if s["spikes"] else ""),
            ),
            (
                "NaN/inf losses",
                f"{s.get('nan_losses', len(s.get('nan_steps', [])))}"
                + (f" at {', '.join(map(str, s['nan_steps'][:5]))}" if s.get("nan_steps") else "")
                + (" (not in first/last/min)" if s.get("nan_steps") else ""),
            ),
            (
                "resumes / gaps",
                f"{s['resumes']} / {sum(1 for g in s['gaps'] if g['kind'] == 'gap')}"
                + (f": {gap_text}" if s["gaps"] else ""),
            ),
            (
                "lines",
                ", ".join(f"{v} {k}" for k, v in s["lines"].items() if v and k != "lines")
                + f" (of {s['lines']['lines']})",
            ),
        ]
        width = max(len(k) for k, _ in rows)
        blocks.append("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
    return "\n\n".join(blocks)
