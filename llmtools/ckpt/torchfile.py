"""Read ``torch.save`` files lazily: the pickled structure at once, tensor bytes only when asked.

DeepSpeed's optimizer files hold the fp32 master weights *and* Adam's two moments; ``torch.load`` reads all
of it (``mmap=True`` maps it, but every page touched then counts in the resident set until the process
ends). Conversion needs only slices of the fp32 flat groups, so this reader unpickles ``data.pkl`` with
placeholder storages that remember where their bytes lie in the zip archive (torch stores them
uncompressed), and reads a slice with a plain ``seek`` + ``readinto``: the bytes pass through the page
cache, never stay in the process.

Only the zip format of ``torch.save`` (the default since torch 1.6) is supported. The unpickler looks up
only the globals of :data:`llmtools.ckpt.safeload.ALLOWED` (anything else is
:class:`~llmtools.ckpt.safeload.UnsafeFileError`, before it is imported), and puts inert stand-ins where
the real object is not needed, so reading a checkpoint's structure imports neither DeepSpeed nor runs code.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmtools.ckpt.safeload import allowed_name, latin1_encode
from llmtools.errors import InputError


@dataclass
class LazyStorage:
    path: Path
    offset: int  # byte offset of the storage's first byte in the file
    dtype: Any  # torch.dtype
    numel: int

    def __setstate__(self, _state) -> None:  # pickle's BUILD on a storage: no file may retarget one
        raise pickle.UnpicklingError("a storage cannot be given state")


@dataclass
class LazyTensor:
    storage: LazyStorage
    storage_offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    def __setstate__(self, _state) -> None:  # pickle's BUILD on a tensor: no file may retarget one
        raise pickle.UnpicklingError("a tensor cannot be given state")

    @property
    def dtype(self):
        return self.storage.dtype

    def numel(self) -> int:
        total = 1
        for size in self.shape:
            total *= size
        return total

    def is_contiguous(self) -> bool:
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.stride), strict=True):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    def read_flat(self, start: int = 0, count: int | None = None, handle=None):
        """Elements ``[start, start+count)`` of the (contiguous) tensor as a new 1-D torch tensor."""
        import torch

        if not self.is_contiguous():
            raise InputError(f"{self.storage.path}: a non-contiguous tensor cannot be read lazily")
        total = self.numel()
        count = total - start if count is None else count
        if start < 0 or count < 0 or start + count > total:
            raise InputError(
                f"{self.storage.path}: slice [{start}, {start + count}) out of a tensor of {total}"
            )
        if self.storage_offset < 0 or self.storage_offset + total > self.storage.numel:
            raise InputError(
                f"{self.storage.path}: a tensor of {total} elements at offset {self.storage_offset} lies "
                f"outside its storage of {self.storage.numel} (corrupt)"
            )
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        out = torch.empty(count, dtype=self.dtype)
        if count == 0:
            return out
        view = memoryview(out.view(torch.uint8).numpy())
        own = handle is None
        handle = open(self.storage.path, "rb") if own else handle  # noqa: SIM115 - closed below
        try:
            handle.seek(self.storage.offset + (self.storage_offset + start) * itemsize)
            got = handle.readinto(view)
        finally:
            if own:
                handle.close()
        if got != count * itemsize:
            raise InputError(f"{self.storage.path}: truncated (wanted {count * itemsize} bytes, got {got})")
        return out

    def load(self):
        """The whole tensor, materialized."""
        return self.read_flat().view(self.shape) if self.shape else self.read_flat()[0]


def _rebuild_tensor(storage, storage_offset, size, stride, *flags):
    # torch's own takes (requires_grad, backward_hooks[, metadata]) after these: what it would refuse,
    # refused here too, so that a file this reader passes is one torch's loader reads
    if len(flags) not in (2, 3):
        raise pickle.UnpicklingError(f"_rebuild_tensor_v2 with {4 + len(flags)} arguments (6 or 7)")
    if not isinstance(storage, LazyStorage):
        raise pickle.UnpicklingError("a tensor whose storage is not one of the file's storages")
    try:
        shape, strides = tuple(int(s) for s in size), tuple(int(s) for s in stride)
        offset = int(storage_offset)
    except (TypeError, ValueError):
        raise pickle.UnpicklingError("a tensor with a malformed size, stride or offset") from None
    if len(shape) != len(strides) or any(s < 0 for s in shape):
        raise pickle.UnpicklingError(f"a tensor with size {shape} and stride {strides}")
    return LazyTensor(storage, offset, shape, strides)


def _rebuild_parameter(data, *flags):
    if len(flags) != 2:  # requires_grad, backward_hooks
        raise pickle.UnpicklingError(f"_rebuild_parameter with {1 + len(flags)} arguments (3)")
    return data


def _rebuild_parameter_with_state(data, *flags):
    if len(flags) != 3:  # requires_grad, backward_hooks, state
        raise pickle.UnpicklingError(f"_rebuild_parameter_with_state with {1 + len(flags)} arguments (4)")
    return data


def _rebuild_from_type_v2(func, _new_type, args, _state):
    # Tensor subclasses (ZeRO-3 saves nn.Parameter this way): keep the plain lazy tensor.
    if func not in (_rebuild_tensor, _rebuild_parameter, _rebuild_parameter_with_state):
        raise pickle.UnpicklingError("_rebuild_from_type_v2 of something other than a tensor")
    return func(*args)


class _Tag:
    """What a type that is only ever an argument (a storage type, torch.Tensor) unpickles to."""

    def __init__(self, name: str) -> None:
        self.__name__ = name

    def __call__(self, *_args, **_kwargs):
        raise pickle.UnpicklingError(f"{self.__name__} cannot be called here")


class _Record:
    """An inert stand-in for a DeepSpeed object (LossScaler, fragment_address): its attributes only."""

    def __new__(cls, *_args, **_kwargs):
        return object.__new__(cls)

    def __init__(self, *_args, **_kwargs) -> None:
        # Only a call runs __init__ (REDUCE): DeepSpeed's objects are pickled as NEWOBJ with their
        # state after it, and a call with made-up arguments is what the real class would refuse
        raise pickle.UnpicklingError("a DeepSpeed object called with arguments (it is rebuilt from its state)")

    def __repr__(self) -> str:
        return f"_Record({self.__dict__})"


def _enum_value(value):
    """ZeroStageEnum(n) -> n: the stage as a plain int."""
    if not isinstance(value, int):
        raise pickle.UnpicklingError(f"an enum value {value!r} that is not an int")
    return int(value)


def _stand_in(module: str, name: str):
    """What the lazy unpickler puts in place of an allowed global."""
    if module == "torch._utils":
        return {"_rebuild_tensor_v2": _rebuild_tensor, "_rebuild_parameter": _rebuild_parameter}.get(
            name, _rebuild_parameter_with_state
        )
    if module == "torch._tensor":
        return _rebuild_from_type_v2
    if module == "torch" and name != "Size":
        return _Tag(f"torch.{name}")  # storages and torch.Tensor: arguments, never called
    if module == "_codecs":
        return latin1_encode
    if module.startswith("deepspeed"):
        return _enum_value if name == "ZeroStageEnum" else _Record
    if module == "numpy.core.multiarray":
        module = "numpy._core.multiarray"
    import importlib

    return getattr(importlib.import_module(module), name)  # OrderedDict, set, torch.Size, numpy


MAX_PICKLE_BYTES = 64 << 20  # the structure only (tensor bytes are records of their own): a few MB at most


def read_pickle(index) -> bytes:
    """The ``data.pkl`` record of a checked archive (:func:`llmtools.ckpt.archive.read_index`), its CRC-32
    checked."""
    from llmtools.ckpt.archive import read_record

    return read_record(index, "data.pkl", MAX_PICKLE_BYTES)


def load_lazy(path: str | Path) -> Any:
    """Unpickle a ``torch.save`` file; tensors come back as :class:`LazyTensor`.

    The archive is checked first (:func:`llmtools.ckpt.archive.read_index`: one reading that torch's
    reader shares) and the pickle's bounds (:func:`llmtools.ckpt.picklebounds.check`) before it is
    unpickled.
    """
    import torch
    from torch.storage import _get_dtype_from_pickle_storage_type

    from llmtools.ckpt.archive import read_index
    from llmtools.ckpt.picklebounds import bounded_loads

    path = Path(path)
    index = read_index(path)
    data = read_pickle(index)

    def persistent_load(pid):
        kind, storage_type, key, _location, numel = pid
        if kind != "storage":
            raise InputError(f"{path}: unknown persistent id {kind!r}")
        record = index.get(f"data/{key}") if isinstance(key, str) else None
        if record is None:
            raise InputError(f"{path}: storage {key!r} missing from the archive")
        if not isinstance(storage_type, _Tag) or not storage_type.__name__.endswith("Storage"):
            raise InputError(f"{path}: storage {key} has no storage type")
        dtype = _get_dtype_from_pickle_storage_type(storage_type.__name__.removeprefix("torch."))
        itemsize = torch.empty((), dtype=dtype).element_size()
        if not isinstance(numel, int) or numel < 0 or numel * itemsize > record.size:
            raise InputError(f"{path}: storage {key} claims {numel} elements but holds {record.size} bytes")
        return LazyStorage(path, record.offset, dtype, numel)

    class _Unpickler(pickle._Unpickler):  # pure Python: a signal stops it between two opcodes
        def find_class(self, module, name):
            return _stand_in(*allowed_name(path, module, name))

        def persistent_load(self, pid):
            if not isinstance(pid, tuple) or len(pid) != 5:
                raise InputError(f"{path}: malformed persistent id")
            return persistent_load(pid)

    try:
        return bounded_loads(data, f"{path}:data.pkl", _Unpickler)
    except InputError:
        raise
    except Exception as error:  # noqa: BLE001 - any failure to unpickle a hostile file is bad input
        raise InputError(f"{path}: cannot unpickle ({type(error).__name__}: {error})") from None
