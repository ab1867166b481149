"""The data ledger of a run: what it drew from each source, and where each source continues.

A run's data position is one cursor per source (:mod:`llmtools.data.streams`): the next position of
its stream. Every checkpoint keeps the ledger (``meta.json[data][ledger]``, ``schemas/
checkpoint-meta.schema.json``): the run's id, each source's stream and cursor with the samples drawn,
passed over (quarantine) and repeated, and the stages blended so far (:mod:`llmtools.data.stages`).

What the config asks for is a :class:`DataPlan` (a static or staged ``mix.json``, or prefixes with
weights planned in code). :func:`open_run_data` joins the two when a run (re)starts and returns the
:class:`RunData` the trainer reads, with a report of what happened:

- **fresh** (no checkpoint): the plan from position 0; a static plan reads Megatron's arrays as they are;
- **the same plan**: its stage in effect continues exactly where it was (same greedy, same offsets);
- **another plan** (new weights, new or removed sources, a new schedule): its stages start at the
  resumed position; every source the run already drew from continues its own stream at its cursor,
  a new source starts at 0, a source the plan no longer names stops. The checks are strict: the same
  tokenizer and sequence length, and a continued source must read the same sequences (split);
- ``--reset-data``: the plan from its first sample, the run's totals kept (re-read samples count as
  repeated).

Quarantine (``RUN/quarantine.jsonl``, :mod:`llmtools.formats.quarantine`): every document a record
names is passed over by its source from the resumed position on; each passed-over sample is replaced by
the source's next one, so the blend is unchanged and the replacements are counted in the ledger.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

import numpy as np

from llmtools.data.dataset import BlendedGPTDataset, _part
from llmtools.data.gpt_index import GPTIndices
from llmtools.data.mix import plan_to_json
from llmtools.data.stages import Built, Skip, Stage
from llmtools.data.stages import build as build_stages
from llmtools.data.streams import MAX_EPOCHS, SourceStream, StreamSpec, display_name
from llmtools.errors import InputError
from llmtools.formats.mix import MixFile

FORMAT = "llmtools.data-ledger"
VERSION = 1
MAX_PASSED_OVER = 10_000  # per source: the ledger stays small however much a quarantine passes over


# -- what the config asks for ------------------------------------------------------------------------
@dataclass
class DataPlan:
    """A plan's train split as streams and stages (positions relative to where the plan starts)."""

    identity: str
    """The plan's hash (a mix.json's ``cache.hash``): the same identity is the same samples."""
    origin: str
    """Where it came from: the mix.json path, or the train config's prefixes."""
    seq_length: int
    tokenizer: dict | None
    vocab_size: int | None
    specs: dict[str, StreamSpec]
    readers: dict
    first: dict[str, GPTIndices]
    stages: list[Stage]
    dataset: object
    """The plan's own arrays from its position 0 (a BlendedGPTDataset): a fresh run reads them as is."""
    parts: list[tuple[str, int]]
    """(source key, stream segment) of each of ``dataset``'s parts."""
    staged: bool = False

    @property
    def size(self) -> int:
        return self.stages[-1].end

    @classmethod
    def from_mix(cls, mix: MixFile | str | os.PathLike) -> DataPlan:
        """The train split of a ``mix.json`` (read once, or already read; its cached arrays, rebuilt when
        missing)."""
        if not isinstance(mix, MixFile):
            mix = MixFile.read(mix)
        dataset = BlendedGPTDataset.from_mix(mix, split="train")
        return cls.from_json(mix.data, dataset, str(mix.path))

    @classmethod
    def from_mix_plan(cls, plan, origin: str) -> DataPlan:
        """The train split of an in-memory :class:`~llmtools.data.mix.MixPlan` (prefixes in a config)."""
        dataset = BlendedGPTDataset.from_plan(plan, "train", source=origin)
        return cls.from_json(plan_to_json(plan), dataset, origin)

    @classmethod
    def from_json(cls, mix: dict, dataset, origin: str) -> DataPlan:
        where = f"{origin}[splits.train]"
        try:
            return cls._from_json(mix, dataset, origin)
        except (KeyError, TypeError, ValueError, IndexError) as error:
            raise InputError(f"{where}: malformed ({type(error).__name__}: {error})") from None

    @classmethod
    def _from_json(cls, mix: dict, dataset, origin: str) -> DataPlan:
        seq = int(mix["seq_length"])
        seed = int(mix["seed"])
        sources = mix["sources"]
        keys = [str(s["idx_sha256"]) for s in sources]
        taken: set[str] = set()
        names = []
        for s in sources:
            name = s.get("name") if isinstance(s.get("name"), str) and s["name"] not in taken else None
            name = name or display_name(str(s["prefix"]), taken)
            taken.add(name)
            names.append(name)
        train = mix["splits"]["train"]
        parts, specs, readers, first = [], {}, {}, {}
        for p, comp in enumerate(train["components"]):
            i, segment = int(comp["source"]), int(comp.get("segment", 0))
            key = keys[i]
            parts.append((key, segment))
            part = dataset.parts[p]
            readers[key] = part.reader
            if segment:
                continue
            beg, end = (int(v) for v in comp["sequence_range"])
            built = comp.get("built_samples")
            specs[key] = StreamSpec(
                key,
                os.path.abspath(part.reader.prefix),
                names[i],
                (beg, end),
                seq,
                seed,
                None if built is None else int(built),
                int(comp["tokens_per_epoch"]),
            )
            first[key] = GPTIndices(
                part.document_index,
                part.sample_index,
                part.shuffle_index,
                int(comp["epochs"]),
                bool(comp["separate_final_epoch"]),
                int(comp["tokens_per_epoch"]),
            )
        identity = str(mix["cache"]["hash"])
        stages = []
        if mix.get("stages"):
            for k, st in enumerate(mix["stages"]):
                stage_keys = [keys[int(i)] for i in st["sources"]]
                stages.append(
                    Stage(
                        int(st["start"]),
                        int(st["end"]),
                        stage_keys,
                        [float(v) for v in st["blend_weights"]],
                        [float(v) for v in st["normalized_weights"]],
                        dict(zip(stage_keys, (int(v) for v in st["offsets"]), strict=True)),
                        {"plan": identity, "stage": k, "path": origin},
                    )
                )
        else:
            comps = train["components"]
            stage_keys = [keys[int(c["source"])] for c in comps]
            stages.append(
                Stage(
                    0,
                    int(train["num_samples"]),
                    stage_keys,
                    [float(v) for v in train["blend_weights"]],
                    [float(c["normalized_weight"]) for c in comps],
                    dict.fromkeys(stage_keys, 0),
                    {"plan": identity, "stage": 0, "path": origin},
                )
            )
        _check_schedule(stages, len(dataset), origin)
        return cls(
            identity,
            origin,
            seq,
            dataset.tokenizer,
            dataset.vocab_size,
            specs,
            readers,
            first,
            stages,
            dataset,
            parts,
            bool(mix.get("stages")),
        )

    def keys(self) -> list[str]:
        """The plan's sources in order of first appearance in its stages."""
        out: list[str] = []
        for stage in self.stages:
            out += [k for k in stage.keys if k not in out]
        return out


