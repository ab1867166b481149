"""Blending in stages: one builder for mixture schedules and for a mix changed in flight.

A run's train data is a sequence of **stages**. Stage *k* covers the global sample positions
``[start, end)`` and blends its sources with Megatron's greedy (:func:`~llmtools.data.blend.
build_blending_indices`), started afresh at ``start``; source *i*'s draws in the stage continue its
stream (:mod:`llmtools.data.streams`) at the position ``offsets[i]`` where the earlier stages left
it. So within a stage the blend is Megatron's, and across stages every source continues where it
stopped: nothing is repeated or skipped until its epoch ends.

Where stages come from:

- a static ``mix.json`` is one stage (offsets 0): the builder gives exactly megatron-core's arrays;
- a staged ``mix.json`` (``llm-mix --stage UNTIL WEIGHTS``) is several, planned up front;
- ``llm-train --resume auto --set data.mix=new.json`` starts the new plan's stages at the resumed
  position, so a schedule run in one go and the same schedule applied mix by mix give the same data.

:class:`StageKey` is where a stage ends as the user said it (a step, tokens, samples, a share of the
plan, or its end); :func:`resolve_ranges` turns them into sample ranges and refuses overlaps, gaps and
schedules that end early. :func:`build` computes the arrays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from llmtools.data.blend import build_blending_indices
from llmtools.data.streams import SourceStream
from llmtools.errors import InputError

UNITS = ("step", "tokens", "samples", "percent", "end")


@dataclass(frozen=True)
class StageKey:
    """A stage boundary as given: ``step:800``, ``tokens:1.8B``, ``samples:12800``, ``90%``, ``end``."""

    unit: str
    value: float | int | None = None

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise InputError(f"stage boundary unit {self.unit!r}: use one of {', '.join(UNITS)}")
        if self.unit == "end":
            return
        if (
            not isinstance(self.value, int | float)
            or isinstance(self.value, bool)
            or not math.isfinite(self.value)
            or self.value < 0
        ):
            raise InputError(f"stage boundary {self.unit}: {self.value!r} is not a non-negative number")
        if self.unit == "percent" and self.value > 100:
            raise InputError(f"stage boundary {self.value}%: above 100%")

    def text(self) -> str:
        if self.unit == "end":
            return "end"
        if self.unit == "percent":
            return f"{self.value:g}%"
        return f"{self.unit}:{self.value:g}" if isinstance(self.value, float) else f"{self.unit}:{self.value}"

    def to_json(self) -> dict:
        return {"unit": self.unit, "value": self.value}

    @classmethod
    def from_json(cls, data, where: str) -> StageKey:
        if not isinstance(data, dict) or not isinstance(data.get("unit"), str):
            raise InputError(f"{where}: expected {{'unit': ..., 'value': ...}}")
        try:
            return cls(data["unit"], data.get("value"))
        except InputError as error:
            raise InputError(f"{where}: {error}") from None

    def samples(self, plan_samples: int, seq_length: int, global_batch: int | None, where: str) -> int:
        """The sample position this key names in a plan of ``plan_samples`` samples."""
        if self.unit == "end":
            return plan_samples
        if self.unit == "samples":
            return int(self.value)
        if self.unit == "tokens":
            return -(-int(self.value) // seq_length)
        if self.unit == "percent":
            return int(math.ceil(plan_samples * float(self.value) / 100.0))
        if global_batch is None:
            raise InputError(
                f"{where}: stage boundary {self.text()} is in steps; give the global batch size "
                "(llm-mix --global-batch-size N) to turn steps into samples"
            )
        return int(self.value) * int(global_batch)


@dataclass(frozen=True)
class StageSpec:
    """One stage of a mixture schedule as configured: from where, until where, one weight per source."""

    start: StageKey
    until: StageKey
    weights: tuple[float, ...]

    def to_json(self) -> dict:
        return {"from": self.start.to_json(), "until": self.until.to_json(), "weights": list(self.weights)}


def resolve_ranges(
    specs: Sequence[StageSpec], plan_samples: int, seq_length: int, global_batch: int | None, where: str
) -> list[tuple[int, int]]:
    """Sample ranges ``[start, end)`` of each stage; InputError for an overlap, a gap, an empty stage,
    or a schedule that does not start at 0 or ends before ``plan_samples``. ``where`` names stage k in
    messages, formatted with ``k`` (from 0) and ``n`` (from 1): ``"--stage {n}"``, ``"mix.json[stages[{k}]]"``."""
    ranges = []
    for k, spec in enumerate(specs):
        at = where.format(k=k, n=k + 1) + f" ({spec.until.text()})"
        start = spec.start.samples(plan_samples, seq_length, global_batch, at)
        end = spec.until.samples(plan_samples, seq_length, global_batch, at)
        if k == 0 and start != 0:
            raise InputError(
                f"{at}: the first stage starts at sample {start} ({spec.start.text()}), not at 0"
            )
        if k > 0:
            before = ranges[-1][1]
            if start < before:
                raise InputError(
                    f"{at}: starts at sample {start} ({spec.start.text()}) but stage {k - 1} runs until "
                    f"sample {before} ({specs[k - 1].until.text()}): the ranges overlap"
                )
            if start > before:
                raise InputError(
                    f"{at}: starts at sample {start} ({spec.start.text()}) but stage {k - 1} ends at "
                    f"sample {before} ({specs[k - 1].until.text()}): a gap of {start - before} samples"
                )
        if end <= start:
            raise InputError(
                f"{at}: ends at sample {end}, not after its start at sample {start} ({spec.start.text()}): "
                "the stages overlap or are out of order"
            )
        if end > plan_samples:
            raise InputError(f"{at}: ends at sample {end}, beyond the plan's {plan_samples} samples")
        ranges.append((start, end))
    if not ranges:
        raise InputError(f"{where.format(k=0, n=1)}: an empty stage schedule")
    if ranges[-1][1] != plan_samples:
        last = specs[-1].until.text()
        raise InputError(
            f"{where.format(k=len(specs) - 1, n=len(specs))} ({last}): the schedule ends at sample "
            f"{ranges[-1][1]}, before the plan's {plan_samples} samples: end the last stage with 'end'"
        )
    return ranges


# -- stages in a run's positions, and the builder ----------------------------------------------------
@dataclass
class Stage:
    """One stage in global sample positions."""

    start: int
    end: int
    keys: list[str]
    """The sources it draws from (weight > 0), in blend order (ties go to the first)."""
    blend_weights: list[float]
    """Exactly what the greedy is given (Megatron normalises twice)."""
    weights: list[float]
    """The requested shares, normalised (for reports)."""
    offsets: dict[str, int] | None = None
    """Stream position of each source at ``start``; None: where the earlier stages left them."""
    origin: dict = field(default_factory=dict)
    """Where it came from: ``{"plan": hash, "stage": index in that plan, "path": mix.json}``."""

    def to_json(self) -> dict:
        return {
            "start": self.start,
            "end": self.end,
            "keys": list(self.keys),
            "blend_weights": list(self.blend_weights),
            "weights": list(self.weights),
            "offsets": dict(self.offsets or {}),
            "origin": dict(self.origin),
        }

    @classmethod
    def from_json(cls, data, where: str) -> Stage:
        if not isinstance(data, dict):
            raise InputError(f"{where}: expected an object")
        start, end = data.get("start"), data.get("end")
        keys, bw, weights = data.get("keys"), data.get("blend_weights"), data.get("weights")
        offsets, origin = data.get("offsets"), data.get("origin", {})
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end))
        if not ints or not 0 <= start < end:
            raise InputError(f"{where}.start/end: expected integers 0 <= start < end")
        if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
            raise InputError(f"{where}.keys: expected a non-empty list of source keys")
        for name, values in (("blend_weights", bw), ("weights", weights)):
            if (
                not isinstance(values, list)
                or len(values) != len(keys)
                or not all(isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in values)
            ):
                raise InputError(f"{where}.{name}: expected one non-negative number per key")
        if (
            not isinstance(offsets, dict)
            or set(offsets) != set(keys)
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in offsets.values())
        ):
            raise InputError(f"{where}.offsets: expected a stream position (integer >= 0) per key")
        if not isinstance(origin, dict):
            raise InputError(f"{where}.origin: expected an object")
        return cls(
            start, end, list(keys), [float(v) for v in bw], [float(v) for v in weights], dict(offsets), origin
        )


@dataclass(frozen=True)
class Skip:
    """Quarantine of a source: from stream position ``start`` on, samples that read any of
    ``documents`` are passed over (the next sample of the same source replaces each)."""

    start: int
    documents: tuple[int, ...]

    def to_json(self) -> dict:
        return {"from": self.start, "documents": list(self.documents)}


@dataclass
class Built:
    """The arrays of a run's live stages, from global position ``base`` on, and how to read them."""

    parts: list[tuple[str, int]]
    """What each value of ``dataset_index`` means: (source key, stream segment)."""
    dataset_index: np.ndarray
    dataset_sample_index: np.ndarray
    base: int
    stages: list[Stage]
    before: list[dict[str, int]]
    """Per stage: draws of each source between its start and ``base`` (0 for stages starting later)."""
    draws: list[dict[str, np.ndarray]]
    """Per stage: the stream positions of the stage's draws of a source, where they are not simply
    ``offset + c`` (quarantined positions passed over)."""
    counts: list[dict[str, int]]
    """Per stage: draws of each source in the whole stage."""

    @property
    def end(self) -> int:
        return self.stages[-1].end if self.stages else self.base

    def position_after(self, k: int, key: str, drawn: int) -> int:
        """The stream position after a source's first ``drawn`` draws in stage ``k``."""
        stage = self.stages[k]
        if drawn == 0:
            return stage.offsets[key]
        fixed = self.draws[k].get(key)
        if fixed is not None:
            return int(fixed[drawn - 1]) + 1
        return stage.offsets[key] + drawn


