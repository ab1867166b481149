"""The stats JSON of a curation command (``llm-prep filter``, ``decontaminate``, ``dedup``): what it read,
what it removed and changed, by rule; and the summary of it that json2bin carries into its sidecar.

Shape (``version`` 2; every count an integer >= 0, every share a float in [0, 1]; version 1, without
``dedup``, is read too)::

    {
      "format": "llmtools.curation-stats", "version": 2, "tool": "llmtools 0.1.0",
      "command": "filter",                          # filter | decontaminate | dedup
      "steps": [{"name": "language", "params": {...}}, ...],   # in the order they ran
      "inputs": [{"path", "size", "sha256"}, ...],  # what was read (json2bin's input records)
      "shard": null | {...},                        # --shard I/N: json2bin's shard record
      "output": {"path", "bytes", "sha256"},         # the kept JSONL ("<stdout>" for -)
      "removed": "PATH",                            # the removed-documents file
      "documents":  {"in", "kept", "removed", "changed"},
      "characters": {"in", "kept", "removed"},      # Unicode code points of the text key
      "skipped": {"malformed_json": 2, ...},        # bad lines skipped with --skip-bad, by kind
      "rules":   {"RULE": {"documents", "characters", "share", "character_share"}},  # removals
      "changes": {"STEP": {"documents", "changes", "characters_before", "characters_after"}},
      "languages": {"en": {"documents", "kept", "characters"}},  # when a step identified languages
      "dedup": {"run", "source", "shared": [{"with", "kept_in", "documents", "characters"}]}  # dedup only
    }

``dedup`` says which run (16 hex digits of its plan) and which of its sources the output belongs to, and
its overlap with each other source of the run: documents removed here whose copy ``with`` kept
(``kept_in`` is ``with``), and documents ``with`` lost because this output kept their copy (``kept_in``
is ``source``).

``share`` is the rule's removed documents over ``documents.in``, ``character_share`` its removed characters
over ``characters.in``. The output's sha256 is how json2bin ties a stats file to one of its inputs
(``--provenance``): the record describes the very bytes json2bin read, from a file or a pipe.

Nothing here imports torch or ``prep``: :mod:`llmtools.data` reads the sidecar summary for ``llm-mix
--explain``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from llmtools import __version__
from llmtools.errors import InputError
from llmtools.formats import jsonfile

FORMAT = "llmtools.curation-stats"
VERSION = 2
READS = (1, 2)
COMMANDS = ("filter", "decontaminate", "dedup")
MAX_BYTES = 16 << 20
"""A stats file is a few KB per rule and language; more than this is not one of ours."""
MAX_ENTRIES = 10_000
"""Rules, steps, languages or inputs in one file: more is not a stats file of ours (and a sidecar carries
the summary)."""
_SHA = set("0123456789abcdef")


def share(part: int, whole: int) -> float:
    """``part / whole`` rounded to 6 places (0 when nothing was read): stable bytes, readable shares."""
    return round(part / whole, 6) if whole else 0.0


def build_stats(
    *,
    command: str,
    steps: list[dict],
    inputs: list[dict],
    shard: dict | None,
    output: dict,
    removed: str,
    documents: dict[str, int],
    characters: dict[str, int],
    skipped: dict[str, int],
    rules: dict[str, dict[str, int]],
    changes: dict[str, dict[str, int]],
    languages: dict[str, dict[str, int]] | None = None,
    dedup: dict | None = None,
) -> dict[str, Any]:
    """The record, complete and in its stated order; ``rules`` give documents and characters, the shares
    are computed here."""
    total_docs, total_chars = documents["in"], characters["in"]
    record: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "tool": f"llmtools {__version__}",
        "command": command,
        "steps": steps,
        "inputs": inputs,
        "shard": shard,
        "output": output,
        "removed": removed,
        "documents": {k: int(documents[k]) for k in ("in", "kept", "removed", "changed")},
        "characters": {k: int(characters[k]) for k in ("in", "kept", "removed")},
        "skipped": dict(sorted(skipped.items())),
        "rules": {
            name: {
                "documents": int(c["documents"]),
                "characters": int(c["characters"]),
                "share": share(c["documents"], total_docs),
                "character_share": share(c["characters"], total_chars),
            }
            for name, c in rules.items()
        },
        "changes": {name: {k: int(v) for k, v in c.items()} for name, c in changes.items()},
    }
    if languages is not None:
        record["languages"] = {lang: dict(c) for lang, c in sorted(languages.items())}
    if dedup is not None:
        record["dedup"] = {"run": dedup["run"], "source": dedup["source"],
                           "shared": [dict(row) for row in dedup["shared"]]}  # fmt: skip
    return record


# -- reading an untrusted stats file ----------------------------------------------------------------
def _count(value, where: str) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"{where}: expected a count (an integer >= 0), found {jsonfile._shown(repr(value))}")
    return value


def _object(value, where: str, limit: int = MAX_ENTRIES) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected an object")
    if len(value) > limit:
        raise ValueError(f"{where}: {len(value):,} entries (at most {limit:,})")
    return value


def _counts(value, where: str, keys: tuple[str, ...]) -> dict[str, int]:
    value = _object(value, where)
    missing = [k for k in keys if k not in value]
    if missing:
        raise ValueError(f"{where}: missing {missing[0]!r}")
    return {k: _count(value[k], f"{where}.{k}") for k in keys}


def _share(value, where: str) -> float:
    if type(value) not in (int, float) or not 0 <= value <= 1:
        raise ValueError(f"{where}: expected a share from 0 to 1")
    return float(value)


def _sha256(value, where: str) -> str:
    if not isinstance(value, str) or len(value) != 64 or not set(value) <= _SHA:
        raise ValueError(f"{where}: expected a sha256 (64 lowercase hex digits)")
    return value


def check_stats(data) -> dict:
    """The record if it is a stats file of this shape; ValueError naming the key otherwise."""
    data = _object(data, "the file")
    if data.get("format") != FORMAT:
        raise ValueError(f"format is {jsonfile._shown(repr(data.get('format')))}, expected {FORMAT!r}")
    if data.get("version") not in READS:
        raise ValueError(
            f"version {jsonfile._shown(repr(data.get('version')))} is not one this llmtools reads "
            f"({', '.join(map(str, READS))})"
        )
    if data.get("command") not in COMMANDS:
        raise ValueError(f"command: expected one of {', '.join(COMMANDS)}")
    steps = data.get("steps")
    if not isinstance(steps, list) or len(steps) > MAX_ENTRIES:
        raise ValueError("steps: expected a list")
    for i, step in enumerate(steps):
        if not isinstance(step, dict) or not isinstance(step.get("name"), str):
            raise ValueError(f"steps[{i}]: expected an object with a name")
    inputs = data.get("inputs")
    if not isinstance(inputs, list) or len(inputs) > 10 * MAX_ENTRIES:
        raise ValueError("inputs: expected a list")
    for i, item in enumerate(inputs):
        item = _object(item, f"inputs[{i}]")
        if not isinstance(item.get("path"), str):
            raise ValueError(f"inputs[{i}].path: expected a string")
        _count(item.get("size"), f"inputs[{i}].size")
        _sha256(item.get("sha256"), f"inputs[{i}].sha256")
    output = _object(data.get("output"), "output")
    if not isinstance(output.get("path"), str):
        raise ValueError("output.path: expected a string")
    _count(output.get("bytes"), "output.bytes")
    _sha256(output.get("sha256"), "output.sha256")
    docs = _counts(data.get("documents"), "documents", ("in", "kept", "removed", "changed"))
    chars = _counts(data.get("characters"), "characters", ("in", "kept", "removed"))
    if docs["kept"] + docs["removed"] != docs["in"]:
        raise ValueError("documents: kept + removed is not in")
    for kind, value in _object(data.get("skipped"), "skipped").items():
        _count(value, f"skipped.{kind}")
    removed = 0
    for name, rule in _object(data.get("rules"), "rules").items():
        counts = _counts(rule, f"rules.{name}", ("documents", "characters"))
        _share(rule.get("share"), f"rules.{name}.share")
        _share(rule.get("character_share"), f"rules.{name}.character_share")
        removed += counts["documents"]
    if removed != docs["removed"]:
        raise ValueError("rules: their documents do not add up to documents.removed")
    for name, change in _object(data.get("changes"), "changes").items():
        _counts(change, f"changes.{name}", ("documents", "changes", "characters_before", "characters_after"))
    for lang, counts in _object(data.get("languages", {}), "languages").items():
        _counts(counts, f"languages.{lang}", ("documents", "kept", "characters"))
    del chars
    if "dedup" in data:
        if data["version"] < 2 or data["command"] != "dedup":
            raise ValueError("dedup: only in a version 2 file of the dedup command")
        check_dedup(data["dedup"], docs["removed"])
    return data


def check_dedup(block, removed: int, where: str = "dedup") -> dict:
    """The ``dedup`` block if it has its shape: rows of two other names' overlap, and no more documents
    lost to other sources than were removed; ValueError naming the key otherwise."""
    block = _object(block, where)
    if not isinstance(block.get("run"), str) or not 0 < len(block["run"]) <= 64:
        raise ValueError(f"{where}.run: expected the run's identity (a string)")
    source = block.get("source")
    if not isinstance(source, str) or not source:
        raise ValueError(f"{where}.source: expected a source name")
    rows = block.get("shared")
    if not isinstance(rows, list) or len(rows) > MAX_ENTRIES:
        raise ValueError(f"{where}.shared: expected a list")
    lost = 0
    for i, row in enumerate(rows):
        row = _object(row, f"{where}.shared[{i}]")
        other = row.get("with")
        if not isinstance(other, str) or not other or other == source:
            raise ValueError(f"{where}.shared[{i}].with: expected another source's name")
        if row.get("kept_in") not in (source, other):
            raise ValueError(f"{where}.shared[{i}].kept_in: expected {source!r} or {other!r}")
        counts = _counts(row, f"{where}.shared[{i}]", ("documents", "characters"))
        if row["kept_in"] == other:
            lost += counts["documents"]
    if lost > removed:
        raise ValueError(f"{where}.shared: more documents lost to other sources than documents.removed")
    return block


def read_stats(path: str | os.PathLike) -> dict:
    """A stats file checked as :func:`check_stats` does, read with the one bounded parser; an
    :class:`InputError` naming the file and what is wrong, in one line, otherwise."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise InputError(f"{path}: not a curation stats file (not a regular file)")
        if size > MAX_BYTES:
            raise InputError(f"{path}: {size:,} bytes; a curation stats file is at most {MAX_BYTES:,}")
        data = jsonfile.loads(path.read_bytes(), finite=True)
    except OSError as error:
        raise InputError(f"{path}: cannot read the curation stats ({error.strerror})") from None
    except ValueError as error:
        raise InputError(f"{path}: not valid JSON ({error})") from None
    try:
        return check_stats(data)
    except ValueError as error:
        raise InputError(f"{path}: not a curation stats file of llmtools: {error}") from None


