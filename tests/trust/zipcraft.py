"""Write zip archives record by record, in the layout ``torch.save`` uses (stored records, 64-byte aligned
data through an ``FB`` padding field, a data descriptor after each record, zip64 end records), with
whatever names, order and extra records a test asks for: archives that different zip readers may read
differently.
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from pathlib import Path

_ALIGN = 64


def records_of(pt_file: Path) -> list[tuple[str, bytes]]:
    """The records of a ``torch.save`` file, in order (read with Python's zipfile: the file is ours)."""
    with zipfile.ZipFile(pt_file) as archive:
        return [(info.filename, archive.read(info)) for info in archive.infolist()]


def deflated(prefix: bytes, zeros: int, suffix: bytes) -> tuple[bytes, int, int]:
    """(raw deflate stream, size, crc32) of ``prefix + bytes(zeros) + suffix``, made in chunks."""
    engine = zlib.compressobj(9, zlib.DEFLATED, -15)
    parts, crc = [engine.compress(prefix)], zlib.crc32(prefix)
    chunk, left = bytes(1 << 24), zeros
    while left:
        piece = chunk[: min(left, len(chunk))]
        parts.append(engine.compress(piece))
        crc = zlib.crc32(piece, crc)
        left -= len(piece)
    parts += [engine.compress(suffix), engine.flush()]
    return b"".join(parts), len(prefix) + zeros + len(suffix), zlib.crc32(suffix, crc)


def write(
    path: Path,
    records: list[tuple[str, bytes]],
    compress: set[str] = frozenset(),
    raw: dict[str, tuple[bytes, int, int]] | None = None,
) -> None:
    """``records`` as a zip in torch's layout; names in ``compress`` are deflated instead of stored, and
    names in ``raw`` get the given (deflate stream, declared size, crc) in place of their data."""
    out = bytearray()
    central = bytearray()
    raw = raw or {}
    for name, data in records:
        raw_name = name.encode()
        method, payload, size, crc = 0, data, len(data), zlib.crc32(data)
        if name in compress:
            method, payload = 8, zlib.compress(data)[2:-4]  # raw deflate
        if name in raw:
            method, (payload, size, crc) = 8, raw[name]
        offset = len(out)
        header = 30 + len(raw_name) + 4
        pad = (-(offset + header)) % _ALIGN
        extra = b"FB" + struct.pack("<H", pad) + b"\0" * pad
        out += struct.pack(
            "<4sHHHHHIIIHH", b"PK\x03\x04", 45, 0x808, method, 0, 0x21, 0, 0, 0, len(raw_name), len(extra)
        )
        out += raw_name + extra + payload
        out += struct.pack("<4sIII", b"PK\x07\x08", crc, len(payload), size)
        central += struct.pack(
            "<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 798, 45, 0x808, method, 0, 0x21, crc, len(payload), size,
            len(raw_name), 0, 0, 0, 0, 0, offset,
        )  # fmt: skip
        central += raw_name
    cd_offset = len(out)
    out += central
    z64 = len(out)
    count = len(records)
    out += struct.pack(
        "<4sQHHIIQQQQ", b"PK\x06\x06", 44, 798, 45, 0, 0, count, count, len(central), cd_offset
    )
    out += struct.pack("<4sIQI", b"PK\x06\x07", 0, z64, 1)
    out += struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, count, count, len(central), cd_offset, 0)
    path.write_bytes(bytes(out))