class ExhaustedSource(InputError):
    """Every sample a source has left reads a quarantined document."""

    def __init__(self, stream: SourceStream) -> None:
        super().__init__(
            f"{stream.spec.prefix}: source {stream.spec.name} is exhausted: every sample of its train split "
            "reads a quarantined document (the run's quarantine.jsonl); nothing is left to draw from it: take "
            "it out of the mix (llm-mix) and resume with the new mix"
        )


def take_positions(stream: SourceStream, start: int, count: int, skips: Sequence[Skip]) -> np.ndarray | None:
    """The stream positions of ``count`` draws from position ``start`` on, passing over quarantined
    samples; None when none is passed over (the positions are ``start .. start + count - 1``)."""
    if count == 0 or not skips:
        return None
    quarantined = np.unique(np.concatenate([np.asarray(s.documents, dtype=np.int64) for s in skips]))
    if np.isin(stream.split_documents(), quarantined).all():
        raise ExhaustedSource(stream)
    hi = start + count
    # Every epoch reads every document of the split: two epochs' positions with no sample left to draw
    # mean none will ever be (the bound that keeps the search finite whatever the quarantine holds).
    limit = 2 * stream.epoch_samples + count
    while True:
        bad = [stream.bad_positions(s.documents, max(start, s.start), hi) for s in skips if s.start < hi]
        bad = np.unique(np.concatenate(bad)) if bad else np.empty(0, np.int64)
        if bad.size == 0:
            return None if hi == start + count else np.arange(start, start + count, dtype=np.int64)
        good = np.setdiff1d(np.arange(start, hi, dtype=np.int64), bad, assume_unique=True)
        if good.size >= count:
            return good[:count]
        if good.size == 0 and hi - start >= limit:
            raise ExhaustedSource(stream)
        hi += count - good.size


