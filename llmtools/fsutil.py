"""Atomic outputs: write to a temporary name beside the target, rename into place when complete.

A killed command therefore never leaves a file or folder that looks finished: at worst a
``.tmp-*`` sibling remains, which no reader ever opens.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from llmtools.errors import InputError, OutputExistsError

TMP_MARK = ".tmp-"


def check_writable(paths, force: bool) -> None:
    """Refuse to overwrite any existing output unless ``force`` (an empty folder holds nothing to lose).

    The library's own guard; what ``--force`` may replace is decided before, by the CLI
    (:func:`llmtools.cli.outputs.claim`).
    """
    for path in paths:
        path = Path(path)
        if not force and os.path.lexists(path) and not (path.is_dir() and not any(path.iterdir())):
            raise OutputExistsError(path)


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


def inside(folder: str | os.PathLike, name: object, source: str) -> Path:
    """``folder / name`` for a path read from a file (``source`` names it in errors), refused unless it stays
    inside ``folder``: a relative path without ``..`` that, symlinks resolved, still lies under ``folder``.

    What a hostile manifest, ``latest`` file or shard index could otherwise make us read, hash, report the
    size of, or train on: ``/etc/passwd``, ``../../other-run``, a symlink out of the folder.
    """
    if not isinstance(name, str) or not name or "\x00" in name:
        raise InputError(f"{source}: {name!r} is not a file name")
    relative = Path(name)
    if relative.is_absolute() or ".." in relative.parts:
        raise InputError(f"{source}: {name!r} lies outside {folder} (absolute or with '..'); refused")
    path = Path(folder) / relative
    root = os.path.realpath(folder)
    real = os.path.realpath(path)
    if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
        raise InputError(f"{source}: {name!r} is a symlink out of {folder} (to {real}); refused")
    return path
