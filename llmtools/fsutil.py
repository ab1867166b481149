"""Atomic outputs: write to a temporary name beside the target, rename into place when complete.

A killed command therefore never leaves a file or folder that looks finished. Every temporary made
here is registered *before* it is created and forgotten when it is renamed into place or removed, so
whatever stops the process — an error, SIGTERM/SIGINT turned into an exception (:mod:`llmtools.interrupt`),
a second signal — :func:`remove_temporaries` finds what is left; the CLI calls it on every exit. Folders
created on the way to an output are removed again when the output never appeared and they stayed empty.
Only ``kill -9`` can leave a ``.tmp-*`` sibling behind, which no reader ever opens.

Files are created with mode 0666 and folders 0777 less the umask, as ``open()`` and ``mkdir`` do (the
``tempfile`` module's private 0600/0700 would make every output unreadable to the rest of a shared
machine). A write that fails because the filesystem is full becomes :class:`DiskFullError` naming the
output, whatever library did the writing.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

from llmtools.errors import DiskFullError, InputError, LlmtoolsError, OutputExistsError
from llmtools.interrupt import critical, on_abort

TMP_MARK = ".tmp-"
FULL_MARGIN = 1 << 20
"""A failed write on a filesystem with less free space than this is reported as a full disk (libraries
such as numpy and torch report a short write without an errno)."""
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)

_live: dict[Path, str] = {}  # temporary -> "file" | "dir" | "parent" (a folder made for an output)
_lock = threading.Lock()


def check_writable(paths, force: bool) -> None:
    """Refuse to overwrite any existing output unless ``force`` (an empty folder holds nothing to lose).

    The library's own guard; what ``--force`` may replace is decided before, by the CLI
    (:func:`llmtools.cli.claim.claim`).
    """
    for path in paths:
        path = Path(path)
        if not force and os.path.lexists(path) and not (path.is_dir() and not any(path.iterdir())):
            raise OutputExistsError(path)


# -- the registry ----------------------------------------------------------------------------------
def _register(path: Path, kind: str) -> None:
    with _lock:
        _live[path] = kind


def _forget(path: Path) -> None:
    with _lock:
        _live.pop(path, None)


def _keep_parents(path: Path) -> None:
    """An output was committed: the folders made for it are part of the result now."""
    with _lock:
        for folder in [p for p, kind in _live.items() if kind == "parent"]:
            if folder in path.parents:
                del _live[folder]


def live_temporaries() -> list[Path]:
    with _lock:
        return [p for p, kind in _live.items() if kind != "parent"]


def remove_temporaries() -> list[Path]:
    """Remove every registered temporary that is still there (and emptied parent folders); what went."""
    with _lock:
        items = sorted(_live.items(), key=lambda item: len(item[0].parts), reverse=True)
        _live.clear()
    removed = []
    for path, kind in items:
        try:
            if kind == "file":
                path.unlink()
            elif kind == "dir":
                shutil.rmtree(path)
            else:
                path.rmdir()  # only when empty: something else may have been put there meanwhile
            removed.append(path)
        except OSError:
            continue
    return removed


on_abort(remove_temporaries)  # a second signal exits without unwinding: clean up from the handler


def make_parents(folder: str | os.PathLike) -> None:
    """``mkdir -p`` that remembers the folders it made, so that a failed command takes them away."""
    folder = Path(folder)
    missing = []
    probe = folder
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    if not missing:
        return
    for path in reversed(missing):  # registered first: removed deepest first, each only when empty
        _register(path, "parent")
        try:
            os.mkdir(path)
        except FileExistsError:
            _forget(path)  # made by someone else meanwhile: not ours to remove
        except OSError as error:
            _forget(path)
            raise disk_full_error(error, path) or error from None


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file's bytes, read in chunks (memory stays flat)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def printable(text: str) -> str:
    """``text`` (prose that names paths: a dataset card, a message) as valid Unicode: each byte of a path
    that is not UTF-8 (Python's lone surrogate ``\\udcNN``) shown as ``\\xNN``, the way a shell's
    ``$'...'`` writes it; any other lone surrogate as its ``\\uNNNN`` escape. Text that is valid already
    is returned unchanged. For prose only: a file that must give the bytes back uses ``bytes_b64``
    (:func:`llmtools.formats.jsonfile.portable`)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    out = []
    for char in text:
        if "\udc80" <= char <= "\udcff":
            out.append(f"\\x{ord(char) - 0xDC00:02x}")
        elif "\ud800" <= char <= "\udfff":
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return "".join(out)


# -- temporaries -----------------------------------------------------------------------------------
@contextlib.contextmanager
def text_path(path: str | os.PathLike) -> Iterator[str]:
    """A name for ``path`` that a library taking a file name only as UTF-8 text can open (tokenizers'
    ``from_file``): the path itself when its bytes are UTF-8, else ``/dev/fd/N`` of the file opened here
    for as long as the block runs. A path is any bytes the filesystem allows."""
    name = os.fspath(path)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        handle = os.open(name, os.O_RDONLY)
        try:
            yield f"/dev/fd/{handle}"
        finally:
            os.close(handle)
        return
    yield name


def tmp_sibling(path: str | os.PathLike, suffix: str = "") -> Path:
    """A fresh, empty, registered file in the same folder (same filesystem, so rename is atomic)."""
    path = Path(path)
    make_parents(path.parent)
    while True:
        tmp = path.parent / f"{path.name}{TMP_MARK}{secrets.token_hex(4)}{suffix}"
        _register(tmp, "file")  # before creating it: a signal in between cannot orphan it
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            _forget(tmp)
            continue
        except OSError as error:
            _forget(tmp)
            raise disk_full_error(error, path) or _naming(error, path) from None
        os.close(fd)
        return tmp


def tmp_folder(path: str | os.PathLike) -> Path:
    """A fresh, empty, registered folder beside ``path``."""
    path = Path(path)
    make_parents(path.parent)
    while True:
        tmp = path.parent / f"{path.name}{TMP_MARK}{secrets.token_hex(4)}"
        _register(tmp, "dir")
        try:
            os.mkdir(tmp, 0o777)
        except FileExistsError:
            _forget(tmp)
            continue
        except OSError as error:
            _forget(tmp)
            raise disk_full_error(error, path) or _naming(error, path) from None
        return tmp


def _naming(error: OSError, path: Path) -> OSError:
    """The same error, naming the output rather than its temporary (a read-only folder, say)."""
    return type(error)(error.errno, error.strerror, str(path)) if error.errno is not None else error


def discard(tmp: str | os.PathLike) -> None:
    """Remove a temporary (file or folder) and forget it."""
    tmp = Path(tmp)
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.unlink(missing_ok=True)
    if not tmp.exists():
        _forget(tmp)


# -- disk full -------------------------------------------------------------------------------------
def free_bytes(path: str | os.PathLike) -> int | None:
    """Free space for unprivileged users on the filesystem holding ``path`` (its nearest existing folder)."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        stat = os.statvfs(probe)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def disk_full_error(error: BaseException, path: str | os.PathLike) -> DiskFullError | None:
    """:class:`DiskFullError` for ``path`` when ``error`` is a full disk, else None.

    ENOSPC/EDQUOT, or a failed write (OSError, or RuntimeError as torch raises for a short write) while the
    filesystem has less than :data:`FULL_MARGIN` free: libraries word a full disk in many ways
    ("unexpected pos", "139960 requested and 11232 written")."""
    if isinstance(error, DiskFullError):
        return error
    if isinstance(error, LlmtoolsError) or not isinstance(error, (OSError, RuntimeError)):
        return None
    if isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
        free = free_bytes(path)
        return DiskFullError(path, f"{_size(free)} free" if free is not None else "")
    if isinstance(error, OSError) and error.errno is not None:
        return None  # a named error of another kind (permission, not found): reported as it is
    free = free_bytes(path)
    if free is not None and free < FULL_MARGIN:
        return DiskFullError(path, f"{_size(free)} free; the writer said: {error}")
    return None


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@contextlib.contextmanager
def disk_full_guard(path: str | os.PathLike) -> Iterator[None]:
    """Turn a full disk met inside the block into :class:`DiskFullError` naming ``path``."""
    try:
        yield
    except Exception as error:
        full = disk_full_error(error, path)
        if full is None or full is error:
            raise
        raise full from None


# -- committing ------------------------------------------------------------------------------------
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
    tmp, final = Path(tmp), Path(final)
    if durable:
        with disk_full_guard(final):
            fsync_file(tmp)
    os.replace(tmp, final)
    _forget(tmp)
    _keep_parents(final)
    if durable:
        fsync_dir(final.parent)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "", durable: bool = True) -> Iterator[Path]:
    """A temporary path for a library that writes by file name (torch.save, savefig, safetensors);
    renamed to ``path`` when the block succeeds, removed otherwise."""
    tmp = tmp_sibling(path, suffix)
    try:
        with disk_full_guard(path):
            yield tmp
        commit_file(tmp, path, durable=durable)
    except BaseException:
        discard(tmp)
        raise


class AtomicGroup:
    """Outputs that appear together or not at all: :meth:`path` hands out a temporary for each final path;
    :meth:`commit` renames them all as one step (signals held), :meth:`discard` removes them."""

    def __init__(self, durable: bool = True) -> None:
        self.durable = durable
        self.pending: list[tuple[Path, Path]] = []

    def path(self, final: str | os.PathLike, suffix: str = "") -> Path:
        tmp = tmp_sibling(final, suffix)
        self.pending.append((tmp, Path(final)))
        return tmp

    def commit(self) -> list[Path]:
        if self.durable:  # one syncfs per filesystem where there is one (thousands of files at once)
            for folder in {final.parent for _, final in self.pending}:
                if not _syncfs(folder):
                    for tmp, final in self.pending:
                        if final.parent == folder:
                            with disk_full_guard(final):
                                fsync_file(tmp)
        with critical():
            for tmp, final in self.pending:
                commit_file(tmp, final, durable=False)
        if self.durable:
            for folder in {final.parent for _, final in self.pending}:
                fsync_dir(folder)
        done, self.pending = [final for _, final in self.pending], []
        return done

    def discard(self) -> None:
        for tmp, _ in self.pending:
            discard(tmp)
        self.pending = []


@contextlib.contextmanager
def atomic_group(durable: bool = True) -> Iterator[AtomicGroup]:
    """``with atomic_group() as group:`` write to ``group.path(final)`` for each output; all of them are
    renamed into place when the block succeeds, none otherwise. A full disk names the output at fault."""
    group = AtomicGroup(durable)
    try:
        try:
            yield group
        except Exception as error:
            full = disk_full_error(error, group.pending[-1][1]) if group.pending else None
            if full is None or full is error:
                raise
            raise full from None
        group.commit()
    except BaseException:
        group.discard()
        raise


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
    with atomic_path(path, durable=durable) as tmp, open(tmp, mode, **open_kwargs) as handle:
        yield handle


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_file(path, "w", encoding="utf-8") as handle:
        handle.write(text)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, force: bool = False) -> Iterator[Path]:
    """Build a folder under a temporary name; it replaces ``path`` only when the block succeeds."""
    path = Path(path)
    check_writable([path], force)
    tmp = tmp_folder(path)
    try:
        with disk_full_guard(path):
            yield tmp
        with critical():  # the old folder goes and the new one comes as one step
            if path.exists():
                old = tmp_folder(path.with_name(f"{path.name}.old"))
                os.replace(path, old / path.name)
                os.replace(tmp, path)
                _forget(tmp)
                discard(old)
            else:
                os.replace(tmp, path)
                _forget(tmp)
        _keep_parents(path)
        fsync_dir(path.parent)
    except BaseException:
        discard(tmp)
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


def stdin_binary():
    """Standard input as a binary stream; an :class:`InputError` when the process has none (started
    with stdin closed, ``<&-``: Python then has ``sys.stdin = None``)."""
    import sys

    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:
        raise InputError("-: standard input is closed (nothing to read); give a file, or pipe data in")
    return stream


def cache_dir() -> Path:
    """Where llmtools keeps what it builds once per machine (compiled helpers, tokenizer views):
    ``$LLMTOOLS_CACHE``, else ``$XDG_CACHE_HOME/llmtools`` or ``~/.cache/llmtools``."""
    root = os.environ.get("LLMTOOLS_CACHE")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "llmtools"
