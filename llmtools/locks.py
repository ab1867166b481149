"""One writer at a time: an exclusive lock per run folder and per output, taken before anything is written.

A lock is ``flock(2)`` on a small file: ``RUN/run.lock`` for a run folder, ``OUTPUT.lock`` beside any other
output (a dataset prefix, a mix.json, an export folder). The kernel drops the lock when the holding
process ends, however it ends (kill -9 and a crashed host's NFS lease included), so a dead writer never
blocks the next one: its lock *file* may remain, its lock does not. The file records who holds it (host,
pid, process start time, command), so a refused writer can name the holder::

    from llmtools.locks import lock_output, lock_run

    with lock_run("runs/tiny", "llm-train"):            # RUN/run.lock
        ...
    with lock_output(["data/web_text_document"], "llm-prep merge"):   # data/web_text_document.lock
        ...                                              # check_writable(...) and the writes go here

A second writer gets :class:`LockHeld` (a :class:`~llmtools.errors.UsageError`: exit 2) at once; nothing
waits. The same process may take a lock it already holds (nested library calls): it is counted, and
released when the outermost holder lets go. Forked children (worker pools) close their inherited copy,
so a lock never outlives its owner in an orphaned worker.

Across hosts the guarantee is the shared filesystem's: Linux turns ``flock`` on NFS into NFS byte-range
locks (NFSv4, or NFSv3 with a working lockd), Lustre needs the ``-o flock`` mount option (``localflock``
locks per node only), GPFS, CephFS and BeeGFS (with global locks on) lock cluster-wide. Where the
filesystem refuses locks (ENOLCK, EOPNOTSUPP: NFS mounted ``nolock`` sometimes, some FUSE filesystems)
the command goes on with a warning: it cannot promise one writer there.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shlex
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from llmtools.dirfd import open_path, same_file
from llmtools.errors import UsageError
from llmtools.formats import jsonfile
from llmtools.fsutil import make_parents
from llmtools.interrupt import on_abort

LOCK_SUFFIX = ".lock"
RUN_LOCK = "run.lock"
_UNSUPPORTED = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}
_BUSY = {errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES}


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, as its lock file says."""

    host: str
    pid: int
    started: str  # the holder process's start time (ISO 8601, UTC)
    command: str

    def describe(self) -> str:
        return f"{self.command} (pid {self.pid} on {self.host}, started {self.started})"


class LockHeld(UsageError):
    """Another process is writing the same output (exit 2)."""

    def __init__(self, target: str | os.PathLike, lock_file: Path, holder: Holder | None) -> None:
        self.target = str(target)
        self.lock_file = lock_file
        self.holder = holder
        who = holder.describe() if holder is not None else "another process (it has not said who yet)"
        super().__init__(
            f"{target}: in use by {who}; lock {lock_file}. Wait for it to finish or stop it "
            "(the lock goes with its process, even after kill -9)"
        )


def lock_path(output: str | os.PathLike) -> Path:
    """The lock file of an output (a file, a dataset prefix or a folder): ``OUTPUT.lock`` beside it."""
    output = Path(output)
    return output.parent / f"{output.name}{LOCK_SUFFIX}"


def run_lock_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / RUN_LOCK


# ------------------------------------------------------------------------------------------ holder
def _process_start() -> str:
    """This process's start time (from /proc where there is one; else now)."""
    import datetime

    started = time.time()
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
        started = boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        pass
    return datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(timespec="seconds")


def _me(command: str | None) -> Holder:
    if command is None:
        argv = list(sys.argv) or ["python"]
        program = Path(argv[0])
        # python -m llmtools.cli.train (torchrun, the deepspeed launcher) is llm-train to the user
        name = f"llm-{program.stem}" if program.parent.name == "cli" else program.name
        command = shlex.join([name, *argv[1:]])
    return Holder(socket.gethostname(), os.getpid(), _process_start(), command)


