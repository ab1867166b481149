"""The one in-memory shape every log format is parsed into, and the counts of what was read.

Whatever printed the log (llm-train's metrics.jsonl, Megatron-LM, DeepSpeed, MindFormers, anything
``key=value``), a metric point becomes a :class:`Record` with *canonical* value names, so plots,
summaries and TensorBoard tags agree across trainers: ``loss``, ``lr``, ``grad_norm``,
``tokens_per_s``, ``samples_per_s``, ``mfu``, ``memory_mb``, ``step_time_s``, ``consumed_samples``,
``consumed_tokens`` for training; ``eval_loss``, ``eval_ppl`` for evaluation. Names a trainer prints
that have no canonical twin are kept, slugged (``"params norm"`` -> ``params_norm``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

KINDS = ("train", "eval", "event")

# Line kinds counted while reading (the summary says how many of each were read).
LINE_KINDS = ("train", "eval", "event", "other", "invalid", "torn")


@dataclass(slots=True)
class Record:
    """One metric point (or event) of one step.

    ``values`` holds the numbers (canonical names); an ``event`` record carries ``event`` (start,
    resume, checkpoint, spike, nan, stop) and ``message`` instead. ``line`` is where it came from.
    """

    kind: str
    step: int
    time: float | None
    values: dict[str, float] = field(default_factory=dict)
    event: str | None = None
    message: str | None = None
    line: int = 0


@dataclass
class Counts:
    """How many lines of each kind were read (and where the first bad ones were)."""

    lines: int = 0
    by_kind: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LINE_KINDS, 0))
    first_problems: list[str] = field(default_factory=list)

    def add(self, kind: str, n: int = 1) -> None:
        self.by_kind[kind] = self.by_kind.get(kind, 0) + n

    def problem(self, message: str, limit: int = 5) -> None:
        if len(self.first_problems) < limit:
            self.first_problems.append(message)

    def merge(self, other: Counts) -> None:
        self.lines += other.lines
        for kind, n in other.by_kind.items():
            self.add(kind, n)
        for message in other.first_problems:
            self.problem(message)

    def describe(self) -> str:
        parts = [f"{n} {kind}" for kind, n in self.by_kind.items() if n]
        return f"{self.lines} lines read" + (": " + ", ".join(parts) if parts else "")

    def as_dict(self) -> dict:
        return {"lines": self.lines, **{k: v for k, v in self.by_kind.items()}}


_SLUG = re.compile(r"[^0-9a-zA-Z]+")


def slug(name: str) -> str:
    """``"params norm"`` -> ``params_norm``; ``"tokens per gpu per second(tgs)"`` -> ``tokens_per_gpu_per_second_tgs``."""
    return _SLUG.sub("_", name.strip()).strip("_").lower()


def tb_tags(record: Record) -> list[tuple[str, float]]:
    """The TensorBoard scalars of a record: ``train/<name>``, ``eval/<name>``, ``markers/<event>``."""
    if record.kind == "train":
        return [("train/" + name, value) for name, value in record.values.items()]
    if record.kind == "eval":
        # the same tags llm-train's own TensorBoard logger writes: eval/eval_loss, eval/eval_ppl
        return [("eval/" + name, value) for name, value in record.values.items()]
    return [(f"markers/{record.event}", record.values.get("value", 1.0))]
