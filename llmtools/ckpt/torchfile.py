"""Read ``torch.save`` files lazily: the pickled structure at once, tensor bytes only when asked.

DeepSpeed's optimizer files hold the fp32 master weights *and* Adam's two moments; ``torch.load`` reads all
of it (``mmap=True`` maps it, but every page touched then counts in the resident set until the process
ends). Conversion needs only slices of the fp32 flat groups, so this reader unpickles ``data.pkl`` with
placeholder storages that remember where their bytes lie in the zip archive (torch stores them
uncompressed), and reads a slice with a plain ``seek`` + ``readinto``: the bytes pass through the page
cache, never stay in the process.

Only the zip format of ``torch.save`` (the default since torch 1.6) is supported.
"""

from __future__ import annotations

import pickle
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmtools.errors import InputError

_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")


@dataclass
class LazyStorage:
    path: Path
    offset: int  # byte offset of the storage's first byte in the file
    dtype: Any  # torch.dtype
    numel: int


@dataclass
class LazyTensor:
    storage: LazyStorage
    storage_offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

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


def _rebuild_tensor(storage, storage_offset, size, stride, *_args):
    return LazyTensor(storage, storage_offset, tuple(size), tuple(stride))


def _rebuild_parameter(data, *_args):
    return data


def _rebuild_from_type_v2(func, _new_type, args, _state):
    # Tensor subclasses (ZeRO-3 saves nn.Parameter this way): keep the plain lazy tensor.
    return func(*args)


def _local_data_offset(handle, info: zipfile.ZipInfo) -> int:
    handle.seek(info.header_offset)
    header = _LOCAL_HEADER.unpack(handle.read(_LOCAL_HEADER.size))
    if header[0] != b"PK\x03\x04":
        raise InputError(f"{handle.name}@byte {info.header_offset}: bad zip local header")
    name_len, extra_len = header[9], header[10]
    return info.header_offset + _LOCAL_HEADER.size + name_len + extra_len


def load_lazy(path: str | Path) -> Any:
    """Unpickle a ``torch.save`` file; tensors come back as :class:`LazyTensor`."""
    import torch
    from torch.storage import _get_dtype_from_pickle_storage_type

    path = Path(path)
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as error:
        raise InputError(f"{path}: not a readable torch zip file ({error})") from error
    with archive, open(path, "rb") as handle:
        names = archive.namelist()
        pkl = next((n for n in names if n.endswith("/data.pkl") or n == "data.pkl"), None)
        if pkl is None:
            raise InputError(f"{path}: no data.pkl in the archive (not a torch.save file)")
        prefix = pkl[: -len("data.pkl")]
        infos = {info.filename: info for info in archive.infolist()}

        def persistent_load(pid):
            kind, storage_type, key, _location, numel = pid
            if kind != "storage":
                raise InputError(f"{path}: unknown persistent id {kind!r}")
            info = infos.get(f"{prefix}data/{key}")
            if info is None:
                raise InputError(f"{path}: storage {key} missing from the archive")
            if info.compress_type != zipfile.ZIP_STORED:
                raise InputError(f"{path}: storage {key} is compressed; cannot read it lazily")
            name = storage_type.__name__ if isinstance(storage_type, type) else str(storage_type)
            dtype = torch.uint8 if name == "UntypedStorage" else _get_dtype_from_pickle_storage_type(name)
            return LazyStorage(path, _local_data_offset(handle, info), dtype, numel)

        class _Unpickler(pickle.Unpickler):
            def find_class(self, module, name):
                if module == "torch._utils" and name == "_rebuild_tensor_v2":
                    return _rebuild_tensor
                if module == "torch._utils" and name in (
                    "_rebuild_parameter",
                    "_rebuild_parameter_with_state",
                ):
                    return _rebuild_parameter
                if module == "torch._tensor" and name == "_rebuild_from_type_v2":
                    return _rebuild_from_type_v2
                return super().find_class(module, name)

            def persistent_load(self, pid):
                return persistent_load(pid)

        with archive.open(pkl) as stream:
            try:
                return _Unpickler(stream).load()
            except (pickle.UnpicklingError, EOFError, AttributeError, ModuleNotFoundError) as error:
                raise InputError(f"{path}: cannot unpickle ({error})") from error