def read_holder(lock_file: str | os.PathLike) -> Holder | None:
    """Who the lock file names (None when it is empty or unreadable: a holder that has not written yet)."""
    try:
        data = jsonfile.loads(Path(lock_file).read_text(encoding="utf-8"), ours=True)
        return Holder(str(data["host"]), int(data["pid"]), str(data["started"]), str(data["command"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


# ------------------------------------------------------------------------------------------ locks
warn: Callable[[str], None] = lambda message: print(f"warning: {message}", file=sys.stderr, flush=True)  # noqa: E731

_held: dict[str, list] = {}  # key -> [fd or None, count]
_guard = threading.Lock()


def _key(lock_file: Path) -> str:
    return os.path.join(os.path.realpath(lock_file.parent), lock_file.name)


def _close_inherited() -> None:
    # A forked child shares the parent's open file description; closing the child's descriptor leaves the
    # parent's lock alone (flock is released only when the last descriptor closes, or by LOCK_UN, never
    # used here), and means a worker outliving a killed parent does not keep the output locked.
    for fd, _count in _held.values():
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_inherited)


def _unlink_held() -> None:
    # A process that exits without unwinding (a second signal, the signal watchdog) removes its lock files
    # as a release does; the kernel drops the locks themselves. No _guard: this may run inside a handler
    # that interrupted a holder of it.
    for key, (fd, _count) in list(_held.items()):
        if fd is not None:
            with contextlib.suppress(OSError):
                if same_file(fd, key):
                    os.unlink(key)


on_abort(_unlink_held)


class Lock:
    """A held lock; :meth:`release` (or leaving the ``with`` block) lets it go."""

    def __init__(self, lock_file: Path, target: str, key: str, fresh: bool = False) -> None:
        self.path = lock_file
        self.target = target
        self._key = key
        self._released = False
        self.fresh = fresh
        """Taken here from no holder (not a nested hold, not a filesystem without locks): every earlier
        writer of the target is gone."""

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        with _guard:
            entry = _held.get(self._key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] > 0:
                return
            del _held[self._key]
            fd = entry[0]
        if fd is None:  # the filesystem had no locks: nothing was held
            return
        # Unlinked while still held, so a waiting opener of this file finds it replaced (see _acquire).
        with contextlib.suppress(OSError):
            if same_file(fd, self.path):  # never a link someone put in its place
                os.unlink(self.path)
        os.close(fd)

    def __enter__(self) -> Lock:
        return self

    def __exit__(self, *_exc) -> None:
        self.release()


def acquire(
    lock_file: str | os.PathLike, target: str | os.PathLike | None = None, command: str | None = None
) -> Lock:
    """Take the exclusive lock ``lock_file`` (created if needed) or raise :class:`LockHeld` at once.

    ``target`` is what the lock protects, for the message; ``command`` names this writer in the lock file
    (default: this process's command line).
    """
    lock_file = Path(lock_file)
    target = str(target if target is not None else lock_file)
    key = _key(lock_file)
    with _guard:
        entry = _held.get(key)
        if entry is not None:  # this process holds it already (a library call inside another)
            entry[1] += 1
            return Lock(lock_file, target, key, fresh=False)
        fd = _acquire(lock_file, target, _me(command))
        _held[key] = [fd, 1]
    return Lock(lock_file, target, key, fresh=fd is not None)


def _acquire(lock_file: Path, target: str, me: Holder) -> int | None:
    make_parents(lock_file.parent)  # folders made for an output that never appears are removed again
    for _attempt in range(50):
        fd = open_path(lock_file, os.O_RDWR | os.O_CREAT)  # a link planted at the lock path is refused
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            if error.errno in _BUSY:
                raise LockHeld(target, lock_file, _holder_of(lock_file)) from None
            if error.errno in _UNSUPPORTED:
                warn(
                    f"{lock_file}: this filesystem does not support file locks ({os.strerror(error.errno)}): "
                    f"nothing stops a second writer of {target}"
                )
                return None
            raise
        # The previous holder unlinks the file before letting go: if ours is no longer the file at that
        # path, another process may already hold the new one. Start again on the current file.
        if not same_file(fd, lock_file):
            os.close(fd)
            continue
        record = jsonfile.dumps(me.__dict__).encode() + b"\n"
        # Written, then cut to length (a stale record may be longer): truncating to 0 first would make
        # ext4 flush the file on close (its replace-by-truncate heuristic), ~5 ms per lock.
        os.pwrite(fd, record, 0)
        os.ftruncate(fd, len(record))
        if not _local_filesystem(lock_file):
            with contextlib.suppress(OSError):
                os.fsync(fd)  # other hosts read who holds it: NFS shows them only what reached the server
        return fd
    raise UsageError(f"{lock_file}: could not be locked (it keeps being replaced by other processes)")


# Filesystems whose page cache every reader of the file shares (one host): no flush needed for others to
# read the holder record. Anything else (nfs, lustre, gpfs, ceph, fuse.*, unknown) is flushed.
_LOCAL_FS = {
    "ext2",
    "ext3",
    "ext4",
    "xfs",
    "btrfs",
    "tmpfs",
    "ramfs",
    "zfs",
    "f2fs",
    "overlay",
    "bcachefs",
    "jfs",
}
_mounts: list[tuple[str, str]] | None = None


def _local_filesystem(path: Path) -> bool:
    """Whether ``path`` is on a local filesystem (from /proc/self/mountinfo; False when unknown)."""
    global _mounts
    if _mounts is None:
        try:
            lines = Path("/proc/self/mountinfo").read_text().splitlines()
        except OSError:
            lines = []
        found = []
        for line in lines:
            left, _, right = line.partition(" - ")
            fields = left.split()
            if len(fields) >= 5 and right:
                point = fields[4].replace("\\040", " ")
                found.append((point, right.split()[0]))
        _mounts = sorted(found, key=lambda m: len(m[0]), reverse=True)
    where = os.path.realpath(path.parent)
    for point, fstype in _mounts:
        if where == point or where.startswith(point.rstrip("/") + "/"):
            return fstype in _LOCAL_FS
    return False


def _holder_of(lock_file: Path) -> Holder | None:
    # A holder writes its name right after locking; give it a moment before calling it unknown.
    for _ in range(5):
        holder = read_holder(lock_file)
        if holder is not None:
            return holder
        time.sleep(0.02)
    return None


@contextlib.contextmanager
def lock_output(
    outputs: str | os.PathLike | Iterable[str | os.PathLike], command: str | None = None
) -> Iterator[list[Lock]]:
    """Lock every output (``OUTPUT.lock`` beside each), all or none; released on leaving the block."""
    if isinstance(outputs, str | os.PathLike):
        outputs = [outputs]
    targets = sorted({os.path.normpath(str(o)) for o in outputs})
    with contextlib.ExitStack() as stack:
        held = [stack.enter_context(acquire(lock_path(t), t, command)) for t in targets]
        for target, lock in zip(targets, held, strict=True):
            if lock.fresh:  # a nested hold: the temporaries there may be this process's own
                remove_dead_temporaries(target)
        yield held


def _lock_is_free(lock_file: Path) -> bool:
    """No live process holds ``lock_file`` (missing, or lockable now; the test lock is let go at once)."""
    try:
        fd = os.open(lock_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    except OSError:
        return False  # a link or something unreadable: not ours to judge
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)  # closing drops the test lock
    return True


# What follows TMP_MARK in a temporary fsutil names: 8 hex digits, then its suffix (.lengths, .png...).
_TEMPORARY = re.compile(r"[0-9a-f]{8}(\.[A-Za-z0-9_]+)*")


def remove_dead_temporaries(target: str | os.PathLike) -> list[Path]:
    """The temporaries a killed writer of ``target`` left beside it (``TARGET.tmp-*``, and those of its
    files, ``TARGET.bin.tmp-*``...), removed by whoever holds ``target``'s lock now: a writer takes the lock
    before its first temporary, so with the lock held here no live writer of ``target`` has any. A
    temporary another output could own (``TARGET.v2.bin.tmp-*`` is also ``TARGET.v2``'s) is left while
    that output's lock is held. Returns what was removed."""
    import shutil

    from llmtools.fsutil import TMP_MARK

    target = Path(target)
    folder, name = target.parent, target.name
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        owner, mark, rest = entry.name.partition(TMP_MARK)
        if not mark or not (owner == name or owner.startswith(name + ".")):
            continue
        if not _TEMPORARY.fullmatch(rest):  # not a name fsutil gives a temporary: someone's file, kept
            continue
        # Every other output this could be a temporary of: OWNER, and OWNER less its dotted suffixes.
        others = [owner]
        while "." in others[-1] and others[-1] != name:
            others.append(others[-1].rsplit(".", 1)[0])
        if not all(_lock_is_free(lock_path(folder / other)) for other in others if other != name):
            continue
        path = folder / entry.name
        with contextlib.suppress(OSError):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(path)
    return removed


def remove_dead_temporaries_in(folder: str | os.PathLike) -> list[Path]:
    """The temporaries (names fsutil gives them) a killed writer left inside ``folder``, a folder that only
    one output's writer writes into (a mix.json's index cache) and whose lock the caller holds now."""
    from llmtools.fsutil import TMP_MARK

    removed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            _, mark, rest = entry.name.partition(TMP_MARK)
            if mark and _TEMPORARY.fullmatch(rest) and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
    return removed


@contextlib.contextmanager
def lock_run(run_dir: str | os.PathLike, command: str | None = None) -> Iterator[Lock]:
    """Lock a run folder (``RUN/run.lock``; the folder is created if needed)."""
    with acquire(run_lock_path(run_dir), run_dir, command) as lock:
        yield lock
