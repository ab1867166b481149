"""Read ``torch.save`` files without running code from them: one allowlist of the globals they may name.

A ``.pt`` file is a pickle, and unpickling calls whatever globals the file names: a checkpoint from
elsewhere can run any code. Every ``.pt`` llmtools reads goes through one of two gates built on the one
table :data:`ALLOWED` below (the globals DeepSpeed's model and optimizer states, our RNG files,
``import-hf`` folders, LoRA and ``init_from`` checkpoints really hold at ZeRO 0-3, fp32 and bf16; found by
listing the pickles' GLOBAL opcodes over real checkpoints: :func:`globals_in`):

* :func:`load` — the whole file: torch's weights-only unpickler with :data:`ALLOWED` added to torch's
  own list, over the bytes the archive check accepted (``torch.load`` never parses the file: a second
  zip reader could find other bytes than the check did);
* :func:`llmtools.ckpt.torchfile.load_lazy` — structure now, tensor bytes on demand: a restricted
  unpickler whose ``find_class`` answers only names in :data:`ALLOWED` (with inert stand-ins where the
  real object is not needed).

A disallowed global raises :class:`UnsafeFileError` (an :class:`InputError`: exit 2) naming the file and
the global, before anything it names is looked up. :func:`check_file` runs the lazy gate over a file
without reading tensor data: ``llm-ckpt verify`` runs it over every ``.pt`` of a checkpoint, so a
checkpoint that verifies is safe to hand to DeepSpeed. :func:`guard_engine` routes DeepSpeed's own reads
(``engine.load_checkpoint``) through :func:`load` as well, so nothing changes between the check and the
load.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import pickle
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from llmtools.errors import InputError

_STORAGE = "a dtype tag in the persistent id of every tensor's storage (never called)"
_STORAGE_KINDS = ("Float", "BFloat16", "Half", "Double", "Long", "Int", "Short", "Char", "Byte", "Bool")
_TENSOR = "torch's own tensor format: rebuilds a tensor view of a storage from (offset, size, stride)"

# (module, name) -> why it is safe and which of our files hold it. Nothing else is ever looked up.
ALLOWED: dict[tuple[str, str], str] = {
    ("collections", "OrderedDict"): "state dicts: module weights, optimizer groups, param_shapes",
    ("builtins", "set"): "DeepSpeed's sparse_tensor_module_names (import-hf model states)",
    ("_codecs", "encode"): "how pickle protocol 2 writes bytes (the RNG files' numpy key); latin-1 only",
    ("torch._utils", "_rebuild_tensor_v2"): _TENSOR,
    ("torch._utils", "_rebuild_parameter"): _TENSOR + " (an nn.Parameter)",
    ("torch._utils", "_rebuild_parameter_with_state"): _TENSOR + " (an nn.Parameter with attributes)",
    ("torch._tensor", "_rebuild_from_type_v2"): "ZeRO-3 optimizer states: fp32 flat groups saved as Tensor",
    ("torch", "Tensor"): "the type argument of _rebuild_from_type_v2 (ZeRO-3 optimizer states)",
    ("torch", "Size"): "DeepSpeed's param_shapes (model states)",
    **{("torch", f"{kind}Storage"): _STORAGE for kind in _STORAGE_KINDS},
    ("numpy._core.multiarray", "_reconstruct"): "numpy's array format: the RNG files' numpy MT19937 key",
    ("numpy.core.multiarray", "_reconstruct"): "the same, as numpy 1.x names it",
    ("numpy", "ndarray"): "the type argument of _reconstruct (RNG files)",
    ("numpy", "dtype"): "the key array's dtype (RNG files)",
    ("numpy.dtypes", "UInt32DType"): "the type of that dtype, which torch's loader checks before BUILD",
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"): "ZeRO 1-3 optimizer states: a static loss scale",
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"): "ZeRO 1-3 optimizer states: the stage (an int enum)",
    ("deepspeed.utils.tensor_fragment", "fragment_address"): "ZeRO 1-2 optimizer states: (numel, start)",
}


class UnsafeFileError(InputError):
    """A ``.pt`` file names a global outside :data:`ALLOWED`; nothing it names was looked up."""

    def __init__(self, path: str | os.PathLike, module: str, name: str) -> None:
        self.path, self.global_name = Path(path), f"{module}.{name}"
        super().__init__(
            f"{path}: refusing to load: it names the global {module}.{name}, which llmtools checkpoints "
            "never hold (unpickling it could run code); see docs/trust-checkpoints.md"
        )

    def __reduce__(self):  # raised in a worker process: arrives in the parent as the same message
        return InputError, (str(self),)


def normalized(module: str, name: str) -> tuple[str, str]:
    """Python 2 names mapped as pickle maps them (protocol 2 writes ``__builtin__.set``)."""
    import _compat_pickle

    if (module, name) in _compat_pickle.NAME_MAPPING:
        return _compat_pickle.NAME_MAPPING[(module, name)]
    return _compat_pickle.IMPORT_MAPPING.get(module, module), name


def allowed_name(path: str | os.PathLike, module: str, name: str) -> tuple[str, str]:
    """``(module, name)`` normalized, or :class:`UnsafeFileError` when it is not in :data:`ALLOWED`."""
    module, name = normalized(module, name)
    if (module, name) not in ALLOWED:
        raise UnsafeFileError(path, module, name)
    return module, name


def latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    """``_codecs.encode`` as protocol 2 uses it for bytes, and nothing else (no other codec is looked up)."""
    if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
        raise pickle.UnpicklingError(f"_codecs.encode with {encoding!r}: only latin1 strings are allowed")
    return text.encode("latin1")


@functools.cache
def _safe_objects(with_deepspeed: bool) -> tuple:
    """The real objects of :data:`ALLOWED`, as ``torch.serialization.safe_globals`` wants them.

    DeepSpeed's classes are named only when DeepSpeed is already imported (its engine is the only reader
    of the files that hold them): importing it just to read a model-states file would cost seconds.
    """
    objects = []
    for module, name in ALLOWED:
        if module.startswith("deepspeed") and not with_deepspeed:
            continue
        if module.split(".")[0] in ("torch", "collections", "builtins", "_codecs"):
            continue  # on torch's own weights-only list already
        try:
            obj = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue  # e.g. numpy 1.x has no numpy._core: its own name is in the table too
        objects.append((obj, f"{module}.{name}"))
    return tuple(objects)


def load(path: str | os.PathLike, *, map_location: Any = "cpu", mmap: bool = False) -> Any:
    """A whole ``torch.save`` file, weights only, with :data:`ALLOWED`; InputError naming what is wrong.

    torch never opens the file: the archive is checked (:func:`llmtools.ckpt.archive.read_index`), its
    ``data.pkl`` read at the checked offset (CRC-32 checked) and bounded
    (:func:`llmtools.ckpt.picklebounds.check`), then unpickled by torch's weights-only unpickler, which
    gets each storage as the bytes at the offset the check accepted (CRC-32 checked; ``mmap``: a slice of
    the mapped file at that offset). A second zip reader that could find other bytes is never asked.
    """
    from llmtools.ckpt.archive import read_index
    from llmtools.ckpt.picklebounds import check
    from llmtools.ckpt.torchfile import read_pickle

    path = Path(path)
    index = read_index(path)
    data = read_pickle(index)
    check(data, f"{path}:data.pkl")
    try:
        try:
            return _load_checked(index, data, map_location, mmap)
        except pickle.UnpicklingError:
            check_file(path)  # names the first global outside the table, if that is what torch refused
            if "deepspeed" in sys.modules or not any(m.startswith("deepspeed") for m, _ in globals_in(path)):
                raise
            from llmtools.thirdparty import import_deepspeed

            import_deepspeed()  # the file holds DeepSpeed's (allowed) classes: name them, retry

            return _load_checked(index, data, map_location, mmap)
    except InputError:
        raise
    except pickle.UnpicklingError as error:
        raise InputError(f"{path}: cannot load ({_torch_reason(error)})") from None
    except FileNotFoundError:
        raise InputError(f"{path}: missing") from None
    except MemoryError:
        raise
    except Exception as error:  # noqa: BLE001 - whatever a crafted pickle makes the unpickler raise is bad input
        if type(error).__name__ == "OutOfMemoryError":  # torch's: the machine, not the file
            raise
        raise InputError(f"{path}: not a readable torch file ({_torch_reason(error)})") from None


def _load_checked(index, data: bytes, map_location: Any, mmap: bool) -> Any:
    """torch's weights-only unpickler over ``data``, each storage made from the checked record's bytes."""
    import zlib

    import torch
    import torch.serialization as serialization
    from torch import _weights_only_unpickler

    from llmtools.ckpt.archive import check_crc, read_record
    from llmtools.ckpt.picklebounds import reading

    path = index.path
    byteorder = "little"
    if index.get("byteorder") is not None:
        byteorder = read_record(index, "byteorder", 16).decode("latin1")
        if byteorder not in ("little", "big"):
            raise InputError(f"{path}: byteorder record {byteorder!r} (little or big)")
    restore = serialization._get_restore_location(map_location)
    loaded: dict[str, Any] = {}

    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        mapped = torch.UntypedStorage.from_file(os.fspath(path), False, size) if mmap else None

        def storage_bytes(record, nbytes: int):
            if mapped is not None:
                storage = mapped[record.offset : record.offset + nbytes]
                view = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (nbytes,), (1,))
            else:
                view = torch.empty(nbytes, dtype=torch.uint8)
                handle.seek(record.offset)
                if nbytes and handle.readinto(memoryview(view.numpy())) != nbytes:
                    raise InputError(f"{path}: truncated while it was read")
                storage = view.untyped_storage()
            check_crc(index, record, zlib.crc32(memoryview(view.numpy())) if nbytes else 0)
            return storage

        def persistent_load(saved_id):
            if not isinstance(saved_id, tuple) or len(saved_id) != 5:
                raise InputError(f"{path}: malformed persistent id in data.pkl")
            kind, storage_type, key, location, numel = (
                serialization._maybe_decode_ascii(v) if isinstance(v, bytes) else v for v in saved_id
            )
            dtype = (
                torch.uint8 if storage_type is torch.UntypedStorage else getattr(storage_type, "dtype", None)
            )
            if kind != "storage" or not isinstance(dtype, torch.dtype) or not isinstance(key, str):
                raise InputError(f"{path}: malformed persistent id in data.pkl")
            if key in loaded:
                return loaded[key]
            record = index.get(f"data/{key}")
            if record is None:
                raise InputError(f"{path}: storage {key!r} missing from the archive")
            if (
                type(numel) is not int
                or numel < 0
                or numel * torch._utils._element_size(dtype) != record.size
            ):
                raise InputError(
                    f"{path}: storage {key} claims {numel} elements but holds {record.size} bytes"
                )
            storage = storage_bytes(record, record.size)
            if byteorder != sys.byteorder:
                storage.byteswap(dtype)
            typed = torch.storage.TypedStorage(
                wrap_storage=restore(storage, str(location)), dtype=dtype, _internal=True
            )
            loaded[key] = typed
            return typed

        with (
            reading(data, f"{path}:data.pkl") as file,
            torch.serialization.safe_globals(list(_safe_objects("deepspeed" in sys.modules))),
        ):
            unpickler = _weights_only_unpickler.Unpickler(file, encoding="utf-8")
            unpickler.persistent_load = persistent_load
            serialization._serialization_tls.map_location = map_location
            try:
                result = unpickler.load()
            finally:
                serialization._serialization_tls.map_location = None
        torch._utils._validate_loaded_sparse_tensors()
        return result


def check_file(path: str | os.PathLike, crcs: bool = False) -> Any:
    """Unpickle the structure of ``path`` through the lazy gate (no tensor data is read); return it.
    ``crcs``: check every record's CRC-32 as well (reads the whole file)."""
    from llmtools.ckpt.torchfile import load_lazy

    structure = load_lazy(path)
    if crcs:
        from llmtools.ckpt.archive import check_crcs, read_index

        check_crcs(read_index(path))
    return structure