def summary(stats: dict, name: str) -> dict:
    """What a sidecar keeps of one stats file (``name``: how the file was given): the command, what it
    read and kept, and each rule's removals and each step's text changes."""
    record = {
        "command": stats["command"],
        "stats": name,
        "output_sha256": stats["output"]["sha256"],
        "steps": [step["name"] for step in stats["steps"]],
        "documents": stats["documents"],
        "characters": stats["characters"],
        "skipped": stats["skipped"],
        "rules": stats["rules"],
        "changes": stats["changes"],
    }
    if "languages" in stats:
        record["languages"] = stats["languages"]
    if "dedup" in stats:
        record["dedup"] = stats["dedup"]
    return record


def explain_lines(curation: list[dict]) -> list[str]:
    """``llm-mix --explain``'s lines for one source's ``curation`` block: per stage, what it read and
    removed, then each rule by documents removed (largest first) and each text change."""
    lines = []
    for stage in curation:
        docs, chars = stage["documents"], stage["characters"]
        lines.append(
            f"{stage['command']}: {docs['in']:,} documents in, {docs['removed']:,} removed "
            f"({share(docs['removed'], docs['in']):.2%}), {chars['removed']:,} of {chars['in']:,} characters "
            f"({share(chars['removed'], chars['in']):.2%}); {docs['changed']:,} changed"
        )
        for rule, counts in sorted(stage["rules"].items(), key=lambda item: -item[1]["documents"]):
            lines.append(
                f"  - {rule}: {counts['documents']:,} documents ({counts['share']:.2%}), "
                f"{counts['characters']:,} characters ({counts['character_share']:.2%})"
            )
        for step, counts in stage["changes"].items():
            lines.append(f"  ~ {step}: {counts['changes']:,} changes in {counts['documents']:,} documents")
        if "dedup" in stage:
            lines += shared_lines(stage)
    return lines


