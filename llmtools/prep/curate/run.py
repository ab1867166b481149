"""The curation runner: an ordered list of steps over JSONL documents, kept documents out, removals recorded.

Pipeline (datatrove's shape: read -> steps -> write, each separable)::

    JsonlSource (json2bin's reader: files, globs, @lists, .gz/.zst, stdin) -> chunks of whole lines
    parse_chunk: the records, with file:line, bad lines judged as json2bin judges them
    each record's text through the steps in order, stopping at the first drop
    kept records -> the output (file or stdout); removed -> OUT.removed; counts -> OUT.stats.json

What a document becomes:

* nothing changed its text and no step added metadata: its line is written back byte for byte;
* else the record is written again (compact JSON, keys in their order, non-ASCII as it is), its text
  replaced, and the metadata the steps added (the language and its score, say) merged into its
  ``metadata`` object, created when absent. That is where datatrove's JSONL writer puts a document's
  metadata and where its reader takes it back, so our output reads into datatrove unchanged and the
  record's own top-level keys stay exactly as they were. A record whose ``metadata`` is not an object
  cannot take the added fields: a bad line (``metadata_not_an_object``).

A step sees ``Document(text, meta)``, ``meta`` being the record's other keys (``url``, ``id``, its
``metadata``...), as datatrove's reader gives them to its filters.

Memory is bounded: one chunk of input (about 1 MiB) is in flight. The same input and options give the
same bytes (no clock, no randomness, no set order anywhere in the output). With ``--shard I/N`` the
inputs are cut as json2bin cuts them (:mod:`llmtools.prep.shards`): the N kept files, concatenated in
shard order, are the bytes of one run over all the inputs sorted by path (the removed files likewise).

Plain API::

    from llmtools.prep.curate.run import CurationConfig, run_curation
    result = run_curation(CurationConfig(inputs=["raw.jsonl"], output="clean.jsonl"), steps, described)
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from llmtools.errors import InputError, UsageError
from llmtools.formats import jsonfile
from llmtools.formats.curation_stats import build_stats
from llmtools.prep.curate.outputs import CurationPaths, curation_paths
from llmtools.prep.curate.records import Record, open_source, record_batches
from llmtools.prep.curate.step import Document, Outcome, Step
from llmtools.prep.jsonl import expand_inputs
from llmtools.prep.shards import ShardSpec, plan_shards
from llmtools.progress import Progress

META_KEY = "metadata"


@dataclass
class CurationConfig:
    inputs: Sequence[str] = ()
    """JSONL files, globs, @lists, '-' for stdin, .gz/.zst."""
    output: str = "-"
    """The kept documents: a file, or '-' for stdout (-o)."""
    stats: str | None = None
    """The stats JSON (--stats); default OUT.stats.json, required when the output is stdout."""
    removed: str | None = None
    """The removed documents (--removed); default OUT.removed, or beside the stats."""
    text_key: str = "text"
    """The key holding the text (--text-key)."""
    command: str = "filter"
    """The command, as the stats record it (filter | decontaminate | dedup)."""
    keep_removed_text: bool = False
    """Write each removed document's text into the removed file (--keep-removed-text)."""
    skip_bad: bool = False
    force: bool = False
    shard: ShardSpec | None = None
    chunk_bytes: int = 1 << 20
    progress: bool | None = None
    durable: bool = True

    def __post_init__(self) -> None:
        if not self.text_key:
            raise UsageError("--text-key: give a non-empty key")
        if self.chunk_bytes < 1:
            raise UsageError(f"chunk_bytes: must be positive, got {self.chunk_bytes}")

    def paths(self) -> CurationPaths:
        return curation_paths(self.output, self.stats, self.removed, self.shard)


@dataclass
class Tally:
    """The counts a run makes, and the stats record built from them."""

    documents: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(("in", "kept", "removed", "changed"), 0)
    )
    characters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("in", "kept", "removed"), 0))
    skipped: dict[str, int] = field(default_factory=dict)
    rules: dict[str, dict[str, int]] = field(default_factory=dict)
    changes: dict[str, dict[str, int]] = field(default_factory=dict)
    languages: dict[str, dict[str, int]] | None = None

    def skip(self, kind: str, count: int = 1) -> None:
        self.skipped[kind] = self.skipped.get(kind, 0) + count

    def removal(self, rule: str, characters: int) -> None:
        counts = self.rules.setdefault(rule, {"documents": 0, "characters": 0})
        counts["documents"] += 1
        counts["characters"] += characters

    def change(self, step: str, changes: int, before: int, after: int) -> None:
        counts = self.changes.setdefault(
            step, {"documents": 0, "changes": 0, "characters_before": 0, "characters_after": 0}
        )
        counts["documents"] += 1
        counts["changes"] += changes
        counts["characters_before"] += before
        counts["characters_after"] += after

    def language(self, lang: str, characters: int, kept: bool) -> None:
        if self.languages is None:
            self.languages = {}
        counts = self.languages.setdefault(str(lang), {"documents": 0, "kept": 0, "characters": 0})
        counts["documents"] += 1
        counts["kept"] += int(kept)
        counts["characters"] += characters


