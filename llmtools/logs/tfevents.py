"""TensorBoard event files, written by hand: record framing and the few protobuf messages we need.

A ``*.tfevents.*`` file is a sequence of records ``<u64 length><u32 masked crc32c(length)><payload>
<u32 masked crc32c(payload)>``, each payload a serialized ``tensorboard.Event``. We encode the
handful of fields we use directly (wall_time, step, file_version, summary values with a float
``simple_value`` or a string tensor for the text plugin) instead of building protobuf objects and
calling ``SummaryWriter.add_scalar`` once per scalar: all scalars of one log record share one
Event, tag bytes are encoded once, and nothing but ``struct`` runs per value. That is what makes
``llm-log tb`` many times faster than the naive loop (see ``benchmarks/bench_log.py``); the
files read back with TensorBoard's own ``EventAccumulator`` (tests/logs/test_tfevents.py).

No torch, no tensorboard import here: a reader-less, dependency-free writer.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import struct
import time
from pathlib import Path

from llmtools.fsutil import disk_full_guard

# ---------------------------------------------------------------------------------------------
# CRC-32C (Castagnoli), as TFRecord framing requires. A C implementation is used when one is
# installed (google-crc32c or crc32c); otherwise a table-driven pure-Python loop, which is fast
# enough because we checksum one payload per log record, not one per scalar.

_POLY = 0x82F63B78


def _make_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ _POLY if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _make_table()


def _crc32c_py(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _pick_crc32c():
    try:  # optional accelerators; never required
        import google_crc32c  # type: ignore[import-not-found]

        if google_crc32c.implementation == "c":
            return google_crc32c.value, "google-crc32c"
    except ImportError:
        pass
    try:
        import crc32c as _crc32c  # type: ignore[import-not-found]

        return _crc32c.crc32c, "crc32c"
    except ImportError:
        pass
    return _crc32c_py, "python"


crc32c, CRC32C_IMPL = _pick_crc32c()


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC: rotate right by 15 and add a constant (so CRCs of CRCs stay distinct)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_header_cache: dict[int, bytes] = {}


def _header(length: int) -> bytes:
    """Length and its masked CRC (cached: payload lengths repeat a lot)."""
    header = _header_cache.get(length)
    if header is None:
        raw = _U64.pack(length)
        header = raw + _U32.pack(masked_crc32c(raw))
        if len(_header_cache) < 65536:
            _header_cache[length] = header
    return header


def frame(payload: bytes) -> bytes:
    """One TFRecord: length, its masked CRC, the payload, the payload's masked CRC."""
    return b"".join((_header(len(payload)), payload, _U32.pack(masked_crc32c(payload))))


def _zero_step_inverse(state: int) -> int:
    """The register before one zero byte, given the register after it (the step is a bijection)."""
    index = _TOP_BYTE_INDEX[state >> 24]  # the top byte of T[i] identifies i
    return (((state ^ _TABLE[index]) << 8) & 0xFFFFFFFF) | index


_TOP_BYTE_INDEX = {entry >> 24: index for index, entry in enumerate(_TABLE)}
_pre_states = [0xFFFFFFFF]  # _pre_states[n]: initial register that n zero bytes turn into 0xFFFFFFFF


def _pre_state(zeros: int) -> int:
    while len(_pre_states) <= zeros:
        _pre_states.append(_zero_step_inverse(_pre_states[-1]))
    return _pre_states[zeros]


def _slicing_tables():
    import numpy as np

    tables = [list(_TABLE)]
    for _ in range(3):
        prev = tables[-1]
        tables.append([(entry >> 8) ^ _TABLE[entry & 0xFF] for entry in prev])
    return [np.asarray(t, dtype=np.uint32) for t in tables]


_np_tables = None


