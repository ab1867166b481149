"""Where a curation command writes: the kept JSONL (a file, or stdout), the removed documents and the stats.

Beside an output file ``OUT`` (``web.jsonl``)::

    OUT                  the kept documents (JSONL), nothing else in it: json2bin reads it as it is
    OUT.removed          the removed documents (JSON lines: source, line, id, rule, values, [text])
    OUT.stats.json       the stats (:mod:`llmtools.formats.curation_stats`)

``OUT.removed`` does not end in ``.jsonl`` on purpose: a later ``'clean/*.jsonl'`` must not take the removed
documents back in. When the output is stdout (``-``) there is no file to sit beside: ``--stats PATH`` is
required, and the removed documents go to ``--removed`` or, by default, beside the stats
(``S.stats.json`` -> ``S.removed``). With ``--shard I/N`` every name gets json2bin's shard suffix
(``web-00003-of-00010.jsonl``, ``.removed``, ``.stats.json``), so the shards sort in order and their kept
files concatenate to the one-machine output.

Every file is written to a temporary and renamed into place with the others when the run completes
(:class:`~llmtools.prep.dataset_output.DatasetOutput`); each gets a marker (``NAME.llmtools.json``) that
lets ``--force`` replace it later, and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmtools.errors import UsageError
from llmtools.prep.dataset_output import DatasetOutput
from llmtools.prep.shards import ShardSpec

STDOUT = "-"
REMOVED_SUFFIX = ".removed"
STATS_SUFFIX = ".stats.json"
_KNOWN_ENDINGS = (STATS_SUFFIX, ".jsonl", ".json", REMOVED_SUFFIX)
KINDS = {"output": "curated-jsonl", "removed": "curation-removed", "stats": "curation-stats"}


def with_shard(path: str, shard: ShardSpec | None) -> str:
    """``web.jsonl`` -> ``web-00003-of-00010.jsonl`` (the suffix before a known ending, else at the end)."""
    if shard is None:
        return path
    p = Path(path)
    for ending in _KNOWN_ENDINGS:
        if p.name.endswith(ending) and len(p.name) > len(ending):
            return str(p.with_name(p.name[: -len(ending)] + shard.suffix + ending))
    return path + shard.suffix


@dataclass(frozen=True)
class CurationPaths:
    output: str  # a path, or "-" for stdout
    removed: str
    stats: str

    @property
    def to_stdout(self) -> bool:
        return self.output == STDOUT

    def files(self) -> list[str]:
        """The files written (the output too unless it is stdout)."""
        return ([] if self.to_stdout else [self.output]) + [self.removed, self.stats]

    def dataset_output(self, force: bool, durable: bool = True) -> DatasetOutput:
        kinds = {self.output: KINDS["output"], self.removed: KINDS["removed"], self.stats: KINDS["stats"]}
        files = {path: {"kind": f"llmtools.{kinds[path]}"} for path in self.files()}
        return DatasetOutput(files=files, force=force, clear_stale=True, durable=durable)


def curation_paths(
    output: str, stats: str | None = None, removed: str | None = None, shard: ShardSpec | None = None
) -> CurationPaths:
    """The three names, from ``-o`` and the optional ``--stats`` / ``--removed``; see the module."""
    if not output:
        raise UsageError("-o/--output: give a file for the kept documents, or - for stdout")
    if output != STDOUT and (output.endswith("/") or Path(output).is_dir()):
        raise UsageError(f"-o {output}: is a folder; give a file (e.g. {Path(output) / 'clean.jsonl'})")
    if output == STDOUT:
        if not stats:
            raise UsageError(
                "-o -: the kept documents go to stdout, so the stats need a place: give --stats PATH "
                "(the removed documents go beside it unless --removed PATH)"
            )
        stats = with_shard(stats, shard)
        base = stats[: -len(STATS_SUFFIX)] if stats.endswith(STATS_SUFFIX) else stats
        removed = with_shard(removed, shard) if removed else base + REMOVED_SUFFIX
    else:
        output = with_shard(output, shard)
        stats = with_shard(stats, shard) if stats else output + STATS_SUFFIX
        removed = with_shard(removed, shard) if removed else output + REMOVED_SUFFIX
    paths = CurationPaths(output, removed, stats)
    names = paths.files()
    if len({str(Path(p).resolve()) for p in names}) != len(names):
        raise UsageError(f"the output, removed and stats files must differ (got {', '.join(names)})")
    return paths
