"""JSONL input for json2bin: files, globs, ``-`` for stdin, gzip and zstd (detected by magic bytes).

The reader in the main process only cuts the byte stream into chunks of whole lines (one C-level
``rfind`` per chunk) and hashes what it reads; decoding UTF-8 and JSON happens in
:meth:`JsonlChunk.parse`, inside the worker processes. Line numbers travel with each chunk, so
every error names ``file:line``.

What counts as bad input (kind = the key in the sidecar's ``counts.skipped``):

* ``malformed_json``  a line that is not valid JSON
* ``not_an_object``   valid JSON that is not an object
* ``missing_key``     the object lacks one of ``--json-keys``
* ``not_a_string``    the value of a json key is not a string (null, a number, a list)
* ``invalid_utf8``    the line is not valid UTF-8, or a text holds a lone-surrogate escape (``\\ud800``)
* ``truncated_line``  the file does not end with a newline and its last line is not valid JSON
* ``empty_file``      a file with no bytes at all
* ``truncated_file``  a .gz / .zst stream that ends early, or is corrupt
* ``line_too_long``   a line longer than :data:`MAX_LINE_BYTES` (a file without newlines, an endless stream):
  one document must fit in memory, and in the index's 32-bit length

Blank (whitespace-only) lines are not documents: they are skipped and counted as ``blank_line``,
never an error. By default the first bad line stops the run with ``file:line: what is wrong``;
with ``skip_bad`` bad lines are skipped and counted by kind.
"""

from __future__ import annotations

import glob
import hashlib
import os
import stat
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmtools import _native
from llmtools.errors import InputError
from llmtools.formats import jsonfile
from llmtools.formats.pathlists import expand_lists
from llmtools.fsutil import stdin_binary
from llmtools.prep.sources import BadRecord, DocBatch, FlatTexts

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
STDIN = "-"
STDIN_LABEL = "<stdin>"
READ_BLOCK = 1 << 20
MAX_LINE_BYTES = (1 << 31) - 1
"""The longest line read: more bytes than a document's length in tokens can hold (``.idx`` sizes are
int32) with a byte tokenizer, and a bound on what one line may make the reader hold in memory."""


def expand_inputs(inputs: Sequence[str]) -> list[str]:
    """Files in the order given; globs expanded (sorted); ``@list`` files replaced by the paths (or
    globs) they name, one a line; ``-`` kept as stdin. A file named twice (under any spelling, or
    matched again by a glob) is refused: repeating data is a blend's job (``llm-mix``), not a typo's."""
    out: list[str] = []
    for item in expand_lists(inputs):
        item = str(item)
        if item == STDIN:
            out.append(item)
        elif os.path.exists(item):
            if os.path.isdir(item):
                raise InputError(
                    f"{item}: is a directory (give JSONL files or a glob such as '{item}/*.jsonl')"
                )
            out.append(item)
        elif glob.has_magic(item):
            matches = sorted(p for p in glob.glob(item, recursive=True) if os.path.isfile(p))
            if not matches:
                raise InputError(f"{item}: no file matches this pattern")
            out.extend(matches)
        else:
            raise InputError(f"{item}: no such file")
    if out.count(STDIN) > 1:
        raise InputError("-: stdin can be read only once")
    seen: dict[str, str] = {}
    for path in out:
        key = os.path.realpath(path) if path != STDIN else path
        if key in seen:
            raise InputError(f"{path}: the same input is named twice ({seen[key]!r} and {path!r})")
        seen[key] = path
    return out


