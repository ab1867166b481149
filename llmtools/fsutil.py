"""Atomic outputs: write to a temporary name beside the target, rename into place when complete.

A killed command therefore never leaves a file or folder that looks finished: at worst a
``.tmp-*`` sibling remains, which no reader ever opens.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from llmtools.errors import OutputExistsError

TMP_MARK = ".tmp-"


def check_writable(paths, force: bool) -> None:
    """Refuse to overwrite any existing output unless ``force``."""
    for path in paths:
        if not force and Path(path).exists():
            raise OutputExistsError(path)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file's bytes, read in chunks (memory stays flat)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def tmp_sibling(path: str | os.PathLike, suffix: str = "") -> Path:
    """A fresh unique name in the same folder (same filesystem, so rename is atomic)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f"{path.name}{TMP_MARK}", suffix=suffix, dir=path.parent)
    os.close(fd)
    return Path(name)


def fsync_file(path: str | os.PathLike) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def fsync_dir(path: str | os.PathLike) -> None:
    with contextlib.suppress(OSError):  # not every filesystem lets a directory be fsynced
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def commit_file(tmp: str | os.PathLike, final: str | os.PathLike, durable: bool = True) -> None:
    """Rename a finished temporary file into place (after flushing it to disk)."""
    if durable:
        fsync_file(tmp)
    os.replace(tmp, final)
    if durable:
        fsync_dir(Path(final).parent)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w", durable: bool = True, **open_kwargs) -> Iterator:
    """Open ``path`` for writing through a temporary sibling; renamed into place on success only."""
    tmp = tmp_sibling(path)
    try:
        with open(tmp, mode, **open_kwargs) as handle:
            yield handle
        commit_file(tmp, path, durable=durable)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_file(path, "w", encoding="utf-8") as handle:
        handle.write(text)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, force: bool = False) -> Iterator[Path]:
    """Build a folder under a temporary name; it replaces ``path`` only when the block succeeds."""
    path = Path(path)
    check_writable([path], force)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{path.name}{TMP_MARK}", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f"{path.name}.old-", dir=path.parent))
            os.replace(path, old / path.name)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
