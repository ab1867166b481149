"""Whole JSONL records for the curation commands, read exactly as json2bin reads its inputs.

json2bin keeps only the texts of a line; a curation command keeps the whole record (its other keys go
through unchanged) and the line's bytes (a record nothing changed is written back as it was read). The
reading, the chunking and the judgement of a bad line are json2bin's own (:mod:`llmtools.prep.jsonl`):
the same inputs (files, globs, ``@lists``, ``.gz``/``.zst``, ``-``), the same ``file:line: what``
messages and the same kinds in the counts of skipped lines. One kind is added: ``empty_text``, a record
whose text is the empty string (datatrove's readers drop such a document before any step sees it; here
it is named, as any other bad line is).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from llmtools.formats import jsonfile
from llmtools.prep.jsonl import JsonlChunk, JsonlSource, _check, _load_slow, _loads
from llmtools.prep.sources import BadRecord


@dataclass
class Record:
    """One JSONL line: the parsed object, its bytes (no newline), where it came from."""

    obj: dict
    raw: bytes
    source: str
    line: int


@dataclass
class RecordBatch:
    records: list[Record]
    bad: list[BadRecord]
    blank_lines: int
    nbytes: int


def parse_chunk(chunk: JsonlChunk, text_key: str, skip_bad: bool) -> RecordBatch:
    """The records of one chunk of whole lines; with ``skip_bad=False`` it stops at the first bad one."""
    loads = _loads()
    rows = chunk.data.split(b"\n")
    if rows[-1] == b"":
        rows.pop()  # the empty text after the final newline
    records: list[Record] = []
    bad: list[BadRecord] = []
    blank = 0
    keys = (text_key,)
    last = chunk.first_line + len(rows) - 1
    for number, row in enumerate(rows, chunk.first_line):
        try:
            obj = loads(row)
            if jsonfile.too_deep(row) is not None:
                raise ValueError(row)
        except ValueError:  # JSON errors and UnicodeDecodeError alike: the one bounded parser decides
            obj = _load_slow(row, chunk.source, number, chunk.unterminated and number == last, keys)
            if obj is None:
                blank += 1
                continue
            if isinstance(obj, BadRecord):
                bad.append(obj)
                if not skip_bad:
                    break
                continue
        problem = _check(obj, keys)
        if problem is None and obj[text_key] == "":
            problem = ("empty_text", f"key {text_key!r} is an empty string (no document to curate)")
        if problem is not None:
            kind, what = problem
            bad.append(BadRecord(kind, f"{chunk.source}:{number}: {what}", number))
            if not skip_bad:
                break
            continue
        records.append(Record(obj, row, chunk.source, number))
    return RecordBatch(records, bad, blank, len(chunk.data))


def record_batches(source: JsonlSource, text_key: str, skip_bad: bool) -> Iterator[RecordBatch]:
    """Every chunk of ``source`` parsed, in input order (about one read block of input each)."""
    for chunk in source.batches():
        yield parse_chunk(chunk, text_key, skip_bad)


def open_source(inputs: Sequence[str], skip_bad: bool, chunk_bytes: int) -> JsonlSource:
    return JsonlSource(inputs, skip_bad=skip_bad, chunk_bytes=chunk_bytes)