def _masked_crcs_group(payloads: list[bytes]):
    """Masked CRC-32C of similar-length payloads, vectorized across payloads (slicing-by-4).

    Every payload is left-padded with zeros to a common width that is a multiple of 4, and its
    CRC register starts from the state that those zeros turn into the standard 0xFFFFFFFF, so
    padding changes nothing. Then one pass of a dozen numpy operations per 4-byte column serves
    all payloads at once, instead of a Python loop per byte.
    """
    import numpy as np

    global _np_tables
    if _np_tables is None:
        _np_tables = _slicing_tables()
    t0, t1, t2, t3 = _np_tables
    width = max(map(len, payloads))
    width += -width % 4
    pads = [width - len(p) for p in payloads]
    data = b"".join(b"\0" * pad + payload for pad, payload in zip(pads, payloads, strict=True))
    words = np.frombuffer(data, dtype="<u4").reshape(len(payloads), width // 4).T.copy()
    crc = np.fromiter((_pre_state(pad) for pad in pads), dtype=np.uint32, count=len(payloads))
    for column in words:
        x = crc ^ column
        crc = t3[x & 0xFF] ^ t2[(x >> 8) & 0xFF] ^ t1[(x >> 16) & 0xFF] ^ t0[x >> 24]
    crc ^= np.uint32(0xFFFFFFFF)
    return ((crc >> 15) | (crc << 17)) + np.uint32(0xA282EAD8)  # uint32 arithmetic wraps


def _masked_crcs_numpy(payloads: list[bytes]) -> bytes:
    """Masked CRCs of any payloads, as little-endian u32 bytes: groups of similar length, batched."""
    import numpy as np

    lengths = [len(p) for p in payloads]
    order = sorted(range(len(payloads)), key=lengths.__getitem__)
    out = np.empty(len(payloads), dtype=np.uint32)
    start = 0
    while start < len(order):
        limit = lengths[order[start]] * 5 // 4 + 16  # keep padding waste under ~25%
        stop = start + 1
        while stop < len(order) and lengths[order[stop]] <= limit:
            stop += 1
        group = order[start:stop]
        out[group] = _masked_crcs_group([payloads[i] for i in group])
        start = stop
    return out.astype("<u4").tobytes()


def frame_many(payloads: list[bytes]) -> bytes:
    """Frame many payloads as consecutive TFRecords (the fast path of :class:`EventFileWriter`)."""
    if not payloads:
        return b""
    if CRC32C_IMPL != "python" or len(payloads) < 16:
        return b"".join(map(frame, payloads))
    crcs = _masked_crcs_numpy(payloads)
    parts = []
    append = parts.append
    for index, payload in enumerate(payloads):
        append(_header(len(payload)))
        append(payload)
        append(crcs[4 * index : 4 * index + 4])
    return b"".join(parts)


# ---------------------------------------------------------------------------------------------
# Protobuf wire encoding of the messages we write (field numbers from tensorboard/compat/proto:
# event.proto, summary.proto, tensor.proto).


def _varint(value: int) -> bytes:
    value &= 0xFFFFFFFFFFFFFFFF  # int64 negatives are ten-byte two's complement varints
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field_bytes(number: int, payload: bytes) -> bytes:
    return _varint((number << 3) | 2) + _varint(len(payload)) + payload


_FLOAT = struct.Struct("<f")
_DOUBLE = struct.Struct("<d")
_WALL_TIME_KEY = b"\x09"  # Event.wall_time = 1, fixed64
_STEP_KEY = b"\x10"  # Event.step = 2, varint
_SUMMARY_KEY = b"\x2a"  # Event.summary = 5, length-delimited
_SIMPLE_VALUE_KEY = b"\x15"  # Summary.Value.simple_value = 2, fixed32
_VALUE_KEY = b"\x0a"  # Summary.value = 1, length-delimited
_TEXT_METADATA = _field_bytes(9, _field_bytes(1, _field_bytes(1, b"text")))  # plugin_data{plugin_name}
_DT_STRING = b"\x08\x07"  # TensorProto.dtype = DT_STRING (7)

_scalar_heads: dict[str, bytes] = {}


def _scalar_head(tag: str) -> bytes:
    """Everything of a scalar Summary.Value before its 4 float bytes (cached per tag)."""
    tag_field = _field_bytes(1, tag.encode("utf-8"))
    body_length = len(tag_field) + 5  # + simple_value key byte + 4-byte float
    head = _VALUE_KEY + _varint(body_length) + tag_field + _SIMPLE_VALUE_KEY
    if len(_scalar_heads) < 100_000:  # a log has a few dozen distinct tags; bound it anyway
        _scalar_heads[tag] = head
    return head


def scalar_value(tag: str, value: float) -> bytes:
    """An encoded Summary.Value with a float32 simple_value (what ``add_scalar`` writes)."""
    head = _scalar_heads.get(tag) or _scalar_head(tag)
    try:
        return head + _FLOAT.pack(value)
    except OverflowError:  # beyond float32 range: TensorBoard would show inf anyway
        return head + _FLOAT.pack(math.copysign(math.inf, value))


_layouts: dict[tuple, tuple] = {}


def scalar_values(prefix: str, values: dict[str, float]) -> bytes:
    """Encoded Summary.Values for ``{name: value}`` under tags ``prefix + name`` (the hot path).

    Records of one log nearly always carry the same names in the same order, so for each such
    layout we build once a ``struct.Struct`` that lays out every tag head (as a fixed ``Ns`` field)
    followed by its float: encoding a record is then one slice assignment and one ``pack`` call.
    """
    key = (prefix, *values)
    layout = _layouts.get(key)
    if layout is None:
        heads = [_scalar_heads.get(prefix + name) or _scalar_head(prefix + name) for name in values]
        packer = struct.Struct("<" + "".join(f"{len(head)}sf" for head in heads))
        template: list = [None] * (2 * len(heads))
        template[0::2] = heads
        layout = (packer.pack, template)
        if len(_layouts) < 10_000:
            _layouts[key] = layout
    pack, template = layout
    args = template.copy()
    args[1::2] = values.values()
    try:
        return pack(*args)
    except (OverflowError, struct.error):  # beyond float32 range (or not a number): the careful path
        return b"".join(scalar_value(prefix + name, value) for name, value in values.items())


def text_value(tag: str, text: str) -> bytes:
    """An encoded Summary.Value holding a scalar string tensor for TensorBoard's text plugin."""
    tensor = _DT_STRING + _field_bytes(8, text.encode("utf-8"))  # string_val = 8
    body = _field_bytes(1, tag.encode("utf-8")) + _TEXT_METADATA + _field_bytes(8, tensor)
    return _VALUE_KEY + _varint(len(body)) + body


_SMALL_VARINTS = [_varint(n) for n in range(1 << 14)]  # steps and lengths below 16384: a lookup


def event(wall_time: float, step: int, values: list[bytes]) -> bytes:
    """An encoded Event carrying a Summary of the given encoded values."""
    summary = b"".join(values) if len(values) != 1 else values[0]
    size = len(summary)
    return b"".join(
        (
            _WALL_TIME_KEY,
            _DOUBLE.pack(wall_time),
            _STEP_KEY,
            _SMALL_VARINTS[step] if 0 <= step < 16384 else _varint(step),
            _SUMMARY_KEY,
            _SMALL_VARINTS[size] if size < 16384 else _varint(size),
            summary,
        )
    )


def file_version_event(wall_time: float) -> bytes:
    """The first event of every file: ``file_version: "brain.Event:2"`` (field 3)."""
    return _WALL_TIME_KEY + _DOUBLE.pack(wall_time) + _field_bytes(3, b"brain.Event:2")


# ---------------------------------------------------------------------------------------------


def new_event_file_name(seq: int = 0, now: float | None = None) -> str:
    """A name TensorBoard recognizes (contains ``tfevents``) and sorts after older files.

    The trailing ``.llmtools`` marks files this tool owns, so it may repair them after a crash.
    """
    stamp = int(time.time() if now is None else now)
    host = socket.gethostname().replace("/", "_") or "localhost"
    return f"events.out.tfevents.{stamp:010d}.{host}.{seq:06d}.llmtools"


class EventFileWriter:
    """Appends framed events to one file; context-managed, buffered, flushed on demand.

    ``size`` is the number of bytes durably in the file after the last :meth:`flush`, which the
    caller records (with what it has converted) so a crash can be repaired exactly.
    """

    def __init__(self, path: str | os.PathLike, buffer_bytes: int = 1 << 20) -> None:
        self.path = Path(path)
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._limit = buffer_bytes
        self._handle = None
        self.size = self.path.stat().st_size if self.path.exists() else 0
        self.events = 0

    def __enter__(self) -> EventFileWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        from llmtools.dirfd import append_file

        self._handle = append_file(self.path)  # never through a planted link
        fresh = os.fstat(self._handle.fileno()).st_size == 0
        if fresh:
            self.write(file_version_event(time.time()))
        return self

    def write(self, payload: bytes) -> None:
        """Queue one encoded Event; records are framed in batches (vectorized CRCs)."""
        self._buffer.append(payload)
        self._buffered += len(payload)
        self.events += 1
        if self._buffered >= self._limit:
            self._drain()

    def _drain(self) -> None:
        if self._buffer and self._handle is not None:
            with disk_full_guard(self.path):
                self._handle.write(frame_many(self._buffer))
            self._buffer.clear()
            self._buffered = 0

    def flush(self, durable: bool = False) -> int:
        """Write out everything buffered; returns the file size now on disk."""
        self._drain()
        if self._handle is not None:
            with disk_full_guard(self.path):
                self._handle.flush()
                if durable:
                    os.fsync(self._handle.fileno())
            self.size = self._handle.tell()
        return self.size

    def __exit__(self, *exc) -> None:
        # On failure the buffer is dropped: the caller's state file still names the last size it
        # committed, and the next run truncates anything past it.
        try:
            if exc[0] is None:
                self.flush(durable=True)
        finally:
            if self._handle is not None:
                self._buffer.clear()  # close() must not try to write what a full disk refused
                with contextlib.suppress(OSError):
                    self._handle.close()
                self._handle = None
