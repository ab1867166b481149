"""Records out of one log: pick the format (sniffing the first lines), parse, count every line.

Lines that are not metrics are counted and skipped, never fatal. A binary file is refused with a
one-line message; a torn last line (no newline: the writer died mid-write) is reported, and parsed
only when asked (``summary``/``plot`` take it if it parses, ``tb`` leaves it until it is complete
so it is never converted half-written).
"""

from __future__ import annotations

from collections.abc import Iterator

from llmtools.errors import InputError, UsageError, where
from llmtools.logs.parsers import FORMATS, GenericParser, Parser, detect_format, make_parser
from llmtools.logs.records import Counts, Record
from llmtools.logs.sources import Tailer, looks_binary

SNIFF_LINES = 2000
SNIFF_BYTES = 1 << 20
SAMPLE_BYTES = 8192


def check_seq_length(seq_length: int | None) -> None:
    if seq_length is not None and seq_length <= 0:
        raise UsageError(f"--seq-length must be a positive number of tokens, got {seq_length}")


MAX_STEP = 2**63 - 1  # TensorBoard stores steps as int64


def checked(parsed: tuple[str, list[Record]]) -> tuple[str, list[Record]]:
    """A record whose step TensorBoard cannot store (negative, or past int64) makes its line invalid."""
    kind, records = parsed
    for record in records:
        if not 0 <= record.step <= MAX_STEP:
            step = str(record.step)
            shown = step if len(step) < 30 else f"{step[:27]}..."
            return "invalid", [Record("invalid", 0, None, message=f"step {shown} is outside 0..2**63-1")]
    return parsed


class TokensFromSamples(Parser):
    """``--seq-length``: token counts for logs that print only samples (Megatron-LM, DeepSpeed).

    Adds ``consumed_tokens = consumed_samples x L`` and ``tokens_per_s = samples_per_s x L`` where
    the log has the samples figure and not the tokens one (packed fixed-length samples assumed).
    """

    def __init__(self, inner: Parser, seq_length: int) -> None:
        super().__init__()
        self.inner = inner
        self.name = inner.name
        self.seq_length = seq_length

    def detect(self, line: str) -> bool:
        return self.inner.detect(line)

    def state(self) -> dict:
        return self.inner.state()

    def restore(self, state: dict) -> None:
        self.inner.restore(state)

    def parse(self, line: str, number: int) -> tuple[str, list[Record]]:
        kind, records = self.inner.parse(line, number)
        if kind == "train":
            for record in records:
                values = record.values
                if "consumed_samples" in values and "consumed_tokens" not in values:
                    values["consumed_tokens"] = values["consumed_samples"] * self.seq_length
                if "samples_per_s" in values and "tokens_per_s" not in values:
                    values["tokens_per_s"] = values["samples_per_s"] * self.seq_length
        return kind, records