@dataclass
class CurationResult:
    paths: list[str]
    stats: dict
    seconds: float = 0.0
    input_bytes: int = 0

    def summary(self) -> str:
        docs, secs = self.stats["documents"], max(self.seconds, 1e-9)
        skipped = sum(v for k, v in self.stats["skipped"].items() if k != "blank_line")
        top = sorted(self.stats["rules"].items(), key=lambda item: -item[1]["documents"])[:3]
        rules = ", ".join(f"{name} {c['documents']:,}" for name, c in top)
        return (
            f"{docs['in']:,} documents: {docs['kept']:,} kept, {docs['removed']:,} removed"
            + (f" ({rules})" if rules else "")
            + f", {docs['changed']:,} changed, {skipped:,} skipped; "
            f"{self.input_bytes / 1e6:.1f} MB in {self.seconds:.2f} s ({docs['in'] / secs:,.0f} docs/s)"
        )

    def to_dict(self) -> dict:
        return {"paths": self.paths, "seconds": round(self.seconds, 4), "stats": self.stats}


def _dumps(obj) -> str:
    """One record as a line: compact, keys in their order, non-ASCII as it is; the standard library's
    encoder, so the bytes do not depend on which optional JSON library is installed."""
    return jsonfile.dumps(obj, "a curated record", ensure_ascii=False, separators=(",", ":"))


def _rewrite(record: Record, text_key: str, text: str, meta: dict) -> bytes:
    obj = dict(record.obj)
    obj[text_key] = text
    if meta:
        present = obj.get(META_KEY)
        obj[META_KEY] = {**present, **meta} if isinstance(present, dict) else dict(meta)
    try:
        return _dumps(obj).encode("utf-8")
    except ValueError:
        raise InputError(
            f"{record.source}:{record.line}: holds NaN or Infinity, which JSON does not allow; the record "
            "cannot be written again"
        ) from None


def _removed_line(record: Record, step: str, outcome: Outcome, text: str | None) -> bytes:
    entry = {"source": record.source, "line": record.line}
    if "id" in record.obj:
        entry["id"] = record.obj["id"]
    entry.update(step=step, rule=outcome.drop, values=outcome.values)
    if text is not None:
        entry["text"] = text
    try:
        return _dumps(entry).encode("utf-8")
    except ValueError:  # a step measured NaN, or the record's id holds one
        entry["values"] = {k: (v if v == v else None) for k, v in outcome.values.items()}
        entry.pop("id", None)
        return _dumps(entry).encode("utf-8")


def curate_record(record: Record, steps: Sequence[Step], config: CurationConfig, tally: Tally):
    """Run the steps over one record: (kept line or None, removed line or None)."""
    key = config.text_key
    original = record.obj[key]
    meta = {k: v for k, v in record.obj.items() if k != key}
    doc = Document(original, meta)
    added: dict = {}
    changes: list[tuple[str, int, int, int]] = []
    dropped: tuple[str, Outcome] | None = None
    for step in steps:
        outcome = step(doc)
        if outcome.meta:
            added.update(outcome.meta)
            doc.meta.update(outcome.meta)
        if outcome.drop is not None:
            dropped = (step.name, outcome)
            break
        if outcome.text is not None and outcome.text != doc.text:
            changes.append((step.name, outcome.changes, len(doc.text), len(outcome.text)))
            doc = Document(outcome.text, doc.meta)  # a new text: what was cached of the old one is stale
    if added and META_KEY in record.obj and not isinstance(record.obj[META_KEY], dict):
        raise _Bad(
            "metadata_not_an_object",
            f"{record.source}:{record.line}: key {META_KEY!r} is not an object, so the metadata the steps "
            "add has nowhere to go",
        )
    for change in changes:  # counted also for a document a later step drops: the step did change it
        tally.change(*change)
    changed = bool(changes)
    chars = len(original)
    tally.documents["in"] += 1
    tally.characters["in"] += chars
    if "language" in added:
        tally.language(added["language"], chars, dropped is None)
    if dropped is not None:
        tally.documents["removed"] += 1
        tally.characters["removed"] += chars
        tally.removal(dropped[1].drop, chars)
        return None, _removed_line(
            record, dropped[0], dropped[1], original if config.keep_removed_text else None
        )
    tally.documents["kept"] += 1
    tally.documents["changed"] += int(changed)
    tally.characters["kept"] += len(doc.text)
    if not changed and not added:
        return record.raw, None
    return _rewrite(record, key, doc.text, added), None