def _check_schedule(stages: list[Stage], samples: int, origin: str) -> None:
    """A schedule read from a file: stages from 0, back to back, ending where the plan's samples end."""
    before = 0
    for k, stage in enumerate(stages):
        at = f"{origin}[stages[{k}]]"
        if stage.start < before:
            raise InputError(
                f"{at}: starts at sample {stage.start}, inside stage {k - 1} (until sample {before}): "
                "the stage ranges overlap"
            )
        if stage.start > before:
            what = f"stage {k - 1} ends at sample {before}" if k else "the schedule starts at sample 0"
            raise InputError(f"{at}: starts at sample {stage.start} but {what}: a gap in the stage ranges")
        if stage.end <= stage.start:
            raise InputError(f"{at}: ends at sample {stage.end}, not after its start {stage.start}")
        before = stage.end
    if before != samples:
        raise InputError(
            f"{origin}[stages]: the schedule covers samples [0, {before}), the plan holds {samples}"
        )


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


# -- the data a run reads ---------------------------------------------------------------------------
MAX_SOURCES_LOGGED = 100
"""More sources than this: metrics.jsonl gets the tokens per folder, not per source."""


def folder_names(prefixes: dict[str, str]) -> dict[str, str]:
    """A short name per source's folder: its last component (``web/``), or the whole folder where two
    folders share a last component."""
    folders = {key: os.path.dirname(os.path.normpath(prefix)) for key, prefix in prefixes.items()}
    short = {folder: (os.path.basename(folder) or folder or ".") + "/" for folder in set(folders.values())}
    seen: dict[str, int] = {}
    for name in short.values():
        seen[name] = seen.get(name, 0) + 1
    clash = {name for name, n in seen.items() if n > 1}
    return {key: short[f] if short[f] not in clash else (f or ".") + "/" for key, f in folders.items()}


@dataclass
class Report:
    """What :func:`open_run_data` decided, for stderr and a metrics event."""

    kind: str  # fresh | same | continued | reset
    lines: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)  # name -> continues | starts | stops
    quarantine: dict[str, int] = field(default_factory=dict)  # name -> documents newly quarantined