class LogReader:
    """Parses one log incrementally; ``poll()`` yields the records of the complete lines now there.

    ``offset``/``line`` tell how far the records handed out so far reach (what a converter commits).
    """

    def __init__(
        self,
        path: str,
        fmt: str = "auto",
        pattern: str | None = None,
        offset: int = 0,
        line: int = 0,
        live: bool = False,
        parser_state: dict | None = None,
        seq_length: int | None = None,
    ) -> None:
        if fmt not in FORMATS:
            raise InputError(f"--format: unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
        if pattern and fmt == "auto":
            fmt = "generic"  # --pattern means "my own format"
        self.path = path
        self.tailer = Tailer(path, offset=offset, line=line, live=live)
        self.name = self.tailer.name
        self.fmt = None if fmt == "auto" else fmt
        check_seq_length(seq_length)
        self.seq_length = seq_length
        self.parser: Parser | None = self._wrap(make_parser(fmt, pattern)) if self.fmt else None
        if self.parser is not None and parser_state:
            self.parser.restore(parser_state)
        self.counts = Counts()
        self.offset = offset
        self.line = line
        self._held: list[tuple[int, int, str]] = []  # lines read while the format is still unknown
        self._held_bytes = 0
        self._sample = b""
        self._lazy = False  # sniff window exhausted without a match: detect line by line

    # -- format selection ------------------------------------------------------------------
    def _wrap(self, parser: Parser) -> Parser:
        return TokensFromSamples(parser, self.seq_length) if self.seq_length else parser

    def _choose(self, fmt: str) -> None:
        self.fmt = fmt
        self.parser = self._wrap(make_parser(fmt))

    def _release_held(self) -> Iterator[Record]:
        held, self._held, self._held_bytes = self._held, [], 0
        for number, end, text in held:
            yield from self._parse(number, end, text)

    def _undetected(self, number: int, end: int, text: str) -> Iterator[Record]:
        if self._lazy:
            fmt = detect_format([text], allow_generic=False)
            if fmt is None:
                self._count(number, end, "other")
                return
            self._choose(fmt)
            yield from self._parse(number, end, text)
            return
        self._held.append((number, end, text))
        self._held_bytes += len(text)
        if len(self._held) >= SNIFF_LINES or self._held_bytes >= SNIFF_BYTES:
            yield from self._decide()

    def _decide(self) -> Iterator[Record]:
        fmt = detect_format([text for _, _, text in self._held])
        if fmt is None:
            self._check_binary()
            self._lazy = True
            for number, end, _ in self._held:
                self._count(number, end, "other")
            self._held, self._held_bytes = [], 0
            return
        self._choose(fmt)
        yield from self._release_held()

    def _check_binary(self) -> None:
        if looks_binary(self._sample):
            raise InputError(
                f"{self.name}: binary data, not a text training log "
                f"(NUL or undecodable bytes in its first {len(self._sample)} bytes; no line of any known format)"
            )

    # -- parsing ---------------------------------------------------------------------------
    def _count(self, number: int, end: int, kind: str) -> None:
        self.counts.lines += 1
        self.counts.by_kind[kind] += 1
        self.offset, self.line = end, number

    def _parse(self, number: int, end: int, text: str) -> Iterator[Record]:
        kind, records = checked(self.parser.parse(text, number))
        self.counts.lines += 1
        self.counts.by_kind[kind] += 1
        self.offset, self.line = end, number
        if kind == "invalid":
            self.counts.problem(f"{where(self.name, number)}: {records[0].message}")
        else:
            yield from records

    def poll(self) -> Iterator[Record]:
        """Records of every complete line available now."""
        by_kind = self.counts.by_kind
        for number, end, raw in self.tailer.poll():
            if len(self._sample) < SAMPLE_BYTES:
                self._sample += raw[: SAMPLE_BYTES - len(self._sample)] + b"\n"
            text = raw.decode("utf-8", "replace")
            if text.endswith("\r"):
                text = text[:-1]
            parser = self.parser
            if parser is None:
                yield from self._undetected(number, end, text)
                continue
            # the hot path, inlined (_parse): a million lines should not cost a million generators
            kind, records = checked(parser.parse(text, number))
            self.counts.lines += 1
            by_kind[kind] += 1
            self.offset, self.line = end, number
            if kind == "invalid":
                self.counts.problem(f"{where(self.name, number)}: {records[0].message}")
            else:
                yield from records

    def settle(self) -> Iterator[Record]:
        """At a pause (end of input, or nothing new while following): decide on what was sniffed."""
        if self.parser is None and self._held:
            yield from self._decide()

    def finish(self, take_torn: bool) -> Iterator[Record]:
        """End of input: decide the format if still open; deal with an unterminated last line."""
        pending = self.tailer.pending
        if pending and len(self._sample) < SAMPLE_BYTES:
            self._sample += pending[: SAMPLE_BYTES - len(self._sample)]
        yield from self.settle()
        if self.parser is None and looks_binary(self._sample):
            self._check_binary()
        if not pending:
            return
        number = self.tailer.line + 1
        self.counts.lines += 1
        text = pending.decode("utf-8", "replace")
        parser = self.parser
        if parser is None:
            fmt = detect_format([text], allow_generic=False)
            parser = make_parser(fmt) if fmt else None
        kind, records = checked(parser.parse(text, number)) if parser else ("other", [])
        if take_torn and kind in ("train", "eval", "event"):
            self.counts.by_kind[kind] += 1
            yield from records
            return
        self.counts.by_kind["torn"] += 1
        if take_torn:
            note = "skipped"
        else:
            note = "left unconverted until it is complete"
        self.counts.problem(
            f"{where(self.name, number)}: last line has no newline ({len(pending)} bytes; "
            f"a writer stopped mid-line?): {note}"
        )

    def close(self) -> None:
        self.tailer.close()

    def __enter__(self) -> LogReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_log(
    path: str, fmt: str = "auto", pattern: str | None = None
) -> tuple[list[Record], Counts, str | None]:
    """All records of a finished log (small logs, tests). Streams internally."""
    with LogReader(path, fmt, pattern) as reader:
        records = list(reader.poll())
        records.extend(reader.finish(take_torn=True))
        return records, reader.counts, reader.fmt


__all__ = ["LogReader", "read_log", "GenericParser"]
