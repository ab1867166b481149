"""The data ledger of a run: what it drew from each source, and where each source continues.

A run's data position is one cursor per source (:mod:`llmtools.data.streams`): the next position of
its stream. Every checkpoint keeps the ledger (``meta.json[data][ledger]``, ``schemas/
checkpoint-meta.schema.json``): the run's id, each source's stream and cursor with the samples drawn,
passed over (quarantine) and repeated, and the stages blended so far (:mod:`llmtools.data.stages`).

Here: the ledger as a checkpoint keeps it (:class:`Ledger`, one :class:`SourceRecord` per source), read
and checked. What the config asks for is :mod:`llmtools.data.train_streams`; the data a run reads,
:mod:`llmtools.data.run_data`; joining a plan and a ledger when a run (re)starts,
:mod:`llmtools.data.reconcile`; ``llm-ckpt inspect --data``, :mod:`llmtools.data.ledger_report`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmtools.data.stages import Skip, Stage
from llmtools.data.streams import StreamSpec
from llmtools.errors import InputError

FORMAT = "llmtools.data-ledger"
VERSION = 1
MAX_PASSED_OVER = 10_000  # per source: the ledger stays small however much a quarantine passes over


# -- the ledger's per-source record -------------------------------------------------------------------
@dataclass
class SourceRecord:
    """One source of the run, as the ledger keeps it (values as of the ledger's position)."""

    spec: StreamSpec
    drawn: int = 0
    """Samples the run trained on from this source (all stages, all plans, resets included)."""
    position: int = 0
    """Its cursor: the next stream position (drawn + skipped since the last reset)."""
    skipped: int = 0
    """Stream positions passed over because their sample read a quarantined document."""
    quarantined: int = 0
    """Samples of this source named in quarantine records (the offending ones)."""
    repeated: int = 0
    """Draws that re-read stream positions the run had read before a --reset-data."""
    high_water: int = 0
    """The furthest position read before the latest --reset-data (re-reading below it repeats)."""
    skips: list[Skip] = field(default_factory=list)
    passed_over: list[int] = field(default_factory=list)
    """The stream positions passed over (the replacement draws took the next ones), the first
    :data:`MAX_PASSED_OVER`."""

    @property
    def quarantined_documents(self) -> set[int]:
        return {d for s in self.skips for d in s.documents}

    def to_json(self, seq_length: int) -> dict:
        tpe = self.spec.tokens_per_epoch
        return {
            **self.spec.to_json(),
            "drawn": self.drawn,
            "tokens": self.drawn * seq_length,
            "position": self.position,
            "epochs": round(self.position * seq_length / tpe, 6),
            "skipped": self.skipped,
            "quarantined": self.quarantined,
            "repeated": self.repeated,
            "high_water": self.high_water,
            "skips": [s.to_json() for s in self.skips],
            "passed_over": list(self.passed_over),
        }

    @classmethod
    def from_json(cls, data, where: str) -> SourceRecord:
        spec = StreamSpec.from_json(data, where)
        values = {}
        for key in ("drawn", "position", "skipped", "quarantined", "repeated", "high_water"):
            value = data.get(key, 0)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InputError(f"{where}.{key}: expected an integer >= 0")
            values[key] = value
        skips = []
        for j, raw in enumerate(data.get("skips") or []):
            ok = (
                isinstance(raw, dict)
                and isinstance(raw.get("from"), int)
                and raw["from"] >= 0
                and isinstance(raw.get("documents"), list)
                and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in raw["documents"])
            )
            if not ok:
                raise InputError(f"{where}.skips[{j}]: expected {{from: position, documents: [ids]}}")
            skips.append(Skip(raw["from"], tuple(raw["documents"])))
        passed = data.get("passed_over") or []
        if not isinstance(passed, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in passed
        ):
            raise InputError(f"{where}.passed_over: expected a list of stream positions")
        record = cls(spec, skips=skips, passed_over=passed[:MAX_PASSED_OVER], **values)
        record.check(where)
        return record

    def check(self, where: str) -> None:
        """The record's numbers agree with each other (a cursor edited by hand does not)."""
        if self.position > self.drawn + self.skipped:
            raise InputError(
                f"{where}.position: {self.position} is past the {self.drawn} samples drawn and {self.skipped} "
                "passed over: a cursor no run reached"
            )
        if self.skipped and not self.skips:
            raise InputError(f"{where}.skipped: {self.skipped} samples passed over, but no quarantine skips")
        if len(self.passed_over) != min(self.skipped, MAX_PASSED_OVER):
            raise InputError(
                f"{where}.passed_over: {len(self.passed_over)} positions listed for {self.skipped} passed over"
            )
        for j, skip in enumerate(self.skips):
            if skip.start > self.position:
                raise InputError(f"{where}.skips[{j}].from: {skip.start} is past the cursor {self.position}")