class RunData:
    """The train data of a run from its resumed position on, with the ledger (see the module docstring).

    The trainer reads it by global sample position (``batch(indices)``, as the sampler hands them out);
    ``len()`` is the position where its data ends.
    """

    def __init__(
        self,
        plan: DataPlan,
        streams: dict[str, SourceStream],
        built: Built,
        dataset,
        sources: dict[str, SourceRecord],
        history: list[Stage],
        resumed_at: int,
        plan_base: int,
        run: str | None,
        resets: list[dict],
    ) -> None:
        self.plan = plan
        self.streams = streams
        self.built = built
        self.dataset = dataset
        self.sources = sources
        self.history = history
        self.resumed_at = resumed_at
        self.plan_base = plan_base
        self.run = run
        self.resets = resets
        self.seq_length = plan.seq_length
        self.tokenizer = plan.tokenizer
        self.vocab_size = plan.vocab_size
        self.fingerprint = f"{plan.identity}-train"
        """The plan the run now reads (a checkpoint's config records it: ``data.plan``)."""
        self.base = built.base
        order = list(sources)
        self._index = {key: i for i, key in enumerate(order)}
        self._part_source = np.asarray([self._index[key] for key, _ in built.parts] or [0], dtype=np.int64)
        self._counted = (resumed_at, np.zeros(len(order), dtype=np.int64))
        self._folders: dict[str, str] | None = None  # folder name per source (metrics of many sources)

    # -- reading -------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.built.end

    def batch(self, indices) -> np.ndarray:
        """Samples at global positions ``indices`` (>= the resumed position)."""
        return self.dataset.batch(np.asarray(indices, dtype=np.int64) - self.base)

    def check_ids(self, batch: np.ndarray, indices) -> None:
        """Refuse token ids outside the tokenizer's vocabulary (see BlendedGPTDataset.check_ids)."""
        self.dataset.check_ids(batch, np.asarray(indices, dtype=np.int64) - self.base)

    def _local(self, lo: int, hi: int) -> np.ndarray:
        return self.built.dataset_index[max(lo - self.base, 0) : max(hi - self.base, 0)]

    def _by_source(self, lo: int, hi: int) -> np.ndarray:
        return np.bincount(self._part_source[self._local(lo, hi)], minlength=len(self._index))

    # -- the ledger ----------------------------------------------------------------------------------
    def drawn_since_resume(self, position: int) -> np.ndarray:
        """Samples drawn from each source between the resumed position and ``position`` (incremental)."""
        at, counts = self._counted
        if position < at:
            at, counts = self.resumed_at, np.zeros_like(counts)
        counts = counts + self._by_source(at, position)
        self._counted = (position, counts)
        return counts

    def consumed_tokens(self, position: int) -> dict[str, int]:
        """Tokens each source gave the run up to ``position`` (for metrics.jsonl); over
        :data:`MAX_SOURCES_LOGGED` sources, summed per folder (``web/``), so a blend of thousands of shards
        does not write thousands of numbers per log step (the checkpoint's ledger keeps each source)."""
        since = self.drawn_since_resume(position)
        tokens = {
            key: (rec.drawn + int(since[self._index[key]])) * self.seq_length
            for key, rec in self.sources.items()
        }
        if len(tokens) <= MAX_SOURCES_LOGGED:
            return {self.sources[key].spec.name: n for key, n in tokens.items()}
        if self._folders is None:
            self._folders = folder_names({key: rec.spec.prefix for key, rec in self.sources.items()})
        out: dict[str, int] = {}
        for key, n in tokens.items():
            out[self._folders[key]] = out.get(self._folders[key], 0) + n
        return out

    def _stage_draws(self, position: int) -> list[tuple[int, dict[str, int]]]:
        """Per live stage begun before ``position``: the draws of each of its sources up to ``position``."""
        out = []
        for k, stage in enumerate(self.built.stages):
            if stage.start >= position:
                break
            counts = self._by_source(max(stage.start, self.base), min(stage.end, position))
            before = self.built.before[k]
            out.append((k, {key: before.get(key, 0) + int(counts[self._index[key]]) for key in stage.keys}))
        return out

    def positions(self, position: int) -> dict[str, int]:
        """Each source's cursor at ``position``."""
        out = {key: rec.position for key, rec in self.sources.items()}
        for k, draws in self._stage_draws(position):
            for key, drawn in draws.items():
                out[key] = self.built.position_after(k, key, drawn)
        return out

    def _passed_over(self, position: int) -> dict[str, list[int]]:
        """Per source: the stream positions passed over (quarantine) since the resume, up to ``position``."""
        out: dict[str, list[int]] = {}
        for k, draws in self._stage_draws(position):
            stage = self.built.stages[k]
            for key, drawn in draws.items():
                taken = self.built.draws[k].get(key)
                if taken is None or drawn == 0:
                    continue
                taken = taken[:drawn]
                gaps = np.setdiff1d(np.arange(stage.offsets[key], int(taken[-1]) + 1), taken)
                since = self.sources[key].position
                out.setdefault(key, []).extend(g for g in gaps.tolist() if g >= since)
        return out

    def stage_at(self, position: int) -> Stage | None:
        for stage in reversed(self.built.stages):
            if stage.start <= position < stage.end:
                return stage
        return None

    def state(self, position: int, step: int | None = None) -> dict:
        """The ledger at ``position`` (kept in the checkpoint saved there)."""
        since = self.drawn_since_resume(position)
        now = self.positions(position)
        passed = self._passed_over(position)
        sources = []
        for key, rec in self.sources.items():
            moved = now[key] - rec.position
            drawn = int(since[self._index[key]])
            repeated = max(0, min(now[key], rec.high_water) - min(rec.position, rec.high_water))
            current = replace(
                rec,
                drawn=rec.drawn + drawn,
                position=now[key],
                skipped=rec.skipped + max(moved - drawn, 0),
                repeated=rec.repeated + repeated,
                passed_over=(rec.passed_over + passed.get(key, []))[:MAX_PASSED_OVER],
            )
            sources.append(current.to_json(self.seq_length))
        stages = [s.to_json() for s in self.history]
        for stage in self.built.stages:
            if stage.start < position:
                stages.append(stage.to_json())
        current = self.stage_at(position) or self.stage_at(position - 1)
        return {
            "format": FORMAT,
            "version": VERSION,
            "run": self.run,
            "position": position,
            "step": step,
            "seq_length": self.seq_length,
            "tokenizer_hash": (self.tokenizer or {}).get("hash"),
            "plan": {"identity": self.plan.identity, "path": self.plan.origin, "base": self.plan_base},
            "stage": None if current is None else current.origin,
            "sources": sources,
            "stages": stages,
            "resets": self.resets,
        }

    def describe(self, positions) -> list[dict]:
        """What the samples at global ``positions`` are: source, stream position, GPT sample, documents."""
        out = []
        for position in np.asarray(positions, dtype=np.int64).tolist():
            local = position - self.base
            key, segment = self.built.parts[int(self.built.dataset_index[local])]
            within = int(self.built.dataset_sample_index[local])
            stream = self.streams[key]
            stream_position = stream.start(segment) + within
            out.append(
                {
                    "position": position,
                    "source": stream.spec.name,
                    "key": key,
                    "prefix": stream.spec.prefix,
                    "stream_position": stream_position,
                    "segment": segment,
                    "sample": int(stream.segment(segment).shuffle_index[within]),
                    "documents": stream.documents(stream_position),
                }
            )
        return out