class _Bad(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _Sink:
    """Where kept lines go (a temporary file, or stdout), counting and hashing the bytes."""

    def __init__(self, handle, label: str) -> None:
        self.handle, self.label = handle, label
        self.sha256 = hashlib.sha256()
        self.bytes = 0

    def write(self, lines: list[bytes]) -> None:
        if not lines:
            return
        data = b"\n".join(lines) + b"\n"
        self.sha256.update(data)
        self.bytes += len(data)
        self.handle.write(data)

    def record(self) -> dict:
        return {"path": self.label, "bytes": self.bytes, "sha256": self.sha256.hexdigest()}


def run_curation(
    config: CurationConfig, steps: Sequence[Step], described: list[dict], stdout=None
) -> CurationResult:
    """Run ``steps`` (``described``: their names and parameters, for the stats) over ``config.inputs``.

    Raises InputError (a bad line, without ``skip_bad``: ``file:line: what``), UsageError (options,
    outputs that exist without ``force``, another writer at work on them), RuntimeFailure."""
    if not config.inputs:
        raise UsageError("give at least one INPUT (a JSONL file, a glob, or - for stdin)")
    paths = config.paths()
    inputs, shard_record = list(config.inputs), None
    if config.shard is not None:
        assignment = plan_shards(expand_inputs(inputs), config.shard)
        inputs, shard_record = assignment.mine, assignment.record()
    started = time.perf_counter()
    with paths.dataset_output(config.force, config.durable) as output:
        source = open_source(inputs, config.skip_bad, config.chunk_bytes) if inputs else None
        removed_tmp = output.path(paths.removed)
        out_tmp = None if paths.to_stdout else output.path(paths.output)
        if stdout is None and paths.to_stdout:
            stdout = sys.stdout.buffer
        tally = Tally()
        with (
            open(removed_tmp, "wb") as removed_handle,
            open(out_tmp, "wb") if out_tmp is not None else _Borrowed(stdout) as out_handle,
        ):
            sink = _Sink(out_handle, "<stdout>" if paths.to_stdout else paths.output)
            removed_sink = _Sink(removed_handle, paths.removed)
            nbytes = _run(source, steps, config, tally, sink, removed_sink) if source is not None else 0
            if paths.to_stdout:
                out_handle.flush()
        # A step that counts more than removals and changes (decontamination's per-task hits) reports it
        # beside its parameters.
        reports = {step.name: step.report() for step in steps if callable(getattr(step, "report", None))}
        described = [
            {**d, "report": reports[d["name"]]} if d.get("name") in reports else d for d in described
        ]
        stats = build_stats(
            command=config.command,
            steps=described,
            inputs=source.inputs() if source is not None else [],
            shard=shard_record,
            output=sink.record(),
            removed=paths.removed,
            documents=tally.documents,
            characters=tally.characters,
            skipped={**tally.skipped, **_file_skips(source)},
            rules=tally.rules,
            changes=tally.changes,
            languages=tally.languages,
        )

        with open(output.path(paths.stats), "w", encoding="utf-8") as handle:
            handle.write(jsonfile.dumps(stats, indent=2) + "\n")
        written = [str(p) for p in output.commit()]
    return CurationResult(written, stats, time.perf_counter() - started, nbytes)


def _file_skips(source) -> dict[str, int]:
    return dict(source.skipped) if source is not None else {}


def _run(source, steps, config: CurationConfig, tally: Tally, sink: _Sink, removed: _Sink) -> int:
    bar = Progress(source.total_bytes, config.command, unit="B", enabled=config.progress is not False)
    start = time.perf_counter()
    nbytes = 0
    try:
        for batch in record_batches(source, config.text_key, config.skip_bad):
            if batch.bad:
                if not config.skip_bad:
                    raise InputError(batch.bad[0].message)
                for bad in batch.bad:
                    tally.skip(bad.kind)
            if batch.blank_lines:
                tally.skip("blank_line", batch.blank_lines)
            kept, gone = [], []
            for record in batch.records:
                try:
                    line, removed_line = curate_record(record, steps, config, tally)
                except _Bad as bad:
                    if not config.skip_bad:
                        raise InputError(str(bad)) from None
                    tally.skip(bad.kind)
                    continue
                if line is not None:
                    kept.append(line)
                if removed_line is not None:
                    gone.append(removed_line)
            sink.write(kept)
            removed.write(gone)
            nbytes += batch.nbytes
            secs = max(time.perf_counter() - start, 1e-9)
            docs = tally.documents
            bar.set_postfix(
                f"{docs['in'] / secs:,.0f} docs/s, {docs['kept']:,} kept, {docs['removed']:,} removed"
            )
            bar.update(batch.nbytes)
    finally:
        bar.close()
    return nbytes


class _Borrowed:
    """A stream we write to but do not close (stdout)."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def __enter__(self):
        return self.stream

    def __exit__(self, *exc) -> None:
        return None
