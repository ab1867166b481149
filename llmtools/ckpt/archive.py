"""One reading of a ``torch.save`` zip archive that every zip reader agrees with, or a refusal.

Zip readers disagree on ambiguous archives, and a safety check that reads one record while the loader
reads another checks nothing. torch's reader (miniz, ``PyTorchFileReader``) takes the archive's folder
name from its first entry, looks names up without regard to ASCII case and, among duplicates, finds
whichever its binary search over the sorted names meets; Python's ``zipfile`` is case-sensitive, keeps
the *last* of duplicate names and cuts a name at its first NUL byte. So this module accepts an archive
only when there is nothing to disagree about, with the layout torch itself writes:

* the end-of-central-directory record closes the file (no comment), with torch's zip64 end records or
  without; one disk;
* every name is printable ASCII without ``\\``, empty or dot components, under one folder (the first
  entry's), and unique even with ASCII case ignored; none ends with ``/`` and none is marked as a folder,
  link or special file in its external attributes (torch writes plain files only);
* every record is stored (never compressed: nothing is inflated, so no size can be a bomb), unencrypted,
  and its local header repeats the central directory's name, flags and method (sizes and CRC there or
  in the data descriptor that follows the data);
* records lie back to back from byte 0 in central-directory order, the central directory follows the
  last one and the end records follow it: no gap, no overlap, nothing a reader could find by scanning,
  and every declared size within the file.

:func:`read_index` parses the directory (bounded: at most :data:`MAX_RECORDS` entries, the directory
itself read in one piece no larger than the file) and returns where each record's bytes are and their
declared CRC-32. Nothing else parses the archive: the lazy reader and :func:`llmtools.ckpt.safeload.load`
(which every load of a checkpoint goes through, DeepSpeed's included) read ``data.pkl`` and the storages
from those offsets, and torch is handed those bytes, never the file. A record read whole has its CRC-32
checked as it is read (:func:`read_record`); ``llm-ckpt verify`` checks every record's
(:func:`check_crcs`).
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from llmtools.errors import InputError

MAX_RECORDS = 1 << 20  # a checkpoint holds a few records per tensor storage; a million is far beyond it

_EOCD = struct.Struct("<4sHHHHIIH")
_Z64_LOCATOR = struct.Struct("<4sIQI")
_Z64_EOCD = struct.Struct("<4sQHHIIQQQQ")
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_ZIP64_EXTRA = 0x0001
_PADDING_EXTRA = 0x4246  # "FB": torch's alignment padding
_DESCRIPTOR = 0x08
_UTF8 = 0x800
_MAX32 = 0xFFFFFFFF
_DOS_FOLDER = 0x10  # MS-DOS attribute bit of a folder, in the low byte of the external attributes
_UNIX_TYPE, _UNIX_FILE = 0o170000, 0o100000  # st_mode's file type, in the high 16 bits


class ArchiveError(InputError):
    """The archive is not one that every zip reader reads the same way."""

    def __init__(self, path: str | os.PathLike, where: str, what: str) -> None:
        super().__init__(
            f"{path}{where}: not a readable torch zip file ({what}); llmtools reads only archives that "
            "torch and other zip readers read the same way (docs/trust-checkpoints.md)"
        )

    def __reduce__(self):  # raised in a worker process: arrives in the parent as the same message
        return InputError, (str(self),)


@dataclass(frozen=True)
class Record:
    name: str  # without the archive's folder
    offset: int  # first byte of the record's data in the file
    size: int
    crc: int  # the CRC-32 the directory declares: checked whenever the whole record is read


@dataclass(frozen=True)
class Index:
    path: Path
    folder: str
    records: dict[str, Record]

    def get(self, name: str) -> Record | None:
        return self.records.get(name)


def read_record(index: Index, name: str, limit: int | None = None, handle=None) -> bytes:
    """The bytes of record ``name`` (``FOLDER/`` left out) at the offset the check accepted, their CRC-32
    checked; InputError when it is missing, larger than ``limit`` or not what its directory declares."""
    record = index.get(name)
    if record is None:
        raise InputError(f"{index.path}: no {name} in the archive (not a torch.save file)")
    if limit is not None and record.size > limit:
        raise InputError(f"{index.path}: {name} is {record.size} bytes (at most {limit})")
    own = handle is None
    handle = open(index.path, "rb") if own else handle  # noqa: SIM115 - closed below
    try:
        handle.seek(record.offset)
        data = handle.read(record.size)
    finally:
        if own:
            handle.close()
    if len(data) != record.size:
        raise InputError(f"{index.path}: truncated while it was read")
    check_crc(index, record, zlib.crc32(data))
    return data


def check_crc(index: Index, record: Record, crc: int) -> None:
    """ArchiveError unless ``crc`` (of the record's bytes, as read) is the one its directory declares."""
    if crc != record.crc:
        raise ArchiveError(
            index.path,
            f"@byte {record.offset}",
            f"the bytes of {record.name!r} have CRC-32 {crc:#010x}, the directory declares {record.crc:#010x}",
        )


def check_crcs(index: Index, chunk: int = 16 << 20) -> None:
    """The CRC-32 of every record, read in chunks (``llm-ckpt verify`` reads every byte anyway)."""
    with open(index.path, "rb") as handle:
        for record in sorted(index.records.values(), key=lambda r: r.offset):
            handle.seek(record.offset)
            crc, left = 0, record.size
            while left:
                data = handle.read(min(chunk, left))
                if not data:
                    raise InputError(f"{index.path}: truncated while it was read")
                crc = zlib.crc32(data, crc)
                left -= len(data)
            check_crc(index, record, crc)


def _extras(blob: bytes) -> dict[int, bytes]:
    """Extra fields as {id: data}; a malformed or repeated field is a ValueError."""
    fields: dict[int, bytes] = {}
    at = 0
    while at < len(blob):
        if at + 4 > len(blob):
            raise ValueError("a truncated extra field")
        key, size = struct.unpack_from("<HH", blob, at)
        if at + 4 + size > len(blob) or key in fields:
            raise ValueError("a malformed extra field")
        fields[key] = blob[at + 4 : at + 4 + size]
        at += 4 + size
    return fields


def _zip64_values(data: bytes, wanted: list[int]) -> list[int]:
    """The 32-bit fields in ``wanted`` that are 0xFFFFFFFF, taken in order from a zip64 extra field."""
    out, at = [], 0
    for value in wanted:
        if value == _MAX32:
            if at + 8 > len(data):
                raise ValueError("a zip64 field is missing")
            value = struct.unpack_from("<Q", data, at)[0]
            at += 8
        out.append(value)
    return out


def _check_name(raw: bytes) -> str:
    if not raw or any(b < 0x20 or b > 0x7E or b == 0x5C for b in raw):
        raise ValueError(f"the name {raw!r} is not printable ASCII without backslashes")
    name = raw.decode("ascii")
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts) or len(parts) < 2:
        raise ValueError(f"the name {name!r} is not FOLDER/NAME with plain components")
    return name


