"""Reading event files back with TensorBoard's own code (never with ours)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def expected(name: str) -> dict[str, dict[int, float]]:
    data = json.loads((FIXTURES / f"{name}.expected.json").read_text())
    return {tag: {int(step): value for step, value in points.items()} for tag, points in data.items()}


def accumulate(run_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} as TensorBoard shows it (EventAccumulator, after its restart purging)."""
    acc = accumulate(run_dir)
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def raw_points(run_dir: Path) -> Counter:
    """Every (tag, step, value) in every event file, counted: duplicates show up as counts > 1."""
    from tensorboard.backend.event_processing.event_file_loader import (
        LegacyEventFileLoader as EventFileLoader,
    )

    counts: Counter = Counter()
    for path in sorted(Path(run_dir).glob("*tfevents*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    counts[(value.tag, event.step, value.simple_value)] += 1
                else:
                    counts[(value.tag, event.step, bytes(value.tensor.string_val[0]))] += 1
    return counts


def texts(run_dir: Path, tag: str = "events") -> list[tuple[int, str]]:
    acc = accumulate(run_dir)
    if tag not in acc.Tags()["tensors"]:
        return []
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(tag)]


def f32(value: float) -> float:
    import numpy as np

    return float(np.float32(value))