@dataclass
class JsonlChunk:
    """Whole lines of one file: ``data`` starts at line ``first_line`` (1-based)."""

    source: str
    first_line: int
    data: bytes
    unterminated: bool = False  # the file's last line, with no newline after it
    newlines: int | None = None  # data.count(b"\n"), when the reader knows it already

    def parse(self, keys: Sequence[str], skip_bad: bool = True, flat: bool = False) -> DocBatch:
        """Decode and validate the lines; with ``skip_bad=False`` stop at the first bad one.

        ``flat=True``: when every line is plain (see ``_native/jsonl.c``), the texts come back as
        :class:`FlatTexts` extracted in C, with no Python object per line."""
        if flat:
            batch = self._parse_native(keys)
            if batch is not None:
                return batch
        rows = self.data.split(b"\n")
        if rows[-1] == b"":
            rows.pop()  # the empty text after the final newline
        if len(keys) == 1:
            batch = self._parse_clean(rows, keys[0])
            if batch is not None:
                return batch
        return self._parse_rows(rows, keys, skip_bad)

    def _parse_native(self, keys: Sequence[str]) -> DocBatch | None:
        """Every key of every line extracted by the compiled scanner, or None (no compiler, or a line
        that is not plain): the Python paths then decide, so the outcome is the same either way."""
        lib = _native.load()
        if lib is None or not self.data:
            return None
        import numpy as np

        newlines = (
            self.newlines if self.newlines is not None else lib.llm_count_newlines(self.data, len(self.data))
        )
        lines = newlines + (0 if self.data.endswith(b"\n") else 1)
        texts = {}
        for key in keys:
            out = np.empty(len(self.data), dtype=np.uint8)
            offsets = np.empty(lines + 1, dtype=np.int64)
            name = key.encode("utf-8")
            got = lib.llm_jsonl_extract(
                self.data,
                len(self.data),
                name,
                len(name),
                out.ctypes.data,
                _native.ptr(offsets, _native._i64p),
                lines,
            )
            if got != lines:
                return None
            texts[key] = FlatTexts(out[: offsets[-1]], offsets)
        first = self.first_line
        return DocBatch(texts, self.source, range(first, first + lines), [], nbytes=len(self.data))

    def _parse_clean(self, rows: list[bytes], key: str) -> DocBatch | None:
        """The hot path for one key: every line an object whose ``key`` holds a string. One C-level loop,
        no per-line checks in Python; None when any line is not like that (blank, bad JSON, a missing
        key, not an object, not a string), and :meth:`_parse_rows` then judges the chunk line by line,
        so the outcome is the same as if this path did not exist."""
        loads = _loads()
        try:
            texts = [loads(row)[key] for row in rows]
        except (ValueError, KeyError, TypeError, IndexError):
            return None
        if any(cls is not str for cls in set(map(type, texts))):
            return None
        if jsonfile.too_deep(self.data) is not None:  # orjson reads 1,024 levels; every reader of ours 512
            return None
        lines = range(self.first_line, self.first_line + len(rows))
        return DocBatch({key: texts}, self.source, lines, [], nbytes=len(self.data), blank_lines=0)

    def _parse_rows(self, rows: list[bytes], keys: Sequence[str], skip_bad: bool) -> DocBatch:
        texts: dict[str, list[str]] = {k: [] for k in keys}
        columns = [texts[k] for k in keys]
        lines: list[int] = []
        verdicts = RowVerdicts()
        for number, _row, obj in judge_rows(self, rows, keys, skip_bad, verdicts):
            for key, column in zip(keys, columns):  # noqa: B905 - same length by construction
                column.append(obj[key])
            lines.append(number)
        return DocBatch(
            texts, self.source, lines, verdicts.bad, nbytes=len(self.data), blank_lines=verdicts.blank
        )


@dataclass
class RowVerdicts:
    """What :func:`judge_rows` set aside: the bad lines (in order) and the count of blank ones."""

    bad: list[BadRecord] = field(default_factory=list)
    blank: int = 0


def judge_rows(
    chunk: JsonlChunk,
    rows: list[bytes],
    keys: Sequence[str],
    skip_bad: bool,
    verdicts: RowVerdicts,
    check: Callable[[object, Sequence[str]], tuple[str, str] | None] | None = None,
) -> Iterator[tuple[int, bytes, dict]]:
    """Each good line of a chunk as (line number, its bytes, its object), in input order: the one
    judgement of a line for every reader of JSONL documents. A blank line is counted, a bad one recorded
    in ``verdicts`` (with ``skip_bad=False`` it ends the chunk). ``check`` replaces the record check
    (what a record must hold) for readers that ask more of a record than its keys."""
    loads = _loads()
    check = check or _check
    last = chunk.first_line + len(rows) - 1
    for number, row in enumerate(rows, chunk.first_line):
        try:
            obj = loads(row)
            if jsonfile.too_deep(row) is not None:
                raise ValueError(row)
        except ValueError:  # JSON errors and UnicodeDecodeError alike: the slow path decides
            obj = _load_slow(row, chunk.source, number, chunk.unterminated and number == last, keys)
            if obj is None:
                verdicts.blank += 1
                continue
            if isinstance(obj, BadRecord):
                verdicts.bad.append(obj)
                if not skip_bad:
                    return
                continue
        problem = check(obj, keys)
        if problem is not None:
            kind, what = problem
            verdicts.bad.append(BadRecord(kind, f"{chunk.source}:{number}: {what}", number))
            if not skip_bad:
                return
            continue
        yield number, row, obj