def read_index(path: str | os.PathLike) -> Index:
    """The records of ``path``, or :class:`ArchiveError` (an InputError: exit 2) naming what is ambiguous."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            return _read_index(path, handle, os.fstat(handle.fileno()).st_size)
    except FileNotFoundError:
        raise InputError(f"{path}: missing") from None
    except IsADirectoryError:
        raise InputError(f"{path}: a folder, not a torch file") from None


def _read_index(path: Path, handle, size: int) -> Index:
    def fail(offset: int | None, what: str) -> ArchiveError:
        return ArchiveError(path, "" if offset is None else f"@byte {offset}", what)

    def read_at(offset: int, count: int) -> bytes:
        if offset < 0 or count < 0 or offset + count > size:
            raise fail(offset, f"{count} bytes declared past the end of the file ({size} bytes)")
        handle.seek(offset)
        data = handle.read(count)
        if len(data) != count:
            raise fail(offset, "the file changed while it was read")
        return data

    if size < _EOCD.size:
        raise fail(None, "not a zip archive (too short)")
    eocd_at = size - _EOCD.size
    sig, disk, cd_disk, n_disk, n_total, cd_size, cd_offset, comment = _EOCD.unpack(
        read_at(eocd_at, _EOCD.size)
    )
    if sig != b"PK\x05\x06":
        raise fail(eocd_at, "the file does not end with a zip end record without comment (not a torch file)")
    if disk or cd_disk or n_disk != n_total or comment:
        raise fail(eocd_at, "a multi-disk archive or an archive comment")
    end_of_cd = eocd_at
    locator_at = eocd_at - _Z64_LOCATOR.size
    if locator_at >= 0 and read_at(locator_at, 4) == b"PK\x06\x07":
        _sig, z_disk, z64_at, disks = _Z64_LOCATOR.unpack(read_at(locator_at, _Z64_LOCATOR.size))
        if z_disk != 0 or disks != 1 or z64_at + _Z64_EOCD.size != locator_at:
            raise fail(locator_at, "the zip64 end record is not where the locator says, right before it")
        fields = _Z64_EOCD.unpack(read_at(z64_at, _Z64_EOCD.size))
        if fields[0] != b"PK\x06\x06" or fields[1] != _Z64_EOCD.size - 12 or fields[4] or fields[5]:
            raise fail(z64_at, "a malformed zip64 end record")
        z_disk_count, z_total, z_cd_size, z_cd_offset = fields[6:]
        for small, big, sentinel in (
            (n_total, z_total, 0xFFFF), (cd_size, z_cd_size, _MAX32), (cd_offset, z_cd_offset, _MAX32)
        ):  # fmt: skip
            if small not in (big, sentinel):
                raise fail(eocd_at, "the zip end record and the zip64 end record disagree")
        if z_disk_count != z_total:
            raise fail(z64_at, "a multi-disk archive")
        n_total, cd_size, cd_offset, end_of_cd = z_total, z_cd_size, z_cd_offset, z64_at
    elif n_total == 0xFFFF or _MAX32 in (cd_size, cd_offset):
        raise fail(eocd_at, "zip64 sizes without a zip64 end record")
    if n_total > MAX_RECORDS:
        raise fail(eocd_at, f"{n_total} records (at most {MAX_RECORDS})")
    if cd_offset + cd_size != end_of_cd:
        raise fail(eocd_at, "the central directory does not end where the end records begin")
    directory = read_at(cd_offset, cd_size)

    entries = []  # (name, flags, local header offset, size, crc)
    at = 0
    for _ in range(n_total):
        if at + _CENTRAL.size > len(directory):
            raise fail(cd_offset + at, "the central directory is shorter than its entry count")
        fields = _CENTRAL.unpack_from(directory, at)
        (
            sig,
            _made,
            _need,
            flags,
            method,
            _t,
            _d,
            crc,
            csize,
            usize,
            n_len,
            e_len,
            c_len,
            d_start,
            _ia,
            attributes,
            local,
        ) = fields
        where = cd_offset + at
        if sig != b"PK\x01\x02":
            raise fail(where, "not a central directory entry")
        end = at + _CENTRAL.size + n_len + e_len + c_len
        if end > len(directory):
            raise fail(where, "an entry runs past the central directory")
        raw = directory[at + _CENTRAL.size : at + _CENTRAL.size + n_len]
        if raw.endswith(b"/"):
            raise fail(where, f"the name {raw!r} ends with '/' (a folder entry; torch writes only files)")
        if attributes & _DOS_FOLDER or (attributes >> 16) & _UNIX_TYPE not in (0, _UNIX_FILE):
            # miniz "extracts" a record marked as a folder as nothing: torch would hand back an
            # uninitialised buffer of the declared size instead of the bytes that are there
            raise fail(where, f"{raw!r} is marked as a folder, link or special file (attributes {attributes:#x})")
        try:
            name = _check_name(raw)
            extras = _extras(directory[at + _CENTRAL.size + n_len : at + _CENTRAL.size + n_len + e_len])
            if set(extras) - {_ZIP64_EXTRA}:
                raise ValueError("an extra field other than zip64 in the central directory")
            usize, csize, local, d_start = _zip64_values(
                extras.get(_ZIP64_EXTRA, b""), [usize, csize, local, d_start if d_start != 0xFFFF else _MAX32]
            )
        except ValueError as error:
            raise fail(where, str(error)) from None
        if flags & ~(_UTF8 | _DESCRIPTOR) or method != 0 or c_len or d_start:
            raise fail(
                where, f"{name!r} is compressed, encrypted, commented or on another disk (torch stores)"
            )
        if csize != usize:
            raise fail(where, f"{name!r} declares a stored size of {csize} and a size of {usize}")
        entries.append((name, flags, local, usize, crc))
        at = end
    if at != len(directory):
        raise fail(cd_offset + at, "bytes after the last central directory entry")
    if not entries:
        raise fail(cd_offset, "an empty archive")

    folder = entries[0][0].split("/", 1)[0]
    seen: set[str] = set()
    records: dict[str, Record] = {}
    expected = 0
    for name, flags, local, usize, crc in entries:
        if not name.startswith(folder + "/"):
            raise fail(local, f"{name!r} is outside the archive's folder {folder!r} (the first entry's)")
        folded = name.lower()  # miniz compares names ignoring ASCII case
        if folded in seen:
            raise fail(local, f"the name {name!r} appears twice (ignoring case)")
        seen.add(folded)
        if local != expected:
            raise fail(local, f"{name!r} does not start where the previous record ends (byte {expected})")
        header = _LOCAL.unpack(read_at(local, _LOCAL.size))
        l_sig, _need, l_flags, l_method, _t, _d, l_crc, l_csize, l_usize, l_nlen, l_elen = header
        if l_sig != b"PK\x03\x04" or l_flags != flags or l_method != 0:
            raise fail(local, f"the local header of {name!r} disagrees with the central directory")
        raw_local = read_at(local + _LOCAL.size, l_nlen + l_elen)
        if raw_local[:l_nlen] != name.encode("ascii"):
            raise fail(
                local, f"the local header names {raw_local[:l_nlen]!r}, the central directory {name!r}"
            )
        try:
            l_extras = _extras(raw_local[l_nlen:])
            if set(l_extras) - {_ZIP64_EXTRA, _PADDING_EXTRA}:
                raise ValueError("an unexpected extra field in a local header")
            l_usize, l_csize = _zip64_values(l_extras.get(_ZIP64_EXTRA, b""), [l_usize, l_csize])
        except ValueError as error:
            raise fail(local, str(error)) from None
        data_at = local + _LOCAL.size + l_nlen + l_elen
        data_end = data_at + usize
        if data_end > size:
            raise fail(local, f"{name!r} declares {usize} bytes past the end of the file")
        if flags & _DESCRIPTOR:
            if (l_crc, l_csize, l_usize) not in ((0, 0, 0), (crc, usize, usize)):
                raise fail(local, f"the local header of {name!r} declares other sizes than the directory")
            wide = _ZIP64_EXTRA in l_extras
            fmt = "<4sIQQ" if wide else "<4sIII"
            blob = read_at(data_end, struct.calcsize(fmt))
            d_sig, d_crc, d_csize, d_usize = struct.unpack(fmt, blob)
            if d_sig != b"PK\x07\x08" or (d_crc, d_csize, d_usize) != (crc, usize, usize):
                raise fail(data_end, f"the data descriptor of {name!r} disagrees with the central directory")
            expected = data_end + len(blob)
        else:
            if (l_crc, l_csize, l_usize) != (crc, usize, usize):
                raise fail(local, f"the local header of {name!r} declares other sizes than the directory")
            expected = data_end
        records[name[len(folder) + 1 :]] = Record(name[len(folder) + 1 :], data_at, usize, crc)
    if expected != cd_offset:
        raise fail(expected, "bytes between the last record and the central directory")
    return Index(path, folder, records)