# -- (re)starting a run's data ------------------------------------------------------------------------
def _check_compatible(saved: Ledger, plan: DataPlan, where: str) -> None:
    if saved.seq_length != plan.seq_length:
        raise InputError(
            f"{where}: seq_length: the checkpoint's data has {saved.seq_length} tokens per sample, "
            f"{plan.origin} has {plan.seq_length}; a run keeps one sequence length"
        )
    now = (plan.tokenizer or {}).get("hash")
    if saved.tokenizer_hash and now and saved.tokenizer_hash != now:
        raise InputError(
            f"{where}: tokenizer: the checkpoint's data was tokenized with {saved.tokenizer_hash}, "
            f"{plan.origin} with {now} (tokenized differently)"
        )


def _stream(spec: StreamSpec, plan: DataPlan) -> SourceStream:
    """A stream over the plan's reader; the plan's own segment 0 is reused when it is the same stream."""
    key = spec.key
    plan_spec = plan.specs.get(key)
    first = plan.first.get(key) if plan_spec is not None and plan_spec.same_stream(spec) else None
    return SourceStream.open(spec, plan.readers.get(key), first)


def _quarantine_skips(
    records: list[dict], sources: dict[str, SourceRecord], at: dict[str, int], where: str
) -> dict[str, int]:
    """Add every quarantined document not yet skipped as a new skip from the source's cursor ``at``.
    Returns newly quarantined documents per source name."""
    wanted: dict[str, set[int]] = {}
    offending: dict[str, set[tuple[int, int]]] = {}
    for r, record in enumerate(records):
        for sample in record["samples"]:
            key = sample["key"]
            if key not in sources:
                raise InputError(
                    f"{where}: record {r + 1} names source {sample['source']} ({key[:12]}…), which this run "
                    "never drew from: a quarantine file of another run"
                )
            wanted.setdefault(key, set()).update(d["document"] for d in sample["documents"])
            offending.setdefault(key, set()).add((int(sample["segment"]), int(sample["sample"])))
    added = {}
    for key, documents in wanted.items():
        rec = sources[key]
        new = sorted(documents - rec.quarantined_documents)
        rec.quarantined = len(offending[key])
        if new:
            rec.skips.append(Skip(at.get(key, rec.position), tuple(new)))
            added[rec.spec.name] = len(new)
    return added