def count_newlines(data: bytes) -> int:
    """``data.count(b"\\n")``, in C without the GIL when the compiled helpers are there (the reader
    runs beside the encoder threads)."""
    lib = _native.load()
    return lib.llm_count_newlines(data, len(data)) if lib is not None else data.count(b"\n")


def _loads():
    """orjson (several times faster on text-heavy lines) when installed, else the one bounded parser."""
    try:
        import orjson
    except ImportError:
        return jsonfile.loads
    return orjson.loads


def _load_slow(row: bytes, source: str, number: int, is_last_unterminated: bool, keys: Sequence[str]):
    """A line orjson refused, judged by the one bounded parser (:func:`jsonfile.parse_line`, the standard
    library's json, what Megatron-LM parses with, with its costs bounded).

    Returns the object (e.g. a NaN elsewhere in the line, which ``json`` accepts), a BadRecord worded
    as the parser words it, or None for a blank line.
    """
    if not row.strip():
        return None
    place = f"{source}:{number}"
    try:
        obj = jsonfile.parse_line(row, place)
    except jsonfile.BadLine as error:
        if error.kind == "malformed_json" and is_last_unterminated:
            return BadRecord(
                "truncated_line",
                f"{place}: truncated last line (no newline at end of file and not valid "
                f"JSON: {error.what.removeprefix('malformed JSON: ')})",
                number,
            )
        return BadRecord(error.kind, str(error), number)
    if isinstance(obj, dict):
        for key in keys:
            value = obj.get(key)
            if isinstance(value, str):
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:  # a \ud800-style escape: no tokenizer can encode it
                    return BadRecord(
                        "invalid_utf8",
                        f"{place}: key {key!r} holds a lone surrogate escape (not valid Unicode)",
                        number,
                    )
    return obj


def _check(obj, keys: Sequence[str]) -> tuple[str, str] | None:
    if not isinstance(obj, dict):
        return "not_an_object", f"expected a JSON object, found {type(obj).__name__}"
    for key in keys:
        if key not in obj:
            have = ", ".join(list(obj)[:8])
            return "missing_key", f"missing key {key!r} (keys: {have or 'none'}; choose with --json-keys)"
        value = obj[key]
        if not isinstance(value, str):
            shown = "null" if value is None else type(value).__name__
            return "not_a_string", f"key {key!r} is {shown}, expected a string"
    return None


