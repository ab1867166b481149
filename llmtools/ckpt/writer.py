"""How one rank writes its part of a checkpoint: through sha256 and fsync, now or in the background.

DeepSpeed's ``save_checkpoint`` builds each file's state dict and hands it to ``engine.checkpoint_engine``
(``save(state_dict, path)``). :class:`RankWriter` takes that place for the duration of one save:

* synchronous: each file is written at once through a hashing stream and fsynced; the rank ends up with
  ``{name: {size, sha256}}`` of the files it wrote (no second read of what was just written);
* asynchronous: each state dict is *staged* — every tensor copied to host memory (pinned for CUDA;
  the buffers of the previous save are reused when the shapes match) — and the writing, fsync and hashing
  happen in a background thread while training goes on. torch.save releases the GIL while it writes
  tensor data, so the training thread keeps running.

What DeepSpeed 0.19.8 offers instead was weighed: its default ``TorchCheckpointEngine`` is synchronous;
the "fast" writer (DeepNVMe, ``checkpoint.writer.type: fast``) speeds up the write itself but needs the
``async_io`` op (libaio) and still blocks the caller; the decoupled engine (``writer.decoupled: true``)
hands the live tensors to a spawned process through shared memory and blocks at the *next* optimizer step
until the write is done (the stall shrinks only by one forward/backward), and writes ``latest`` itself
without fsync or an atomic rename; Nebula was removed; DataStates is an outside package not on PyPI. None
commits the way our checkpoints must (every file hashed, meta.json last, rename, then ``latest``), so the
engine slot is used to stage and write our own way, and DeepSpeed still decides what goes in each file.
"""

from __future__ import annotations

import copy
import hashlib
import os
import threading
from pathlib import Path
from typing import Any


class _HashingFile:
    """A write-only binary stream that hashes what passes through it (torch.save accepts any such)."""

    def __init__(self, handle) -> None:
        self._handle = handle
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self.digest.update(view)  # hashlib releases the GIL on large buffers
        self._handle.write(view)
        self.size += view.nbytes
        return view.nbytes

    def flush(self) -> None:
        self._handle.flush()


def write_file(obj: Any, path: str | os.PathLike) -> dict[str, Any]:
    """torch.save ``obj`` to ``path``, fsynced; returns its size and sha256."""
    import torch

    with open(path, "wb") as handle:
        stream = _HashingFile(handle)
        torch.save(obj, stream)
        handle.flush()
        os.fsync(handle.fileno())
    return {"size": stream.size, "sha256": stream.digest.hexdigest()}


def stage(obj: Any, reuse: Any = None) -> Any:
    """A copy of ``obj`` whose tensors live in (pinned, for CUDA) host memory and share nothing with the
    originals, so training may change them at once. ``reuse``: the result of an earlier call on a
    same-shaped ``obj``, whose buffers are filled instead of allocating new ones."""
    import torch

    if isinstance(obj, torch.Tensor):
        source = obj.detach()
        if (
            isinstance(reuse, torch.Tensor)
            and reuse.shape == source.shape
            and reuse.dtype == source.dtype
            and reuse.device.type == "cpu"
        ):
            return reuse.copy_(source, non_blocking=source.is_cuda)
        if source.is_cuda:
            buffer = torch.empty(source.shape, dtype=source.dtype, pin_memory=True)
            return buffer.copy_(source, non_blocking=True)
        return source.clone(memory_format=torch.contiguous_format)
    if isinstance(obj, dict):
        previous = reuse if isinstance(reuse, dict) else {}
        staged = {k: stage(v, previous.get(k)) for k, v in obj.items()}
        if type(obj) is not dict:  # OrderedDict and friends keep their type
            staged = type(obj)(staged)
        return staged
    if isinstance(obj, (list, tuple)):
        previous = reuse if isinstance(reuse, type(obj)) and len(reuse) == len(obj) else [None] * len(obj)
        items = [stage(v, p) for v, p in zip(obj, previous, strict=True)]
        if isinstance(obj, tuple):
            return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
        return items
    return copy.deepcopy(obj)


class RankWriter:
    """Stands in for DeepSpeed's checkpoint engine during one save; then writes what it collected.

    ``files`` maps each written file's name (relative to ``folder``) to its size and sha256 once
    :meth:`write_all` (or the background thread) is done; ``error`` holds what went wrong there.
    """

    def __init__(self, folder: Path, background: bool, reuse: dict[str, Any] | None = None) -> None:
        self.folder = Path(folder)
        self.background = background
        self.name = "llmtools.RankWriter"
        self.files: dict[str, dict[str, Any]] = {}
        self.pending: list[tuple[str, Any]] = []
        self.error: BaseException | None = None
        self._reuse = reuse or {}
        self._thread: threading.Thread | None = None

    # -- DeepSpeed's CheckpointEngine interface (what save_checkpoint calls) ------------------------------
    def create(self, info) -> None:
        pass

    def makedirs(self, path, exist_ok: bool = False) -> None:
        os.makedirs(path, exist_ok=exist_ok)

    def save(self, state_dict, path: str) -> None:
        name = Path(path).resolve().relative_to(self.folder.resolve()).as_posix()
        self.add(name, state_dict)

    def load(self, path: str, map_location=None):
        raise RuntimeError("RankWriter only saves")

    def commit(self, info) -> bool:
        return True

    def is_data_parallel_writer(self, dp_rank: int) -> bool:
        return dp_rank == 0

    def is_decoupled(self) -> bool:
        return False

    def preserves_storage_sharing(self) -> bool:
        # Staging already copies every tensor into its own storage; DeepSpeed need not clone first.
        return not self.background

    def set_commit_info(self, info) -> None:
        pass

    def get_commit_info(self):
        return None

    def cleanup(self) -> None:
        pass

    # -- ours ---------------------------------------------------------------------------------------------
    def add(self, name: str, obj: Any) -> None:
        """One more file: written now (synchronous) or staged for the background thread."""
        if self.background:
            self.pending.append((name, stage(obj, self._reuse.get(name))))
        else:
            self.files[name] = write_file(obj, self.folder / name)

    def staged(self) -> dict[str, Any]:
        """The staged state dicts by file name (buffers for the next save to reuse)."""
        return dict(self.pending)

    def start(self) -> None:
        """Write the staged files in a background thread (after the last :meth:`add`)."""
        if not self.background:
            return
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the non-blocking copies into pinned memory have landed
        # A daemon thread: a rank that dies abandons its write, which leaves only a .tmp- folder behind.
        self._thread = threading.Thread(target=self._write_pending, name="llmtools-ckpt-writer", daemon=True)
        self._thread.start()

    def _write_pending(self) -> None:
        try:
            for name, obj in self.pending:
                self.files[name] = write_file(obj, self.folder / name)
        except BaseException as error:  # noqa: BLE001 - reported to every rank by the manager
            self.error = error

    def done(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
