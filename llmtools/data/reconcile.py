"""Joining what the config asks for with a checkpoint's data ledger when a run (re)starts.

What the config asks for is a :class:`TrainStreams` (a static or staged ``mix.json``, or prefixes with
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

from dataclasses import replace

from llmtools.data.dataset import BlendedGPTDataset, _part
from llmtools.data.ledger import Ledger, SourceRecord
from llmtools.data.run_data import Report, RunData
from llmtools.data.stages import Built, Skip, Stage
from llmtools.data.stages import build as build_stages
from llmtools.data.streams import MAX_EPOCHS, SourceStream, StreamSpec, display_name
from llmtools.data.train_streams import TrainStreams
from llmtools.errors import InputError


def _check_compatible(saved: Ledger, plan: TrainStreams, where: str) -> None:
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


def _stream(spec: StreamSpec, plan: TrainStreams) -> SourceStream:
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
    plan: TrainStreams,
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


def _check_sources(saved: Ledger, plan: TrainStreams, where: str) -> None:
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


def _plan_sources(plan: TrainStreams) -> dict[str, SourceRecord]:
    return {key: SourceRecord(plan.specs[key]) for key in plan.keys()}


def _fresh(plan: TrainStreams, consumed: int, quarantine: list[dict], where: str) -> tuple[RunData, Report]:
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


def _planned(plan: TrainStreams) -> Built:
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


def _dataset(built: Built, streams: dict[str, SourceStream], plan: TrainStreams):
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


def _uses_plan_arrays(plan: TrainStreams, sources: dict[str, SourceRecord], base: int) -> bool:
    """Whether the plan's own arrays are the run's: applied at 0, its streams, nothing quarantined."""
    if base != 0:
        return False
    for key in plan.keys():
        rec = sources[key]
        if rec.skips or not rec.spec.same_stream(plan.specs[key]):
            return False
    return True


def _same(
    plan: TrainStreams, saved: Ledger, consumed: int, quarantine: list[dict], where: str
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
    plan: TrainStreams, saved: Ledger, consumed: int, quarantine: list[dict], where: str
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


def _same_blend(current: Stage | None, plan: TrainStreams) -> bool:
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


def _reset(plan: TrainStreams, saved: Ledger, quarantine: list[dict], where: str) -> tuple[RunData, Report]:
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
