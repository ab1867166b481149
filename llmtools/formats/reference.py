"""Stored reference log-probabilities for preference training, tied to what they were computed from.

A folder (``RUN/reference/`` by default) holding two files, written together and renamed into place::

    logps.npy        float64 (pairs, 2): log pi_ref(chosen | prompt), log pi_ref(rejected | prompt) per pair
    reference.json   format, version, tool, created, the identity below, and the array's shape and sha256

The identity says what the numbers depend on: the starting weights (sha256 over every parameter's name,
shape, dtype and bytes; the frozen base alone with LoRA), the model config, the data files (sha256 of each
``.bin``/``.idx``, by file name, so a moved data folder still matches) and the pair count, and the sequence
length the sequences were cut to. :func:`read_reference` hands the array back only when every part equals
the current run's; otherwise it raises a :class:`ReferenceMismatch` (an input error) naming what differs. The
folder is untrusted input: the array is read without pickle, from the one file name this module writes,
and checked against its recorded checksum, shape, dtype and finiteness.
"""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path
from typing import Any

import numpy as np

from llmtools import __version__
from llmtools.errors import InputError
from llmtools.formats import jsonfile
from llmtools.formats.jsonfile import read_json_object
from llmtools.fsutil import atomic_dir, sha256_file

FORMAT = "llmtools.dpo-reference"
VERSION = 1
LOGPS_FILE = "logps.npy"
META_FILE = "reference.json"
COLUMNS = ("chosen", "rejected")
COMPARED = ("weights", "model", "data", "seq_length")


def write_reference(folder: str | os.PathLike, logps: np.ndarray, identity: dict[str, Any]) -> Path:
    """Write ``logps`` (pairs x 2) and its identity as one folder, replacing an earlier one of ours."""
    logps = np.ascontiguousarray(logps, dtype=np.float64)
    if logps.ndim != 2 or logps.shape[1] != 2:
        raise ValueError(f"reference log-probs must have shape (pairs, 2), got {logps.shape}")
    folder = Path(folder)
    with atomic_dir(folder, force=True) as tmp:
        np.save(tmp / LOGPS_FILE, logps, allow_pickle=False)
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "tool": f"llmtools {__version__}",
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "identity": identity,
            "logps": {
                "file": LOGPS_FILE,
                "shape": list(logps.shape),
                "dtype": "float64",
                "columns": list(COLUMNS),
                "sha256": sha256_file(tmp / LOGPS_FILE),
            },
        }
        (tmp / META_FILE).write_text(jsonfile.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return folder


class ReferenceMismatch(InputError):
    """A stored reference computed from something else; ``parts`` names what differs (``COMPARED`` keys)."""

    def __init__(self, message: str, parts: list[str]) -> None:
        super().__init__(message)
        self.parts = parts


def exists(folder: str | os.PathLike) -> bool:
    return (Path(folder) / META_FILE).is_file()


def differing(stored: dict, current: dict) -> list[str]:
    """The parts of two identities that differ (``COMPARED`` keys)."""
    return [key for key in COMPARED if stored.get(key) != current.get(key)]


def differences(stored: dict, current: dict) -> list[str]:
    """What differs between two identities, in words (empty when they match)."""
    out = []
    for key in differing(stored, current):
        a, b = stored.get(key), current.get(key)
        if key == "weights":
            out.append(
                f"starting weights (sha256 {_short((a or {}).get('sha256'))} there, "
                f"{_short((b or {}).get('sha256'))} now)"
            )
        elif key == "data":
            out.append(_data_difference(a or {}, b or {}))
        elif key == "model":
            keys = sorted(k for k in set(a or {}) | set(b or {}) if (a or {}).get(k) != (b or {}).get(k))
            out.append(f"model config ({', '.join(keys) or 'all'})")
        else:
            out.append(f"{key} ({a} there, {b} now)")
    return out


def _short(digest) -> str:
    return str(digest)[:12] if digest else "none"


def _data_difference(a: dict, b: dict) -> str:
    if a.get("pairs") != b.get("pairs"):
        return f"data ({a.get('pairs')} pairs there, {b.get('pairs')} now)"
    files_a, files_b = a.get("files") or {}, b.get("files") or {}
    changed = sorted(k for k in set(files_a) | set(files_b) if files_a.get(k) != files_b.get(k))
    return f"data ({', '.join(changed) or 'files'} differ)"


def read_reference(folder: str | os.PathLike, identity: dict[str, Any]) -> np.ndarray:
    """The stored log-probs, when ``folder`` holds a valid reference computed from exactly ``identity``."""
    folder = Path(folder)
    meta_path = folder / META_FILE
    if not meta_path.is_file():
        raise InputError(f"{folder}: no stored reference ({META_FILE} missing)")
    meta = read_json_object(meta_path, "reference file", ours=True)
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise InputError(
            f"{meta_path}: not a reference of this llmtools (format {meta.get('format')!r}, "
            f"version {meta.get('version')!r}; expected {FORMAT!r} version {VERSION})"
        )
    stored = meta.get("identity")
    if not isinstance(stored, dict):
        raise InputError(f"{meta_path}[identity]: missing or not an object")
    differ = differences(stored, identity)
    if differ:
        raise ReferenceMismatch(
            f"{folder}: the stored reference log-probs were computed from other "
            f"{'; '.join(differ)}: they do not belong to this run",
            differing(stored, identity),
        )
    info = meta.get("logps")
    if not isinstance(info, dict) or not isinstance(info.get("sha256"), str):
        raise InputError(f"{meta_path}[logps]: missing or without a sha256")
    path = folder / LOGPS_FILE  # the one name we write: a path recorded in the file is never followed
    if not path.is_file() or path.is_symlink():
        raise InputError(f"{path}: missing (or not a plain file)")
    if sha256_file(path) != info["sha256"]:
        raise InputError(f"{path}: checksum differs from {META_FILE} (the file was changed or is damaged)")
    try:
        logps = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as error:
        raise InputError(f"{path}: not a readable .npy array ({error})") from None
    pairs = (identity.get("data") or {}).get("pairs")
    if logps.dtype != np.float64 or logps.shape != (pairs, 2):
        raise InputError(f"{path}: expected float64 ({pairs}, 2), got {logps.dtype} {logps.shape}")
    if not np.isfinite(logps).all():
        raise InputError(f"{path}: holds non-finite log-probabilities")
    if (logps > 0).any():
        pair, side = (int(i) for i in np.argwhere(logps > 0)[0])
        raise InputError(
            f"{path}: pair {pair} ({('chosen', 'rejected')[side]}) has log-probability {logps[pair, side]:.6g} > 0 "
            "(a log-probability is at most 0)"
        )
    return logps