def shared_lines(stage: dict) -> list[str]:
    """A dedup stage's overlap with the other sources of its run, one line per other source and side."""
    block = check_dedup(stage["dedup"], stage["documents"]["removed"])
    docs, chars = stage["documents"]["in"], stage["characters"]["in"]
    lines = []
    for row in block["shared"]:
        where = "here" if row["kept_in"] == block["source"] else f"in {row['kept_in']}"
        # the documents this output lost are shares of what it read; those the other lost, of nothing here
        of = f" ({share(row['documents'], docs):.2%})" if where != "here" else ""
        of_chars = f" ({share(row['characters'], chars):.2%})" if where != "here" else ""
        lines.append(
            f"  = duplicates shared with {row['with']}: {row['documents']:,} documents{of}, "
            f"{row['characters']:,} characters{of_chars}, kept {where}"
        )
    return lines


def provenance(stages: list[tuple[str, dict]], inputs: list[dict]) -> list[dict]:
    """The sidecar's ``curation`` block from the stats files given (``(name, record)``, each checked by
    :func:`read_stats`) and the inputs json2bin read (``{"path", "size", "sha256"}``).

    Each stats file must describe bytes that were read: its output is one of json2bin's inputs, or an input
    of another stats file given (a chain: filter, then dedup, then json2bin). A stats file of some other
    output is refused in one line: the sidecar would describe data it does not hold. The block lists the
    stages as given."""
    read = {item["sha256"] for item in inputs}
    fed = {item["sha256"] for _, stats in stages for item in stats["inputs"]}
    out = []
    for name, stats in stages:
        sha = stats["output"]["sha256"]
        if sha not in read and sha not in fed:
            raise InputError(
                f"{name}: describes the output {stats['output']['path']} (sha256 {sha[:12]}…), which is "
                "none of the inputs read (nor an input of another --provenance file); give the stats of "
                "these very inputs"
            )
        out.append(summary(stats, name))
    return out
