"""Pickles and archives that cost far more to read than their size: what the readers' bounds are for.

Each ``*_item(base)`` is pickle opcodes that push one value (memo entries numbered from ``base``, as a
pickler numbers them); :func:`with_item` adds it to a checkpoint pickle (whose top object is a dict) under
the key ``bomb``.
"""

from __future__ import annotations

import struct


def _binput(index: int) -> bytes:
    return b"r" + struct.pack("<I", index)


def _binget(index: int) -> bytes:
    return b"j" + struct.pack("<I", index)


def doubling_item(base: int, levels: int = 48) -> bytes:
    """A list holding the previous list twice, ``levels`` times: 2**levels elements to whoever walks it
    (``base``: the first memo index the pickle has not used)."""
    out = b"]" + _binput(base)
    for level in range(levels):
        out += b"](" + _binget(base + level) * 2 + b"e" + _binput(base + level + 1)
        out += b"0"  # POP: the new list stays in the memo only
    return out + _binget(base + levels)


def huge_memo_item(_base: int) -> bytes:
    """One value stored at memo index 2**31: C's unpickler grows its memo table to that size first."""
    return b"N" + b"r" + struct.pack("<I", 1 << 31)


def self_item(base: int) -> bytes:
    """A list that contains itself."""
    return b"]" + _binput(base) + _binget(base) + b"a"


def deep_item(_base: int, depth: int = 100_000) -> bytes:
    """Lists nested ``depth`` deep (walkers recurse: Python's recursion limit, or the C stack)."""
    return b"]" * depth + b"a" * (depth - 1)


def collision_item(_base: int, count: int = 60_000) -> bytes:
    """A dict of ``count`` integer keys that all hash alike (multiples of 2**61-1, Python's hash modulus):
    each insertion compares with every key before it, so building it is quadratic (minutes for 60,000
    keys, 0.8 MB) inside one C call that holds the GIL."""
    modulus = (1 << 61) - 1
    out = b"}("  # EMPTY_DICT, MARK
    for i in range(1, count + 1):
        key = (modulus * i).to_bytes(((modulus * i).bit_length() + 8) // 8, "little", signed=True)
        out += b"\x8a" + bytes([len(key)]) + key + b"N"  # LONG1 key, None
    return out + b"u"  # SETITEMS


ITEMS = {
    "doubling": doubling_item,
    "huge-memo": huge_memo_item,
    "self": self_item,
    "deep": deep_item,
    "collisions": collision_item,
}


def with_item(data: bytes, kind: str) -> bytes:
    """``data`` with ``{"bomb": ITEMS[kind]}`` added to its top dict."""
    return with_value(data, ITEMS[kind])


def with_value(data: bytes, item) -> bytes:
    """``data`` with ``{"bomb": item(base)}`` added to its top dict (``base``: its first free memo index)."""
    import pickletools

    assert data.endswith(b".")
    used = sum(
        op.name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE") for op, _arg, _pos in pickletools.genops(data)
    )
    key = b"bomb"
    return data[:-1] + b"X" + struct.pack("<I", len(key)) + key + item(used) + b"s."


def _text(value: str) -> bytes:
    raw = value.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def storage_refs_item(base: int, count: int, key: str, numel: int) -> bytes:
    """Not a bomb: a list of ``count`` references to the file's float storage ``key`` (of ``numel``
    elements), one persistent id each. Allowed (nothing hashed, nothing nested, linear), yet each reference
    costs the unpickler a call into its ``persistent_load``: 600,000 of them (3.6 MB) take seconds to
    check and seconds to unpickle."""
    pid = b"(" + _text("storage") + b"ctorch\nFloatStorage\n" + _text(key) + _text("cpu")
    head = pid + b"J" + struct.pack("<i", numel) + b"t" + _binput(base) + b"0"  # TUPLE, memo, POP
    reference = _binget(base) + b"Q"  # BINPERSID
    batches, rest = divmod(count, 1000)
    body = (b"(" + reference * 1000 + b"e") * batches + b"(" + reference * rest + b"e"  # APPENDS of a MARK
    return head + b"]" + body


def compressed_pickle(data: bytes, size: int) -> tuple[bytes, int, int]:
    """``data`` with a ``size``-byte zero string under ``bomb``, deflated (a few KB per 10 MB): a reader
    that inflates data.pkl holds all of it."""
    from tests.trust.zipcraft import deflated

    key = b"bomb"
    prefix = data[:-1] + b"X" + struct.pack("<I", len(key)) + key + b"\x8e" + struct.pack("<Q", size)
    return deflated(prefix, size, b"s.")
