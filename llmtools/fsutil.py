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