def guard_engine(engine) -> None:
    """Make ``engine.load_checkpoint`` read DeepSpeed's files through :func:`load`.

    DeepSpeed (0.19) reads model and ZeRO optimizer states with ``engine.checkpoint_engine.load(path,
    map_location)``, which calls ``torch.load(weights_only=False)``. This replaces that one method on this
    engine's checkpoint engine (not on the class, not for other engines). DeepSpeed's tools
    (``ds_to_universal`` in its child, ``zero_to_fp32``, the universal loader) call ``torch.load``
    themselves: :func:`routed_torch_load` sends those calls here too.
    """
    checkpoint_engine = getattr(engine, "checkpoint_engine", None)
    if checkpoint_engine is None or getattr(checkpoint_engine, "_llmtools_safe", False):
        return

    def safe_load(path, map_location=None):
        return load(path, map_location=map_location if map_location is not None else "cpu")

    checkpoint_engine.load = safe_load
    checkpoint_engine._llmtools_safe = True


@contextlib.contextmanager
def routed_torch_load() -> Iterator[None]:
    """Within the block, every ``torch.load`` (however DeepSpeed calls it) reads through :func:`load`.

    For third-party code that loads checkpoint files itself, with ``weights_only=False``: DeepSpeed's
    ``zero_to_fp32``, its universal checkpoint loader and ``ds_to_universal`` (run in a child process
    through :mod:`llmtools.ckpt.dstool`). Only paths are accepted: a file object would bypass the archive
    check.
    """
    import torch
    import torch.serialization

    original = torch.load
    if hasattr(original, "_llmtools_original"):  # already routed (nested)
        yield
        return

    def safe_torch_load(f, map_location=None, pickle_module=None, *, weights_only=None, mmap=None, **_kw):
        if not isinstance(f, (str, os.PathLike)):
            raise InputError(f"{f!r}: refusing to load a checkpoint from anything but a file path")
        return load(f, map_location=map_location if map_location is not None else "cpu", mmap=bool(mmap))

    safe_torch_load._llmtools_original = original
    torch.load = torch.serialization.load = safe_torch_load
    try:
        yield
    finally:
        torch.load = torch.serialization.load = original


