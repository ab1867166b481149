"""The run folder of `llm-prep dedup`: its plan, where each stage writes, and how its documents are read.

    OUT/plan.json                      sources, inputs (path, size, source), config: every stage reads it
    OUT/work/sig/F/band_BBB.sig        stage 1, per input F: datatrove's .minhash.sig records, sorted
    OUT/work/sig/F/exact.bin           stage 1: (128-bit normalised-text hash, doc) records, sorted
    OUT/work/sig/F/docs.npy            stage 1: each document's line, bytes and characters; input.json
    OUT/work/pairs/band_BBB.pairs      stage 2, per band: duplicate pairs (file, doc, file, doc), <4I
    OUT/work/pairs/exact.pairs         stage 2: pairs of identical normalised texts
    OUT/work/remove/F.npy              stage 3: what input F loses (doc, line, kind, cluster, kept one)
    OUT/clusters.jsonl, OUT/stats.json stage 3: every cluster with its members and the one kept; the stats
    OUT/kept/SOURCE/F-NAME.jsonl       stage 4, per input: the kept lines, byte for byte as read; beside it
                 .removed              each removed document's place, rule, cluster and kept one
                 .stats.json           the curation stats of this output (llmtools.formats.curation_stats)

A document is named by (F, D): F its input's index in the plan (sources in rank order, each source's
files sorted), D its index among the input's documents (blank lines are not documents; with --skip-bad
bad lines are not either). Each output of a unit of work is renamed into place complete, so a killed
stage, run again, does only the units whose outputs are missing."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from llmtools.errors import InputError, UsageError
from llmtools.formats import jsonfile
from llmtools.fsutil import atomic_file
from llmtools.prep.curate.dedup.config import DedupConfig
from llmtools.prep.curate.dedup.normalise import TextNorm
from llmtools.prep.curate.records import open_source, record_batches
from llmtools.prep.jsonl import READ_BLOCK, STDIN, expand_inputs

PLAN_FORMAT = "llmtools.dedup.plan/1"
_SOURCE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_INPUTS = 1 << 31
MAX_DOCS_PER_INPUT = (1 << 32) - 1
"""Documents one input may hold: a document is named by 32-bit indices in the pair files (datatrove's)."""


@dataclass(frozen=True)
class Source:
    name: str
    patterns: tuple[str, ...]


def parse_sources(specs: Sequence[str], inputs: Sequence[str]) -> list[Source]:
    """`--source NAME=GLOB` (repeatable; a name given again adds patterns) in rank order, then the plain
    inputs as one source named `corpus`."""
    order: dict[str, list[str]] = {}
    for spec in specs:
        name, eq, pattern = spec.partition("=")
        if not eq or not pattern:
            raise UsageError(f"--source: expected NAME=FILES (a glob, a file or @list), got {spec!r}")
        if not _SOURCE_NAME.match(name):
            raise UsageError(f"--source: {name!r} is not a source name (letters, digits, '_', '.', '-')")
        order.setdefault(name, []).append(pattern)
    if inputs:
        if "corpus" in order:
            raise UsageError(
                "--source corpus=...: 'corpus' names the plain INPUT arguments; pick another name"
            )
        order["corpus"] = list(inputs)
    if not order:
        raise UsageError("no input: give INPUT files or --source NAME=FILES")
    return [Source(name, tuple(patterns)) for name, patterns in order.items()]


@dataclass
class Plan:
    """What every stage of one run agrees on: the config, the sources and their files in order."""

    config: DedupConfig
    sources: list[str]
    paths: list[str]
    sizes: list[int]
    source_of: list[int]  # each input's source (its rank)
    skip_bad: bool = False

    def record(self) -> dict:
        return {
            "format": PLAN_FORMAT,
            "config": self.config.record(),
            "skip_bad": self.skip_bad,
            "sources": self.sources,
            "inputs": [
                {"path": p, "size": s, "source": self.sources[k]}
                for p, s, k in zip(self.paths, self.sizes, self.source_of, strict=True)
            ],
        }

    @property
    def identity(self) -> str:
        """16 hex digits of the plan's record: which run a curation stats file came from (two runs of the
        same inputs and options are the same run)."""
        import hashlib

        return hashlib.sha256(jsonfile.dumps(self.record()).encode("utf-8")).hexdigest()[:16]

    def label(self, file: int) -> str:
        """`F-NAME.jsonl`: the output name of input F (its index first: two inputs may share a name)."""
        name = Path(self.paths[file]).name
        for suffix in (".gz", ".zst"):
            name = name.removesuffix(suffix)
        stem = name.removesuffix(".jsonl").removesuffix(".json") or "input"
        return f"{file:06d}-{stem}.jsonl"


def make_plan(config: DedupConfig, sources: Sequence[Source], skip_bad: bool) -> Plan:
    paths: list[str] = []
    source_of: list[int] = []
    seen: dict[str, str] = {}
    for rank, source in enumerate(sources):
        files = expand_inputs(list(source.patterns))
        if STDIN in files:
            raise UsageError(
                f"--source {source.name}: dedup reads its inputs more than once; stdin ('-') cannot be"
            )
        for path in sorted(files):
            real = os.path.realpath(path)
            if real in seen:
                raise InputError(
                    f"{path}: named by two sources ({seen[real]} and {source.name}); give each file once"
                )
            seen[real] = source.name
            paths.append(path)
            source_of.append(rank)
    if len(paths) >= MAX_INPUTS:
        raise UsageError(f"{len(paths)} inputs; at most {MAX_INPUTS - 1}")
    sizes = [os.path.getsize(p) for p in paths]
    return Plan(config, [s.name for s in sources], paths, sizes, source_of, skip_bad)


def config_from_record(record: dict) -> DedupConfig:
    fields = {k: v for k, v in record.items() if k not in ("exact_normalisation", "keep_rule", "norm")}
    return DedupConfig(norm=TextNorm(**record["norm"]), **fields)


def write_or_check_plan(out: Path, plan: Plan) -> None:
    """Record the plan; a run folder holding another plan (other options or inputs) is refused, so the
    tasks of one array cannot mix two runs. Tasks racing to write it write the same bytes."""
    path = out / "plan.json"
    text = jsonfile.dumps(plan.record(), indent=1) + "\n"
    if path.exists():
        old = path.read_text(encoding="utf-8", errors="replace")
        if old != text:
            raise UsageError(
                f"{path}: this run folder was started with other options or inputs; give the same ones, "
                "another --output, or --force to start again"
            )
        return
    out.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def read_plan(out: Path) -> Plan:
    path = out / "plan.json"
    if not path.exists():
        raise UsageError(f"{out}: no plan.json; run the signatures stage (or `llm-prep dedup all`) first")
    record = jsonfile.read_json_object(path, "dedup plan")
    try:
        if record.get("format") != PLAN_FORMAT:
            raise ValueError(f"format {record.get('format')!r}, expected {PLAN_FORMAT!r}")
        sources = [str(s) for s in record["sources"]]
        inputs = record["inputs"]
        plan = Plan(
            config_from_record(record["config"]),
            sources,
            [str(i["path"]) for i in inputs],
            [int(i["size"]) for i in inputs],
            [sources.index(i["source"]) for i in inputs],
            bool(record["skip_bad"]),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise InputError(f"{path}: not a dedup plan ({error})") from None
    return plan


def sig_dir(out: Path, file: int) -> Path:
    return out / "work" / "sig" / f"{file:06d}"


def pairs_path(out: Path, unit: int, config: DedupConfig) -> Path:
    """Unit `bands` is the exact-duplicate pass; 0..bands-1 the MinHash bands."""
    name = "exact" if unit == config.bands else f"band_{unit:03d}"
    return out / "work" / "pairs" / f"{name}.pairs"


def pair_units(config: DedupConfig) -> list[int]:
    """The units of the buckets stage, in the order the clusters stage reads their pairs."""
    return ([*range(config.bands)] if config.near else []) + ([config.bands] if config.exact else [])


def remove_path(out: Path, file: int) -> Path:
    return out / "work" / "remove" / f"{file:06d}.npy"


def kept_for_path(out: Path, file: int) -> Path:
    """Per source, the documents (and their characters) removed from it because input `file` kept their
    copy: an int64 table (sources, 2), written only for inputs that kept a copy for another source."""
    return out / "work" / "remove" / f"{file:06d}.kept-for.npy"


@dataclass
class Doc:
    index: int
    line: int
    text: str
    row: bytes
    obj: dict


class InputDocs:
    """The documents of input F in order, each with its line's bytes as read (json2bin's reader and the
    curation commands' judgement of a bad line, `empty_text` included). Bad lines stop with FILE:LINE
    (exit 2), or are skipped with --skip-bad and counted by kind in `skipped`; after the last document,
    `inputs` holds json2bin's record of the file read (path, size, sha256)."""

    def __init__(self, plan: Plan, file: int) -> None:
        self.plan, self.file = plan, file
        self.skipped: dict[str, int] = {}
        self.inputs: list[dict] = []

    def __iter__(self) -> Iterator[Doc]:
        plan, path = self.plan, self.plan.paths[self.file]
        try:
            size = os.path.getsize(path)
        except OSError as error:
            raise InputError(f"{path}: cannot read it ({error.strerror})") from None
        if size != plan.sizes[self.file]:
            raise InputError(
                f"{path}: its size changed since the run began ({plan.sizes[self.file]} -> {size} bytes)"
            )
        source = open_source([path], skip_bad=plan.skip_bad, chunk_bytes=READ_BLOCK)
        index = 0
        for batch in record_batches(source, plan.config.text_key, plan.skip_bad):
            if batch.bad and not plan.skip_bad:
                raise InputError(batch.bad[0].message)
            for bad in batch.bad:
                self.skipped[bad.kind] = self.skipped.get(bad.kind, 0) + 1
            for record in batch.records:
                if index >= MAX_DOCS_PER_INPUT:
                    raise InputError(
                        f"{path}:{record.line}: more than {MAX_DOCS_PER_INPUT:,} documents in one input"
                    )
                yield Doc(index, record.line, record.obj[plan.config.text_key], record.raw, record.obj)
                index += 1
        self.inputs = source.inputs()
        for kind, count in source.skipped.items():
            self.skipped[kind] = self.skipped.get(kind, 0) + count
