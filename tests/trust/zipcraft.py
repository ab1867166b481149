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
    attributes: dict[str, int] | None = None,
    crcs: dict[str, int] | None = None,
) -> None:
    """``records`` as a zip in torch's layout; names in ``compress`` are deflated instead of stored,
    names in ``raw`` get the given (deflate stream, declared size, crc) in place of their data, names in
    ``attributes`` those external attributes in the central directory (torch writes 0; 0x10 marks a
    folder for MS-DOS, ``0o040755 << 16`` for Unix), names in ``crcs`` that CRC-32 declared in place of
    their data's."""
    out = bytearray()
    central = bytearray()
    raw, attributes, crcs = raw or {}, attributes or {}, crcs or {}
    for name, data in records:
        raw_name = name.encode()
        method, payload, size, crc = 0, data, len(data), zlib.crc32(data)
        if name in compress:
            method, payload = 8, zlib.compress(data)[2:-4]  # raw deflate
        if name in raw:
            method, (payload, size, crc) = 8, raw[name]
        crc = crcs.get(name, crc)
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
            len(raw_name), 0, 0, 0, 0, attributes.get(name, 0), offset,
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


HOSTILE = ("dos-folder", "unix-folder", "folder-entry", "wrong-crc")


def plant(kind: str, pt_file: Path, record: str | None = None) -> str:
    """Rewrite ``pt_file`` (a ``torch.save`` zip) as the hostile archive ``kind`` of :data:`HOSTILE`; return
    the full name of the record it changed. ``record``: which one (a name after ``FOLDER/``); by default
    the largest storage (``wrong-crc``: ``data.pkl``, which every reader reads whole).

    * ``dos-folder`` / ``unix-folder``: the record is marked as a folder in its external attributes;
      miniz (torch's reader) then "extracts" it as nothing and torch hands back an uninitialised buffer
      of the declared size, while the bytes are still in the file for any other reader;
    * ``folder-entry``: an extra empty record named ``FOLDER/data/`` (a folder entry), before the
      storages;
    * ``wrong-crc``: the record's declared CRC-32 is not that of its bytes.
    """
    records = records_of(pt_file)
    folder = records[0][0].split("/", 1)[0]
    if record is None and kind != "wrong-crc":
        storages = [(len(data), name) for name, data in records if name.startswith(f"{folder}/data/")]
        target = max(storages)[1]
    else:
        target = f"{folder}/{record or 'data.pkl'}"
    assert target in dict(records), target
    if kind == "dos-folder":
        write(pt_file, records, attributes={target: 0x10})
    elif kind == "unix-folder":
        write(pt_file, records, attributes={target: 0o040755 << 16})
    elif kind == "folder-entry":
        at = next(i for i, (name, _) in enumerate(records) if name.startswith(f"{folder}/data/"))
        target = f"{folder}/data/"
        write(pt_file, [*records[:at], (target, b""), *records[at:]])
    elif kind == "wrong-crc":
        data = dict(records)[target]
        write(pt_file, records, crcs={target: zlib.crc32(data) ^ 0x5A5A5A5A})
    else:
        raise ValueError(kind)
    return target