def globals_in(path: str | os.PathLike) -> list[tuple[str, str]]:
    """Every global a ``torch.save`` file names, in order, read statically (``pickletools``; nothing runs).

    How :data:`ALLOWED` was found (``python -m llmtools.ckpt.safeload RUN/checkpoints/step_*/*.pt``
    lists them, file by file, allowed or not). Names pushed by anything but a literal string (which no
    pickler writes) come back as ``("?", "?")``.
    """
    import pickletools

    from llmtools.ckpt.archive import read_index
    from llmtools.ckpt.torchfile import read_pickle

    data = read_pickle(read_index(path))
    found: list[tuple[str, str]] = []
    stack: list[Any] = []  # only what STACK_GLOBAL needs: the last values pushed, strings or None
    memo: dict[int, Any] = {}
    for op, arg, _pos in pickletools.genops(data):
        if op.name in ("GLOBAL", "INST"):
            module, name = arg.split(" ", 1)
            found.append((module, name))
            stack.append(None)
        elif op.name == "STACK_GLOBAL":
            module, name = (stack[-2], stack[-1]) if len(stack) >= 2 else (None, None)
            found.append((module, name) if isinstance(module, str) and isinstance(name, str) else ("?", "?"))
            stack.append(None)
        elif op.name in ("BINPUT", "LONG_BINPUT", "PUT"):
            memo[arg] = stack[-1] if stack else None
        elif op.name == "MEMOIZE":
            memo[len(memo)] = stack[-1] if stack else None
        elif op.name in ("BINGET", "LONG_BINGET", "GET"):
            stack.append(memo.get(arg))
        elif op.name.endswith(("UNICODE", "STRING", "UNICODE8")):
            stack.append(arg)
        elif op.name.startswith("EXT"):
            found.append(("?", f"extension code {arg}"))
            stack.append(None)
        else:
            stack.append(None)
    return found


def _torch_reason(error: BaseException) -> str:
    """The informative line of torch's (long, multi-line) load errors."""
    import re

    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(error).splitlines()]
    lines = [line for line in lines if line]
    for line in lines:
        if "Unsupported" in line or "unsupported" in line:
            return line.removeprefix("WeightsUnpickler error: ")
    return lines[-1] if lines else type(error).__name__


def _main(argv: list[str]) -> int:
    """Every global each file names, and whether the allowlist has it; exit 1 if any is missing."""
    missing = 0
    for name in argv:
        print(name)
        for module, attr in dict.fromkeys(globals_in(name)):
            reason = ALLOWED.get(normalized(module, attr))
            missing += reason is None
            print(f"  {'ok ' if reason else 'NOT'} {module}.{attr}" + (f"  ({reason})" if reason else ""))
    return 1 if missing else 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
