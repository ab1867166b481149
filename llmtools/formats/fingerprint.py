"""Cheap, checkable identities of files a plan depends on.

A fingerprint records a file's size and modification time, and a content digest: the sha256 of the whole
file for the small ones (``.idx``, the index cache), or of a few blocks at fixed places for the big ones
(``.bin``: the first, the last and evenly spaced 4 KiB blocks, with the size). Checking one is cheap when
nothing changed (a ``stat``: same size and mtime); when only the mtime moved (the data was copied or
touched) the digest decides, so a copied dataset is still recognised and a rewritten one is not.

    recorded = fingerprint(path, sampled=True)      # when the plan is made
    problem = changed(path, recorded)               # when it is opened: None, or what differs
"""

from __future__ import annotations

import hashlib
import os

SAMPLE_BLOCKS = 8
SAMPLE_BLOCK = 4096
_CHUNK = 1 << 22


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sampled_sha256(path: str | os.PathLike, blocks: int = SAMPLE_BLOCKS, block: int = SAMPLE_BLOCK) -> str:
    """sha256 of the size and ``blocks`` blocks of ``block`` bytes spread over the file (first and last
    included): a few reads however large the file."""
    size = os.path.getsize(path)
    digest = hashlib.sha256(str(size).encode())
    last = max(size - block, 0)
    offsets = sorted({last * i // max(blocks - 1, 1) for i in range(blocks)})
    with open(path, "rb") as handle:
        for offset in offsets:
            handle.seek(offset)
            digest.update(handle.read(block))
    return digest.hexdigest()


def fingerprint(path: str | os.PathLike, sampled: bool = False) -> dict:
    """``{"size", "mtime_ns", "sha256" | "sampled_sha256"}`` of ``path``."""
    stat = os.stat(path)
    key = "sampled_sha256" if sampled else "sha256"
    digest = sampled_sha256(path) if sampled else sha256_file(path)
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, key: digest}


def changed(path: str | os.PathLike, recorded: dict) -> str | None:
    """None when ``path`` still matches ``recorded`` (a :func:`fingerprint`); else what differs, in words."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return "missing"
    if "size" in recorded and stat.st_size != recorded["size"]:
        return f"size {recorded['size']} -> {stat.st_size}"
    if recorded.get("mtime_ns") == stat.st_mtime_ns:
        return None
    for key, compute in (("sha256", sha256_file), ("sampled_sha256", sampled_sha256)):
        if key in recorded and compute(path) != recorded[key]:
            return f"same size, other content ({key.replace('_', ' ')} differs)"
    return None