def open_run_data(
    plan: DataPlan,
    saved: Ledger | None,
    consumed: int,
    *,
    reset: bool = False,
    quarantine: list[dict] | None = None,
    where: str = "the checkpoint",
) -> tuple[RunData, Report]:
    """The data a run reads from ``consumed`` on (see the module docstring), and what was decided.

    ``saved`` is the checkpoint's ledger (None: a fresh run, or a checkpoint saved before ledgers were
    kept: then the plan must be the checkpoint's own, which the caller checks). ``quarantine`` holds the
    run's quarantine records (already checked to belong to the run). InputError for a plan that cannot
    continue the checkpoint's data.
    """
    quarantine = quarantine or []
    if saved is not None:
        _check_compatible(saved, plan, where)
        if not reset and saved.position != consumed:
            raise InputError(
                f"{where}.position: the ledger is at sample {saved.position}, the checkpoint at {consumed}: "
                "not this checkpoint's ledger"
            )
        _check_sources(saved, plan, where)
    if saved is None:
        return _fresh(plan, consumed, quarantine, where)
    if reset:
        return _reset(plan, saved, quarantine, where)
    if saved.plan["identity"] == plan.identity:
        return _same(plan, saved, consumed, quarantine, where)
    return _continued(plan, saved, consumed, quarantine, where)