def build(
    streams: dict[str, SourceStream],
    stages: Sequence[Stage],
    base: int,
    skips: dict[str, list[Skip]] | None = None,
    positions: dict[str, int] | None = None,
) -> Built:
    """The arrays of ``stages`` for global positions ``[base, last end)``.

    A stage whose ``offsets`` are None starts every source where the stages before it left it (or at
    ``positions[key]``, else 0, for a source they did not draw). The filled-in stages are returned.
    """
    skips = skips or {}
    where_now: dict[str, int] = dict(positions or {})
    parts: list[tuple[str, int]] = []
    part_id: dict[tuple[str, int], int] = {}

    def part(key: str, segment: int) -> int:
        ident = (key, segment)
        if ident not in part_id:
            if len(parts) >= np.iinfo(np.int16).max:
                raise InputError(f"a blend of more than {np.iinfo(np.int16).max} source segments")
            part_id[ident] = len(parts)
            parts.append(ident)
        return part_id[ident]

    chunks_di, chunks_dsi, filled, befores, fixed_all, counts_all = [], [], [], [], [], []
    for stage in stages:
        if stage.offsets is None:
            stage = Stage(
                stage.start,
                stage.end,
                stage.keys,
                stage.blend_weights,
                stage.weights,
                {key: where_now.get(key, 0) for key in stage.keys},
                stage.origin,
            )
        length = stage.end - stage.start
        ids, within = [], []
        for key in stage.keys:
            stream, offset = streams[key], stage.offsets[key]
            segment = stream.segment_of(offset)
            ids.append(part(key, segment))
            within.append(offset - stream.start(segment))
        di, dsi, counts = build_blending_indices(
            stage.blend_weights, length, parts=ids, offsets=within, with_counts=True
        )
        fixed: dict[str, np.ndarray] = {}
        stage_counts = {}
        for i, key in enumerate(stage.keys):
            stream, offset, n = streams[key], stage.offsets[key], int(counts[i])
            stage_counts[key] = n
            taken = take_positions(stream, offset, n, skips.get(key, ()))
            crosses = n and offset + n > stream.segment_end(stream.segment_of(offset))
            if taken is None and not crosses:
                where_now[key] = offset + n
                continue
            if taken is None:
                taken = np.arange(offset, offset + n, dtype=np.int64)
            else:
                fixed[key] = taken
            rows = np.flatnonzero(di == ids[i])
            segments, inside = stream.locate(taken)
            lookup = np.asarray(
                [part(key, int(s)) for s in range(int(segments.min()), int(segments.max()) + 1)]
            )
            di[rows] = lookup[segments - segments.min()]
            dsi[rows] = inside
            where_now[key] = int(taken[-1]) + 1
        skip_to = max(base - stage.start, 0)
        before = {}
        if skip_to:
            head = di[:skip_to]
            for i, key in enumerate(stage.keys):
                own = [part_id[p] for p in part_id if p[0] == key]
                before[key] = int(np.isin(head, own).sum()) if len(own) > 1 else int((head == ids[i]).sum())
        if skip_to < length:
            chunks_di.append(di[skip_to:])
            chunks_dsi.append(dsi[skip_to:])
        filled.append(stage)
        befores.append(before)
        fixed_all.append(fixed)
        counts_all.append(stage_counts)
    if len(chunks_di) == 1:
        dataset_index, dataset_sample_index = chunks_di[0], chunks_dsi[0]
    else:
        dataset_index = np.concatenate(chunks_di) if chunks_di else np.empty(0, np.int16)
        dataset_sample_index = np.concatenate(chunks_dsi) if chunks_dsi else np.empty(0, np.int64)
    return Built(parts, dataset_index, dataset_sample_index, base, filled, befores, fixed_all, counts_all)
