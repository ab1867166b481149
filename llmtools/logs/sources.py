"""Reading log files as complete lines: plain, ``.gz``, ``.zst`` or ``-`` (stdin), live or finished.

A :class:`Tailer` hands out only newline-terminated lines together with the byte offset just past
them, so whoever converts them can remember exactly how far it got (idempotence) and a line a
writer is still writing (or died writing: a torn last line) is never mistaken for a complete one.
For live files it notices rotation (the path now names another inode) and truncation (the file
shrank below our offset, or the last bytes read are no longer there: cut and written again between
two looks) and carries on with the new content.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

from llmtools.errors import InputError, where
from llmtools.fsutil import stdin_binary

CHUNK = 1 << 20
FINGERPRINT_BYTES = 4096
RECENT_BYTES = 64  # compared at every look at a live file
MAX_LINE = 1 << 20
"""Longest line kept whole. No trainer prints a metrics line this long; a longer one is handed on cut to
this length (it parses as no known format), so a file without newlines costs neither memory nor time
(reading on would copy the growing line again for every chunk)."""
SNIFF_BINARY = 8192
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def display_name(path: str) -> str:
    return "<stdin>" if path == "-" else str(path)


def compression_of(path: str) -> str | None:
    """``gzip``/``zstd`` by magic bytes (not by name: rotated logs are often renamed), else None."""
    if path == "-":
        return None
    try:
        with open(path, "rb") as handle:
            magic = handle.read(4)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a log file") from None
    if magic.startswith(_GZIP_MAGIC):
        return "gzip"
    if magic.startswith(_ZSTD_MAGIC):
        return "zstd"
    return None


def open_stream(path: str):
    """A binary stream of the (decompressed) log. Caller closes it (stdin is left open)."""
    if path == "-":
        return stdin_binary()
    kind = compression_of(path)
    if kind == "gzip":
        return gzip.open(path, "rb")
    if kind == "zstd":
        return _ZstdStream(open(path, "rb"))  # noqa: SIM115 - closed by the caller
    return open(path, "rb", buffering=0)


class _ZstdStream(io.RawIOBase):
    """A zstd file (any number of frames) as a readable stream that raises EOFError when the last frame
    is cut short (zstandard's own stream reader returns a truncated file's data as if it were all)."""

    def __init__(self, raw) -> None:
        import zstandard

        self._raw = raw
        self._new = zstandard.ZstdDecompressor().decompressobj
        self._decoder = self._new()
        self._buffer = b""
        self._done = False

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._raw.fileno()

    def read(self, size: int = -1) -> bytes:
        size = CHUNK if size is None or size < 0 else size
        while not self._buffer and not self._done:
            block = self._raw.read(CHUNK)
            if not block:
                self._done = True
                if not self._decoder.eof and self._started:
                    raise EOFError("zstd stream ends before the end of its last frame")
                break
            self._started = True
            pending = block
            while pending:
                if self._decoder.eof:
                    self._decoder = self._new()  # the next frame
                self._buffer += self._decoder.decompress(pending)
                pending = self._decoder.unused_data if self._decoder.eof else b""
        out, self._buffer = self._buffer[:size], self._buffer[size:]
        return out

    read1 = read
    _started = False

    def close(self) -> None:
        self._raw.close()
        super().close()


def looks_binary(sample: bytes) -> bool:
    """NUL bytes or mostly undecodable text: not a log anyone printed."""
    if not sample:
        return False
    if b"\x00" in sample:
        return True
    text = sample.decode("utf-8", errors="replace")
    return text.count("\ufffd") > max(8, len(text) // 20)


def fingerprint(handle, offset: int) -> dict:
    """Hashes of the first and the last few KiB before ``offset``: they identify the content read."""
    head_len = min(offset, FINGERPRINT_BYTES)
    tail_start = max(0, offset - FINGERPRINT_BYTES)
    head = os.pread(handle.fileno(), head_len, 0)
    tail = os.pread(handle.fileno(), offset - tail_start, tail_start)
    return {
        "head": hashlib.sha256(head).hexdigest(),
        "head_len": head_len,
        "tail": hashlib.sha256(tail).hexdigest(),
        "tail_start": tail_start,
    }


def same_content(path: str, saved: dict) -> bool:
    """Does the file still start with what we read last time (it only grew)?"""
    try:
        with open(path, "rb", buffering=0) as handle:
            size = os.fstat(handle.fileno()).st_size
            offset = int(saved.get("offset", 0))
            if size < offset:
                return False
            return fingerprint(handle, offset) == {
                k: saved.get(k) for k in ("head", "head_len", "tail", "tail_start")
            }
    except OSError:
        return False


class Tailer:
    """Complete lines of one log, from a byte offset on; ``poll()`` again for what was added since.

    Yields ``(line_number, end_offset, raw_line_without_newline)``. ``pending`` holds an unfinished
    last line. ``live`` (follow mode) enables rotation and truncation handling on plain files.
    """

    def __init__(self, path: str, offset: int = 0, line: int = 0, live: bool = False) -> None:
        self.path = path
        self.name = display_name(path)
        self.compressed = compression_of(path) is not None
        self.seekable = path != "-" and not self.compressed
        self.live = live and self.seekable
        self.offset = offset
        self.line = line
        self.pending = b""
        self.skipping = False  # inside an overlong line, dropping bytes up to its newline
        self._skipped = 0
        self.rotations = 0
        self.truncations = 0
        self._recent = b""  # the last bytes read from a live file, to tell appended from replaced
        self.eof = False  # a stream that cannot grow (stdin, compressed) reached its end
        self._stream = open_stream(path)
        self._inode = os.fstat(self._stream.fileno()).st_ino if self.seekable else None
        if offset and self.seekable:
            self._stream.seek(offset)
        elif offset:
            self._skip(offset)

    def _skip(self, offset: int) -> None:
        remaining = offset
        while remaining > 0:
            chunk = self._stream.read(min(CHUNK, remaining))
            if not chunk:
                break
            remaining -= len(chunk)

    def _read(self) -> bytes:
        stream = self._stream
        try:
            if self.path == "-" and hasattr(stream, "read1"):
                return stream.read1(CHUNK)  # a pipe: take what is there, don't wait for a full chunk
            return stream.read(CHUNK)
        except (EOFError, OSError, zlib.error) as error:
            if not self.compressed or isinstance(error, InterruptedError):
                raise
            raise InputError(
                f"{self.name}: corrupt or truncated compressed data after line {self.line} ({error})"
            ) from None
        except Exception as error:  # zstandard.ZstdError is not an OSError
            if not self.compressed or type(error).__name__ != "ZstdError":
                raise
            raise InputError(
                f"{self.name}: corrupt or truncated compressed data after line {self.line} ({error})"
            ) from None

    def poll(self) -> Iterator[tuple[int, int, bytes]]:
        """Every complete line available now."""
        if self.live and self._replaced():
            self._start_over()  # before reading on: what follows our offset is not a continuation
        while True:
            chunk = self._read()
            if not chunk:
                self.eof = not self.live
                break
            if self.live:
                self._recent = (self._recent + chunk[-RECENT_BYTES:])[-RECENT_BYTES:]  # no copy of the chunk
            extra = 0  # bytes of an overlong line that were skipped: they count in its end offset
            if self.skipping:
                cut = chunk.find(b"\n")
                if cut < 0:
                    self._skipped += len(chunk)
                    continue
                extra, self._skipped, self.skipping = self._skipped + cut, 0, False
                chunk = chunk[cut:]
            data = self.pending + chunk if self.pending else chunk
            start = 0
            end = data.find(b"\n")
            offset = self.offset
            line = self.line
            while end >= 0:
                line += 1
                raw = data[start:end]
                offset += end + 1 - start + extra
                extra = 0
                self.line, self.offset = line, offset
                yield line, offset, raw
                start = end + 1
                end = data.find(b"\n", start)
            self.pending = data[start:]
            if len(self.pending) > MAX_LINE:
                self._overlong()
        if self.live:
            self._check_rotation()

    def _overlong(self) -> None:
        """A line past MAX_LINE bytes: binary data is refused at once; text is cut to MAX_LINE and the
        rest of the line skipped as it is read."""
        if looks_binary(self.pending[:SNIFF_BINARY]):
            raise InputError(
                f"{where(self.name, offset=self.offset)}: binary data, not a text log "
                f"(more than {MAX_LINE} bytes without a newline, with NUL or undecodable bytes)"
            )
        self._skipped = len(self.pending) - MAX_LINE
        self.pending = self.pending[:MAX_LINE]
        self.skipping = True

    def _check_rotation(self) -> None:
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return  # between a rename and the new file's creation: keep the old one, look again later
        if stat.st_ino != self._inode:
            # Rotated: the old file was read to its end above; the path is a new file now.
            self._stream.close()
            self._stream = open(self.path, "rb", buffering=0)
            self._inode = os.fstat(self._stream.fileno()).st_ino
            self._at_start()
            self.rotations += 1
        elif stat.st_size < self.offset:
            self._start_over()

    def _start_over(self) -> None:
        """Truncated in place (copytruncate): carry on at the beginning of the new content."""
        self._stream.seek(0)
        self._at_start()
        self.truncations += 1

    def _at_start(self) -> None:
        self.offset = self.line = 0
        self.pending, self._recent = b"", b""
        self.skipping, self._skipped = False, 0

    def _replaced(self) -> bool:
        """Cut and written again beyond where we were, all between two looks (a slow reader, a fast
        writer): the size cannot tell, the last bytes read can."""
        if not self._recent:
            return False
        end = self._stream.tell()
        return os.pread(self._stream.fileno(), len(self._recent), end - len(self._recent)) != self._recent

    def fingerprint(self, offset: int | None = None) -> dict | None:
        """Hashes of the current file's bytes before ``offset`` (default: all read); None if unseekable."""
        if not self.seekable:
            return None
        return fingerprint(self._stream, self.offset if offset is None else offset)

    def inode(self) -> int | None:
        return self._inode

    def close(self) -> None:
        if self._stream is not getattr(sys.stdin, "buffer", None):
            self._stream.close()

    def __enter__(self) -> Tailer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_sample(path: str, size: int = 8192) -> bytes:
    """The first bytes of a (decompressed) log, for sniffing. Not for stdin."""
    with open_stream(path) as stream:
        if isinstance(stream, io.RawIOBase):
            return stream.read(size) or b""
        return stream.read(size)


def check_readable(path: str) -> None:
    if path != "-" and not Path(path).is_file():
        if Path(path).exists():
            raise InputError(f"{path}: not a regular file")
        raise InputError(f"{path}: no such file")
