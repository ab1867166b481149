"""Atomic outputs: write to a temporary name beside the target, rename into place when complete.

A killed command therefore never leaves a file or folder that looks finished: at worst a
``.tmp-*`` sibling remains, which no reader ever opens.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
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


def sync_files(paths, folder: str | os.PathLike) -> None:
    """Make many files just written (and renamed into ``folder``) durable at once: one ``syncfs`` of
    their filesystem where the C library has it (Linux; thousands of small files in well under a
    second, where one fsync each takes milliseconds apiece), else an fsync per file; then the folder."""
    if not _syncfs(folder):
        for path in paths:
            fsync_file(path)
    fsync_dir(folder)


def _syncfs(folder: str | os.PathLike) -> bool:
    try:
        import ctypes

        syncfs = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return False
    fd = os.open(folder, os.O_RDONLY)
    try:
        return syncfs(fd) == 0
    finally:
        os.close(fd)


def commit_file(tmp: str | os.PathLike, final: str | os.PathLike, durable: bool = True) -> None:
    """Rename a finished temporary file into place (after flushing it to disk)."""
    if durable:
        fsync_file(tmp)
    os.replace(tmp, final)
    if durable:
        fsync_dir(Path(final).parent)


COPY_BLOCK = 1 << 24
# copy_file_range refuses some pairs of files (another filesystem on older kernels, special files):
# those errors mean "copy it yourself", any other is a real I/O failure.
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EBADF}


def copy_bytes(source, target, count: int) -> int:
    """Copy ``count`` bytes from the current position of binary file ``source`` to binary file ``target``
    (flushed first), in the kernel with ``copy_file_range`` where it can, else in 16 MiB blocks. Returns
    the bytes copied: fewer than ``count`` only when ``source`` ends early."""
    target.flush()
    src, dst = source.fileno(), target.fileno()
    done = 0
    if hasattr(os, "copy_file_range"):
        try:
            while done < count:
                step = os.copy_file_range(src, dst, min(count - done, 1 << 30))
                if step == 0:
                    return done
                done += step
            return done
        except OSError as error:
            if error.errno not in _NO_KERNEL_COPY:
                raise
    block = memoryview(bytearray(min(COPY_BLOCK, max(1, count - done))))
    while done < count:
        got = os.readv(src, [block[: min(len(block), count - done)]])
        if got == 0:
            break
        sent = 0
        while sent < got:
            sent += os.write(dst, block[sent:got])
        done += got
    return done


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
