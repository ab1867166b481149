"""The compiled helpers, loaded with ctypes; exact numpy/Python fallbacks when absent.

One shared library from two C files: ``mixhelpers.c`` (llm-mix's index builders) and ``jsonl.c``
(json2bin's JSON Lines text extraction). Where it comes from, first found wins:

1. the extension that ``pip install`` built (``setup.py``: ``llmtools/_native/_helpers*.so``);
2. a copy compiled on first use with the system C compiler into ``$LLMTOOLS_CACHE`` (default
   ``~/.cache/llmtools``), named by the hash of the source so an edit never loads a stale build;
3. nothing: :func:`load` returns None and callers use their (exact but slower) numpy/Python code,
   after one warning.

``LLMTOOLS_NO_NATIVE=1`` skips 1 and 2 (the tests use it to check the fallbacks).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import warnings
from pathlib import Path

from llmtools.fsutil import cache_dir

ABI_VERSION = 5
SOURCES = [Path(__file__).with_name(name) for name in ("mixhelpers.c", "jsonl.c")]
# No -march=native and no contraction: the greedy blend must evaluate w*x - c exactly as Megatron's build does.
CFLAGS = ["-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math"]

_lib: ctypes.CDLL | None = None
_tried = False
_warned = False

_i16p = ctypes.POINTER(ctypes.c_int16)
_i32p = ctypes.POINTER(ctypes.c_int32)
_i64p = ctypes.POINTER(ctypes.c_int64)
_f64p = ctypes.POINTER(ctypes.c_double)
_u8p = ctypes.POINTER(ctypes.c_uint8)


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.llm_abi_version.restype = ctypes.c_int32
    lib.llm_abi_version.argtypes = []
    lib.llm_blend_indices.restype = None
    lib.llm_blend_indices.argtypes = [_f64p, ctypes.c_int32, ctypes.c_int64, _i16p, _i64p, _i64p]
    lib.llm_blend_indices_continued.restype = None
    lib.llm_blend_indices_continued.argtypes = [
        _f64p,
        ctypes.c_int32,
        ctypes.c_int64,
        _i16p,
        _i64p,
        _i16p,
        _i64p,
        _i64p,
    ]
    lib.llm_sample_idx.restype = ctypes.c_int64
    lib.llm_sample_idx.argtypes = [
        _i32p,
        _i32p,
        ctypes.c_int64,
        ctypes.c_int32,
        ctypes.c_int64,
        ctypes.c_int32,
        _i64p,
    ]
    lib.llm_gather_samples.restype = ctypes.c_int64
    lib.llm_gather_samples.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int32,
        _i64p,
        _i32p,
        _i32p,
        _i64p,
        ctypes.c_int64,
        ctypes.c_int64,
        _i64p,
        _i64p,
    ]
    lib.llm_jsonl_extract.restype = ctypes.c_int64
    lib.llm_jsonl_extract.argtypes = [
        ctypes.c_char_p,
        ctypes.c_int64,
        ctypes.c_char_p,
        ctypes.c_int64,
        ctypes.c_void_p,
        _i64p,
        ctypes.c_int64,
    ]
    lib.llm_count_newlines.restype = ctypes.c_int64
    lib.llm_count_newlines.argtypes = [ctypes.c_char_p, ctypes.c_int64]
    lib.llm_check_index.restype = ctypes.c_int64
    lib.llm_check_index.argtypes = [
        _i32p,
        _i64p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int64,
        _i64p,
        ctypes.c_int64,
    ]
    return lib


def _open(path: str) -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL(path)
        if lib.llm_abi_version() != ABI_VERSION:
            return None
        return _declare(lib)
    except (OSError, AttributeError):
        return None


def _installed() -> ctypes.CDLL | None:
    try:
        spec = importlib.util.find_spec("llmtools._native._helpers")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not os.path.exists(spec.origin):
        return None
    built = os.stat(spec.origin).st_mtime
    if any(source.exists() and source.stat().st_mtime > built for source in SOURCES):
        return None  # an editable install whose C source was edited since: compile the new one instead
    return _open(spec.origin)


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), sysconfig.get_config_var("CC"), "cc", "gcc", "clang"):
        if name:
            exe = shutil.which(name.split()[0])
            if exe:
                return exe
    return None


def compile_into_cache() -> Path | None:
    """Compile the C sources into the per-user cache (atomically); the path, or None if impossible."""
    if not all(source.exists() for source in SOURCES):
        return None
    digest = hashlib.sha256(
        b"".join(source.read_bytes() for source in SOURCES) + " ".join(CFLAGS).encode()
    ).hexdigest()[:16]
    tag = f"{sys.platform}-{os.uname().machine if hasattr(os, 'uname') else 'x'}"
    target = cache_dir() / f"helpers-{digest}-{tag}.so"
    if target.exists():
        return target
    cc = _compiler()
    if cc is None:
        return None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=target.name + ".tmp-", dir=target.parent)
        os.close(fd)
    except OSError:
        return None
    try:
        result = subprocess.run(
            [cc, *CFLAGS, "-o", tmp, *map(str, SOURCES)], capture_output=True, text=True, timeout=120
        )
        if result.returncode != 0:
            return None
        os.replace(tmp, target)  # concurrent first uses each compile; the last rename wins, all equal
        return target
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load() -> ctypes.CDLL | None:
    """The native library, or None (callers then use their numpy/Python fallback)."""
    global _lib, _tried
    if _tried:
        return _lib
    _tried = True
    if os.environ.get("LLMTOOLS_NO_NATIVE", "") not in ("", "0"):
        return None
    _lib = _installed()
    if _lib is None:
        path = compile_into_cache()
        _lib = _open(str(path)) if path is not None else None
    return _lib


def warn_fallback(what: str) -> None:
    """Say once that the slow path is in use, and how to get the fast one."""
    global _warned
    if _warned or os.environ.get("LLMTOOLS_NO_NATIVE", "") not in ("", "0"):
        return
    _warned = True
    warnings.warn(
        f"llmtools: the compiled helpers are unavailable (no C compiler?); {what} uses a slower "
        "pure-Python/numpy path with identical results. Reinstall with a C compiler to speed it up.",
        RuntimeWarning,
        stacklevel=3,
    )


def ptr(array, kind):
    """A ctypes pointer to a C-contiguous numpy array's data."""
    return array.ctypes.data_as(kind)