def _check_sources(saved: Ledger, plan: DataPlan, where: str) -> None:
    """The ledger against the sources on disk: a quarantined document the source does not have, or a
    cursor further in than any run reads, is refused."""
    for i, (key, rec) in enumerate(saved.sources.items()):
        at = f"{where}.sources[{i}]"
        stream_end = MAX_EPOCHS * max(1, (rec.spec.tokens_per_epoch - 1) // rec.spec.seq_length)
        if rec.position > stream_end:
            raise InputError(
                f"{at}.position: {rec.position} is more than {MAX_EPOCHS} epochs into the source"
            )
        reader = plan.readers.get(key)
        if reader is None:
            continue
        documents = reader.document_indices.shape[0] - 1
        for j, skip in enumerate(rec.skips):
            beyond = [d for d in skip.documents if d >= documents]
            if beyond:
                raise InputError(
                    f"{at}.skips[{j}].documents: document {beyond[0]} does not exist in {rec.spec.prefix} "
                    f"({documents} documents)"
                )


def _plan_sources(plan: DataPlan) -> dict[str, SourceRecord]:
    return {key: SourceRecord(plan.specs[key]) for key in plan.keys()}


def _fresh(plan: DataPlan, consumed: int, quarantine: list[dict], where: str) -> tuple[RunData, Report]:
    """No ledger: the plan from position 0 (a checkpoint without a ledger resumes at ``consumed``)."""
    if quarantine:
        raise InputError(
            f"{where}: the run has no data ledger yet, but its quarantine file has {len(quarantine)} records: "
            "a quarantine file of another run"
        )
    sources = _plan_sources(plan)
    streams = {key: SourceStream.open(plan.specs[key], plan.readers[key], plan.first[key]) for key in sources}
    built = _planned(plan)
    data = RunData(plan, streams, built, plan.dataset, sources, [], 0, 0, None, [])
    if consumed:  # a checkpoint from before ledgers: count what its position drew
        counts = data.drawn_since_resume(consumed)
        now = data.positions(consumed)
        for key, rec in sources.items():
            rec.drawn, rec.position = int(counts[data._index[key]]), now[key]
        data = RunData(plan, streams, built, plan.dataset, sources, [], consumed, 0, None, [])
    return data, Report("fresh" if not consumed else "same", [f"data: {plan.origin}"])


def _planned(plan: DataPlan) -> Built:
    """The plan's own arrays (from position 0) as a Built."""
    stages = list(plan.stages)
    return Built(
        plan.parts,
        plan.dataset.dataset_index,
        plan.dataset.dataset_sample_index,
        0,
        stages,
        [{} for _ in stages],
        [{} for _ in stages],
        [{} for _ in stages],
    )


def _dataset(built: Built, streams: dict[str, SourceStream], plan: DataPlan):
    parts = []
    for key, segment in built.parts:
        stream = streams[key]
        seg = stream.segment(segment)
        parts.append(_part(stream.reader, seg.document_index, seg.sample_index, seg.shuffle_index))
    return BlendedGPTDataset(
        parts,
        built.dataset_index,
        built.dataset_sample_index,
        plan.seq_length,
        tokenizer=plan.tokenizer,
        vocab_size=plan.vocab_size,
        fingerprint=plan.identity,
        source=plan.origin,
    )


def _uses_plan_arrays(plan: DataPlan, sources: dict[str, SourceRecord], base: int) -> bool:
    """Whether the plan's own arrays are the run's: applied at 0, its streams, nothing quarantined."""
    if base != 0:
        return False
    for key in plan.keys():
        rec = sources[key]
        if rec.skips or not rec.spec.same_stream(plan.specs[key]):
            return False
    return True


def _same(
    plan: DataPlan, saved: Ledger, consumed: int, quarantine: list[dict], where: str
) -> tuple[RunData, Report]:
    """The checkpoint's own plan: its stage in effect continues exactly."""
    sources = {key: replace(rec, skips=list(rec.skips)) for key, rec in saved.sources.items()}
    for key in plan.keys():
        if key not in sources:
            raise InputError(
                f"{where}: source {plan.specs[key].name} of plan {plan.identity} is not in its ledger"
            )
    added = _quarantine_skips(quarantine, sources, {}, where)
    base_p = int(saved.plan["base"])
    # the recorded stage in effect at `consumed`, and the plan's later stages
    history = [s for s in saved.stages if s.start < consumed]
    live: list[Stage] = []
    current = history[-1] if history else None
    if current is not None and current.end > consumed:
        history = history[:-1]
        live.append(current)
    done = int(current.origin.get("stage", -1)) if current is not None else -1
    for stage in plan.stages[done + 1 :]:
        live.append(replace(stage, start=stage.start + base_p, end=stage.end + base_p, offsets=None))
    streams = {key: _stream(sources[key].spec, plan) for key in {k for s in live for k in s.keys}}
    if not added and _uses_plan_arrays(plan, sources, base_p) and not any(s.skips for s in sources.values()):
        # applied at 0 and nothing quarantined: the plan's own arrays, all of its stages live
        built, dataset, history = _planned(plan), plan.dataset, []
        streams = {key: _stream(sources[key].spec, plan) for key in plan.keys()}
    else:
        at = {key: rec.position for key, rec in sources.items()}
        built = build_stages(streams, live, consumed, _skips(sources), positions=at)
        dataset = _dataset(built, streams, plan)
    data = RunData(plan, streams, built, dataset, sources, history, consumed, base_p, saved.run, saved.resets)
    report = Report("same", [f"data: {plan.origin} continues at sample {consumed}"], quarantine=added)
    _describe_quarantine(report, added)
    return data, report


def _skips(sources: dict[str, SourceRecord]) -> dict[str, list[Skip]]:
    return {key: rec.skips for key, rec in sources.items() if rec.skips}


def _continued(
    plan: DataPlan, saved: Ledger, consumed: int, quarantine: list[dict], where: str
) -> tuple[RunData, Report]:
    """Another plan: its stages start at ``consumed``; each source continues its own stream."""
    sources = {key: replace(rec, skips=list(rec.skips)) for key, rec in saved.sources.items()}
    taken = {rec.spec.name for rec in sources.values()}
    for key in plan.keys():
        spec = plan.specs[key]
        if key in sources:
            old = sources[key].spec
            if old.sequence_range != spec.sequence_range:
                raise InputError(
                    f"{where}: source {old.name}: the checkpoint's stream reads its sequences "
                    f"{old.sequence_range[0]}..{old.sequence_range[1]}, {plan.origin} reads "
                    f"{spec.sequence_range[0]}..{spec.sequence_range[1]} (another --split); keep the split"
                )
            continue
        name = spec.name if spec.name not in taken else display_name(spec.prefix, taken)
        taken.add(name)
        sources[key] = SourceRecord(replace(spec, name=name))
    added = _quarantine_skips(quarantine, sources, {}, where)
    history = [s for s in saved.stages if s.start < consumed]
    current = history[-1] if history else None
    extended = _same_blend(current, plan)
    if extended:
        # The same blend, planned again (e.g. for a longer run): its stage goes on for the new plan's
        # samples from here, its sources on their own streams (no restart of the greedy, nothing replayed).
        history = history[:-1]
        stage = plan.stages[0]
        origin = {**stage.origin, "applied_at": consumed, "continues": current.origin}
        live = [replace(current, end=consumed + stage.end, origin=origin)]
    else:
        if current is not None and current.end > consumed:
            history[-1] = replace(current, end=consumed)
        live = [replace(s, start=s.start + consumed, end=s.end + consumed, offsets=None) for s in plan.stages]
        for stage in live:
            stage.origin = {**stage.origin, "applied_at": consumed}
    if live[-1].end <= consumed:
        raise InputError(
            f"{where}: {plan.origin} ends at sample {live[-1].end}, before the resumed position {consumed}"
        )
    streams = {key: _stream(sources[key].spec, plan) for key in plan.keys()}
    at = {key: rec.position for key, rec in sources.items()}
    built = build_stages(streams, live, consumed, _skips(sources), positions=at)
    dataset = _dataset(built, streams, plan)
    data = RunData(
        plan, streams, built, dataset, sources, history, consumed, consumed, saved.run, saved.resets
    )
    if extended:
        report = Report(
            "extended",
            [f"data: {plan.origin}: the same blend as before goes on, {len(data) - consumed} more samples"],
            quarantine=added,
        )
        _describe_quarantine(report, added)
        return data, report
    report = Report(
        "continued", [f"data: the mix changed at sample {consumed}: now {plan.origin}"], quarantine=added
    )
    first = live[0]
    weights = dict(zip(first.keys, first.weights, strict=True))
    per_source: list[str] = []
    for key, rec in sources.items():
        name = rec.spec.name
        epochs = rec.position * plan.seq_length / rec.spec.tokens_per_epoch
        if key in plan.specs and key in saved.sources:
            report.sources[name] = "continues"
            share = f"weight {weights[key]:.4g}" if key in weights else "in a later stage"
            per_source.append(
                f"data: {name}: continues at sample {rec.position} of its stream ({rec.drawn} drawn, "
                f"{epochs:.2f} epochs; {share})"
            )
        elif key in plan.specs:
            report.sources[name] = "starts"
            share = f"weight {weights[key]:.4g}" if key in weights else "in a later stage"
            per_source.append(f"data: {name}: new, starts at sample 0 ({share})")
        elif _in_effect(saved, key, consumed):
            report.sources[name] = "stops"
            per_source.append(
                f"data: {name}: stops at sample {rec.position} of its stream ({rec.drawn} drawn, "
                f"{epochs:.2f} epochs): not in {plan.origin}"
            )
    _fold_sources(report, per_source, plan.origin)
    _describe_quarantine(report, added)
    return data, report


MAX_SOURCE_LINES = 20
"""More sources than this in a continuation report: one line per fate (llm-ckpt inspect --data has each)."""


def _fold_sources(report: Report, lines: list[str], origin: str) -> None:
    if len(lines) <= MAX_SOURCE_LINES:
        report.lines += lines
        return
    said = {
        "continues": "continue, each at its cursor",
        "starts": "are new and start at sample 0",
        "stops": f"stop: not in {origin}",
    }
    for fate in ("continues", "starts", "stops"):
        names = [name for name, f in report.sources.items() if f == fate]
        if names:
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            report.lines.append(f"data: {len(names)} sources {said[fate]} ({shown})")
    report.lines.append("data: llm-ckpt inspect --data RUN lists every source's samples, tokens and cursor")


def _same_blend(current: Stage | None, plan: DataPlan) -> bool:
    """Whether a one-stage plan blends exactly what the stage in effect blends (same sources in the same
    order, same weights, on the same streams)."""
    if current is None or len(plan.stages) != 1:
        return False
    stage = plan.stages[0]
    return stage.keys == current.keys and stage.blend_weights == current.blend_weights


def _in_effect(saved: Ledger, key: str, consumed: int) -> bool:
    """Whether the source was still being drawn from when the checkpoint was saved."""
    live = [s for s in saved.stages if s.start < consumed]
    return bool(live) and key in live[-1].keys


def _reset(plan: DataPlan, saved: Ledger, quarantine: list[dict], where: str) -> tuple[RunData, Report]:
    """--reset-data: the plan from its first sample; the run's totals kept (re-reads count as repeated)."""
    sources: dict[str, SourceRecord] = {}
    for key, old in saved.sources.items():
        spec = plan.specs.get(key, old.spec)
        high = max(old.high_water, old.position) if old.spec.same_stream(spec) else 0
        # the quarantine keeps every document it named, from the restarted stream's first sample
        docs = tuple(sorted(old.quarantined_documents))
        skips = [Skip(0, docs)] if docs else []
        sources[key] = replace(
            old, spec=replace(spec, name=old.spec.name), position=0, high_water=high, skips=skips
        )
    for key in plan.keys():
        if key not in sources:
            sources[key] = SourceRecord(plan.specs[key])
    added = _quarantine_skips(quarantine, sources, dict.fromkeys(sources, 0), where)
    streams = {key: _stream(sources[key].spec, plan) for key in plan.keys()}
    if _uses_plan_arrays(plan, sources, 0):
        built, dataset = _planned(plan), plan.dataset
    else:
        live = [replace(s, offsets=None) for s in plan.stages]
        built = build_stages(streams, live, 0, _skips(sources), positions={})
        dataset = _dataset(built, streams, plan)
    resets = [*saved.resets, {"position": saved.position, "plan": saved.plan}]
    data = RunData(plan, streams, built, dataset, sources, [], 0, 0, saved.run, resets)
    report = Report("reset", [f"data: --reset-data: {plan.origin} from its first sample"], quarantine=added)
    _describe_quarantine(report, added)
    return data, report


def _describe_quarantine(report: Report, added: dict[str, int]) -> None:
    for name, n in added.items():
        report.lines.append(f"data: {name}: {n} quarantined document(s) are passed over from here on")


# -- llm-ckpt inspect --data -----------------------------------------------------------------------
def ledger_report(meta: dict, path: str, records: list[dict]) -> dict:
    """The data ledger of the checkpoint ``path`` (its meta.json ``meta``) as a report: per source the
    samples and tokens consumed, share, epochs, cursor, passed-over, quarantined and repeated samples and
    its state now; the stages; the resets. ``records`` are the run's quarantine records (they count the
    samples named by a stop the checkpoint was saved at, before a resume applies them)."""
    where = f"{path}/meta.json[data.ledger]"
    raw = (meta.get("data") or {}).get("ledger") if isinstance(meta.get("data"), dict) else None
    if raw is None:
        raise InputError(
            f"{where}: missing: the checkpoint keeps no data ledger (saved by an older llmtools)"
        )
    ledger = Ledger.from_json(raw, where)
    step = meta.get("step") if isinstance(meta.get("step"), int) else raw.get("step")
    position = ledger.position
    batch = position // step if isinstance(step, int) and step > 0 and position % step == 0 else None
    current = ledger.stages[-1] if ledger.stages else None
    # the stage of the last sample drawn: its sources are still drawn from, the others stopped
    live = set(current.keys) if current is not None and current.start < position <= current.end else set()
    weights = dict(zip(current.keys, current.weights, strict=True)) if live else {}
    quarantined: dict[str, set] = {}
    for record in records:
        for sample in record["samples"]:
            quarantined.setdefault(sample["key"], set()).add((sample["segment"], sample["sample"]))
    total = sum(rec.drawn for rec in ledger.sources.values()) or 1
    sources = []
    for key, rec in ledger.sources.items():
        epochs = rec.position * ledger.seq_length / rec.spec.tokens_per_epoch
        named = len(quarantined.get(key, ())) or rec.quarantined
        sources.append(
            {
                "name": rec.spec.name,
                "key": key,
                "prefix": rec.spec.prefix,
                "samples": rec.drawn,
                "tokens": rec.drawn * ledger.seq_length,
                "share": rec.drawn / total,
                "epochs": round(epochs, 6),
                "position": rec.position,
                "skipped": rec.skipped,
                "quarantined": named,
                "quarantined_documents": sorted(rec.quarantined_documents),
                "repeated": rec.repeated,
                "passed_over": rec.passed_over,
                "state": f"weight {weights[key]:.4g}" if key in weights else "stopped",
            }
        )
    stages = []
    for k, stage in enumerate(ledger.stages):
        end = min(stage.end, position) if k == len(ledger.stages) - 1 else stage.end
        names = {key: ledger.sources[key].spec.name for key in stage.keys}
        stages.append(
            {
                "index": k,
                "start": stage.start,
                "end": stage.end,
                "done": end,
                "steps": [stage.start // batch + 1, -(-end // batch)] if batch else None,
                "plan": stage.origin.get("plan"),
                "path": stage.origin.get("path"),
                "plan_stage": stage.origin.get("stage"),
                "weights": {names[key]: w for key, w in zip(stage.keys, stage.weights, strict=True)},
            }
        )
    return {
        "checkpoint": str(path),
        "run": ledger.run,
        "step": step,
        "position": position,
        "tokens": position * ledger.seq_length,
        "seq_length": ledger.seq_length,
        "plan": ledger.plan,
        "sources": sources,
        "stages": stages,
        "resets": ledger.resets,
        "quarantine_records": len(records),
    }


def format_ledger(report: dict) -> str:
    """The report of :func:`ledger_report` as a table."""
    lines = [
        f"run        {report['run']}",
        f"checkpoint {report['checkpoint']} (step {report['step']}, {report['position']:,} samples, "
        f"{report['tokens']:,} tokens of {report['seq_length']} per sample)",
        f"plan       {report['plan'].get('path')} (plan {report['plan'].get('identity')}, taken up at sample "
        f"{report['plan'].get('base')})",
    ]
    header = (
        "source",
        "samples",
        "tokens",
        "share",
        "epochs",
        "position",
        "skipped",
        "quarantined",
        "repeated",
        "now",
    )
    rows = [header]
    for s in report["sources"]:
        rows.append(
            (
                s["name"],
                f"{s['samples']:,}",
                f"{s['tokens']:,}",
                f"{s['share']:.4f}",
                f"{s['epochs']:.2f}",
                f"{s['position']:,}",
                str(s["skipped"]),
                str(s["quarantined"]),
                str(s["repeated"]),
                s["state"],
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        cells = [
            c.ljust(w) if i in (0, 9) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    lines.append("stages")
    for st in report["stages"]:
        steps = f" steps {st['steps'][0]}-{st['steps'][1]}" if st["steps"] else ""
        mix = ", ".join(f"{name} {w:.3f}" for name, w in st["weights"].items())
        until = "" if st["done"] == st["end"] else f" (planned to {st['end']:,})"
        lines.append(
            f"  {st['index']}  samples [{st['start']:,}, {st['done']:,}){until}{steps}  {st['path']} "
            f"stage {st['plan_stage']}: {mix}"
        )
    for reset in report["resets"]:
        lines.append(f"reset      --reset-data at sample {reset.get('position')} (the data restarted from 0)")
    if report["quarantine_records"]:
        lines.append(f"quarantine {report['quarantine_records']} record(s) in the run's quarantine.jsonl")
    return "\n".join(lines)