@dataclass
class Ledger:
    """A ledger as read from a checkpoint (validated)."""

    run: str
    position: int
    seq_length: int
    tokenizer_hash: str | None
    plan: dict
    sources: dict[str, SourceRecord]
    stages: list[Stage]
    resets: list[dict]

    @classmethod
    def from_json(cls, data, where: str) -> Ledger:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise InputError(f"{where}: not a data ledger (format is not {FORMAT!r})")
        if data.get("version") != VERSION:
            raise InputError(f"{where}.version: unsupported {data.get('version')!r} (this is {VERSION})")
        run, position, seq = data.get("run"), data.get("position"), data.get("seq_length")
        if not isinstance(run, str) or not run:
            raise InputError(f"{where}.run: missing")
        for key, value in (("position", position), ("seq_length", seq)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InputError(f"{where}.{key}: expected an integer >= 0")
        plan = data.get("plan")
        if (
            not isinstance(plan, dict)
            or not isinstance(plan.get("identity"), str)
            or not isinstance(plan.get("base"), int)
        ):
            raise InputError(f"{where}.plan: expected {{identity, path, base}}")
        raw_sources = data.get("sources")
        if not isinstance(raw_sources, list):
            raise InputError(f"{where}.sources: expected a list")
        sources: dict[str, SourceRecord] = {}
        for i, raw in enumerate(raw_sources):
            record = SourceRecord.from_json(raw, f"{where}.sources[{i}]")
            if record.spec.key in sources:
                raise InputError(f"{where}.sources[{i}].key: the source {record.spec.name} is listed twice")
            sources[record.spec.key] = record
        raw_stages = data.get("stages")
        if not isinstance(raw_stages, list):
            raise InputError(f"{where}.stages: expected a list")
        stages = [Stage.from_json(raw, f"{where}.stages[{k}]") for k, raw in enumerate(raw_stages)]
        for k, stage in enumerate(stages):
            unknown = [key for key in stage.keys if key not in sources]
            if unknown:
                raise InputError(f"{where}.stages[{k}].keys: {unknown[0]} is not one of the ledger's sources")
            if k and stage.start != stages[k - 1].end and stage.start < stages[k - 1].end:
                raise InputError(f"{where}.stages[{k}].start: overlaps stage {k - 1}")
        tok = data.get("tokenizer_hash")
        resets = data.get("resets") or []
        if not isinstance(resets, list) or not all(
            isinstance(r, dict) and isinstance(r.get("position"), int) and r["position"] >= 0 for r in resets
        ):
            raise InputError(f"{where}.resets: expected a list of {{position, plan}}")
        # every sample the run trained on was drawn from one source: before and after each --reset-data
        total = position + sum(r["position"] for r in resets)
        for i, record in enumerate(sources.values()):
            if record.drawn > total:
                raise InputError(
                    f"{where}.sources[{i}].drawn: {record.drawn} samples drawn from {record.spec.name}, but "
                    f"the run trained on {total}"
                )
        return cls(run, position, seq, tok if isinstance(tok, str) else None, plan, sources, stages, resets)