class _HashingReader:
    """Reads a binary stream in blocks while counting and hashing the raw (compressed) bytes."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.sha256 = hashlib.sha256()
        self.size = 0

    def blocks(self, size: int = READ_BLOCK) -> Iterator[bytes]:
        while True:
            block = self.stream.read(size)
            if not block:
                return
            self.sha256.update(block)
            self.size += len(block)
            yield block


class _Truncated(Exception):
    pass


def _decompress(blocks: Iterator[bytes], first: bytes) -> Iterator[bytes]:
    """Plain, gzip (multi-member) or zstd (multi-frame) by magic bytes; _Truncated if the stream ends early."""
    if first.startswith(GZIP_MAGIC):
        new = lambda: zlib.decompressobj(wbits=31)  # noqa: E731
    elif first.startswith(ZSTD_MAGIC):
        import zstandard

        new = zstandard.ZstdDecompressor().decompressobj
    else:
        yield first
        yield from blocks
        return
    decoder, done = new(), False
    pending = first
    while True:
        while pending:
            try:
                out = decoder.decompress(pending)
            except Exception as error:  # noqa: BLE001 - zlib.error, zstandard.ZstdError
                raise _Truncated(f"corrupt compressed data ({error})") from None
            if out:
                yield out
            done = decoder.eof
            pending = decoder.unused_data if done else b""
            if done and pending:
                decoder, done = new(), False  # the next gzip member / zstd frame
        pending = next(blocks, None)
        if pending is None:
            break
    if not done:
        raise _Truncated("compressed stream ends early (truncated download?)")


class JsonlSource:
    """A :class:`~llmtools.prep.sources.DocumentSource` over JSONL files (read sequentially, in order)."""

    def __init__(
        self, inputs: Sequence[str], skip_bad: bool = False, chunk_bytes: int = READ_BLOCK, stdin=None
    ) -> None:
        self.paths = expand_inputs(inputs)
        self.skip_bad = skip_bad
        self.chunk_bytes = max(1, int(chunk_bytes))
        self.stdin = stdin
        self.skipped: dict[str, int] = {}
        self._inputs: list[dict] = []

    @property
    def total_bytes(self) -> int | None:
        if STDIN in self.paths:
            return None
        total = 0
        for path in self.paths:
            if not stat.S_ISREG(os.stat(path).st_mode):
                # a pipe or FIFO (`<(cat a.jsonl)`) can be read once only, by the reader: never peeked at
                return None
            with open(path, "rb") as handle:
                head = handle.read(4)
            if head.startswith(GZIP_MAGIC) or head.startswith(ZSTD_MAGIC):
                return None  # the decompressed size is not known in advance
            total += os.path.getsize(path)
        return total

    def inputs(self) -> list[dict]:
        return list(self._inputs)

    def _problem(self, kind: str, message: str) -> None:
        if not self.skip_bad:
            raise InputError(message)
        self.skipped[kind] = self.skipped.get(kind, 0) + 1

    def batches(self) -> Iterator[JsonlChunk]:
        self._inputs = []
        for path in self.paths:
            yield from self._file_chunks(path)

    def _file_chunks(self, path: str) -> Iterator[JsonlChunk]:
        label = STDIN_LABEL if path == STDIN else path
        if path == STDIN:
            stream, close = (self.stdin or stdin_binary()), False
        else:
            stream, close = open(path, "rb"), True  # noqa: SIM115 - closed below, generator may stop early
        reader = _HashingReader(stream)
        try:
            blocks = reader.blocks(self.chunk_bytes)
            first = next(blocks, b"")
            if not first:
                self._problem("empty_file", f"{label}: empty file (0 bytes, no JSON lines)")
            else:
                yield from self._chunks(label, _decompress(blocks, first))
        finally:
            if close:
                stream.close()
        self._inputs.append(
            {
                "path": label if path == STDIN else str(Path(path)),
                "size": reader.size,
                "sha256": reader.sha256.hexdigest(),
            }
        )

    def _chunks(self, label: str, data: Iterator[bytes]) -> Iterator[JsonlChunk]:
        line = 1
        carry: list[bytes] = []  # the start of a line that has not ended yet, joined once when it does
        carried = 0
        skipping = False  # inside a line past MAX_LINE_BYTES (skip_bad): dropped up to its newline
        try:
            for block in data:
                if skipping:
                    first = block.find(b"\n")
                    if first < 0:
                        continue
                    block, line, skipping = block[first + 1 :], line + 1, False
                cut = block.rfind(b"\n")
                # Only a line that spans blocks is checked against the bound, as it grows: a read block is far
                # smaller than the bound, so a line inside one block is always within it.
                ends = block.find(b"\n") + 1 if carry and cut >= 0 else 0  # where a carried line ends
                if (carry or cut < 0) and carried + (ends or len(block)) > MAX_LINE_BYTES:
                    self._problem("line_too_long", f"{label}:{line}: a line longer than {MAX_LINE_BYTES:,} bytes "
                                  "(a file without newlines?)")  # fmt: skip
                    carry, carried = [], 0
                    if cut < 0:
                        skipping = True
                        continue
                    block, line = block[ends:], line + 1
                    cut = block.rfind(b"\n")
                if cut < 0:
                    if block:
                        carry.append(block)
                        carried += len(block)
                    continue
                # One copy of the block per chunk (not two): the slice is a view until the join copies it.
                chunk = b"".join([*carry, memoryview(block)[: cut + 1]]) if carry else block[: cut + 1]
                rest = block[cut + 1 :]
                carry, carried = ([rest] if rest else []), len(rest)
                newlines = count_newlines(chunk)
                yield JsonlChunk(label, line, chunk, newlines=newlines)
                line += newlines
        except _Truncated as error:
            self._problem("truncated_file", f"{label}:{line}: {error}")
            return  # skip_bad: what came before the damage is kept, the partial tail is not
        if skipping:
            return
        if carry:
            yield JsonlChunk(label, line, b"".join(carry), unterminated=True)
        elif line == 1:
            self._problem("empty_file", f"{label}: empty file (no JSON lines after decompression)")
