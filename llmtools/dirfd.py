"""Create, append to and delete our own files relative to a folder handle, never through a planted link.

A path we write by name (a lock file, ``metrics.jsonl``, an event file, ``RUN/checkpoints``) can be
replaced by a symbolic link by anyone who can write the folder, and ``open(path, "a")`` then writes to
whatever the link points at; ``rmtree`` through a linked folder deletes in someone else's run. Every such
write goes through this module instead: the folder the user named is opened once (symlinks in the
user's own path are the user's choice and are followed), and each name of ours inside it is opened,
created, unlinked or renamed relative to that handle with ``O_NOFOLLOW``: a link where we keep a file or
folder of ours is refused with :class:`LinkRefused` (a :class:`~llmtools.errors.UsageError`: exit 2,
naming the path), before anything is written through it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

from llmtools.errors import UsageError

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class LinkRefused(UsageError):
    def __init__(self, path: str | os.PathLike, what: str = "a symbolic link") -> None:
        super().__init__(
            f"{path}: refusing to write through it: it is {what} where llmtools keeps a file or folder of "
            "its own (someone put it there; remove it and run again)"
        )


@contextlib.contextmanager
def folder(path: str | os.PathLike) -> Iterator[int]:
    """A handle (fd) on the folder ``path`` the user named, closed on exit."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def _refuse_link(error: OSError, path: Path) -> None:
    if error.errno in (errno.ELOOP, errno.EMLINK):  # what O_NOFOLLOW answers for a final symlink
        raise LinkRefused(path) from None


def open_at(dir_fd: int, name: str, flags: int, shown: str | os.PathLike, mode: int = 0o666) -> int:
    """``os.open(name, flags | O_NOFOLLOW, dir_fd=dir_fd)``; a symlink (or anything but a regular file)
    at ``name`` is :class:`LinkRefused` naming ``shown``."""
    if "/" in name:
        raise ValueError(f"{name!r}: one name inside the folder, not a path")
    sys.audit("llmtools.dirfd.open", os.fspath(shown), flags)  # the full path, for tests and auditors
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | _CLOEXEC | os.O_NONBLOCK, mode, dir_fd=dir_fd)
    except OSError as error:
        _refuse_link(error, Path(shown))
        error.filename = os.fspath(shown)  # the error names the path the user knows, not the bare name
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise LinkRefused(shown, "not a regular file")
    os.set_blocking(fd, True)
    return fd


def open_path(path: str | os.PathLike, flags: int, mode: int = 0o666) -> int:
    """:func:`open_at` of ``path``'s last component in its (followed) parent folder."""
    path = Path(path)
    with folder(path.parent) as dir_fd:
        return open_at(dir_fd, path.name, flags, path, mode)


def append_file(path: str | os.PathLike, encoding: str | None = None):
    """``open(path, "a")`` (text with ``encoding``, else binary), created if missing, never through a link."""
    fd = open_path(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    return os.fdopen(fd, "a", encoding=encoding) if encoding else os.fdopen(fd, "ab")


def make_folder(path: str | os.PathLike) -> Path:
    """``path`` (a folder of ours inside the user's folder: ``RUN/eval``), made unless it is there; a
    link (or anything but a folder) there is :class:`LinkRefused` naming it. Returns it."""
    path = Path(path)
    with folder(path.parent) as dir_fd:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path.name, 0o777, dir_fd=dir_fd)
        try:
            fd = os.open(path.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC, dir_fd=dir_fd)
        except OSError as error:
            _refuse_link(error, path)
            if error.errno == errno.ENOTDIR:
                raise LinkRefused(path, "not a folder") from None
            raise
        os.close(fd)
    return path


def refuse_link(path: str | os.PathLike) -> Path:
    """``path`` (a file or folder of ours inside the user's folder: ``RUN/checkpoints``) is not a
    symlink; :class:`LinkRefused` naming it otherwise. Returns it."""
    path = Path(path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return path
    if stat.S_ISLNK(info.st_mode):
        raise LinkRefused(path)
    return path


def same_file(fd: int, path: str | os.PathLike) -> bool:
    """Whether the open ``fd`` is the file at ``path`` itself (a link there does not count)."""
    try:
        return os.path.samestat(os.fstat(fd), os.lstat(path))
    except FileNotFoundError:
        return False
