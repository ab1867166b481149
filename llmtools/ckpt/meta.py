"""meta.json of a checkpoint: read in one place, every record checked there, before any reader sees it.

meta.json is as untrusted as the rest of a checkpoint folder: whoever can write the folder can write it.
:func:`read_meta` is the only reader: it parses the file and runs every record through its checker in
:data:`RECORDS` (its type, its range, and the inner shape of the records whose insides are read: the
file entries, the parameter shapes, the tensor-parallel layout, the tokenizer identity), so ``verify``,
``list``, ``inspect``, ``convert``, ``eval``, ``init_from`` and a resume all see the same
checked values and a mangled record is one :class:`~llmtools.errors.InputError` naming
``FOLDER/meta.json[record]``, whichever command reads it first. The records whose insides only one
reader interprets (the data ledger, the resolved config) are checked here for their kind (an object or
null) and by that reader for the rest, with the same one-line error.

Records with a structure of their own are read through this module's accessors rather than by key:
:func:`tensor_layout` (the tensor-parallel layout, parsed once into a :class:`TensorLayout`) and
:func:`recorded_tokenizer` (the tokenizer a checkpoint's data was made with, its source resolved against
the run folder, never the current folder).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmtools.ckpt import layout
from llmtools.errors import InputError
from llmtools.formats import jsonfile

REQUIRED_KEYS = ("format", "version", "step", "complete", "files", "world_size", "zero_stage", "precision")
PRECISIONS = ("fp32", "bf16", "fp16")
MAX_DEGREE = 1024
MAX_WORLD = 1 << 17  # ranks: a checkpoint of this kind names world_size files per kind, built as a list
MAX_TIME = 1 << 36  # unix seconds (year ~4100): later is no time a save was made, and no date can show it
_MAX_DIM = 1 << 40


def _is_int(value: Any, low: int = 0, high: int | None = None) -> bool:
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value >= low
        and (high is None or value <= high)
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


def _shape(value: Any) -> bool:
    return isinstance(value, list) and all(_is_int(d, 0, _MAX_DIM) for d in value)


def _str_or_none(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _int_or_none(value: Any) -> bool:
    return value is None or _is_int(value)


_TOKENIZER_FIELDS: dict[str, Callable[[Any], bool]] = {
    "kind": _str_or_none,
    "source": _str_or_none,
    "name": _str_or_none,
    "hash": _str_or_none,
    "vocab_size": _int_or_none,
    "eod_id": _int_or_none,
    "bos_id": _int_or_none,
}

_DATA_FIELDS: dict[str, Callable[[Any], bool]] = {
    "consumed_samples": _int_or_none,
    "fingerprint": _str_or_none,
    "ledger": _optional(lambda v: isinstance(v, dict)),
}


def _fields(checks: dict[str, Callable[[Any], bool]]) -> Callable[[Any], str | None]:
    """A record that is an object (or null) whose named fields, where present, pass their checks."""

    def check(value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            return "an object or null"
        for key, ok in checks.items():
            if key in value and not ok(value[key]):
                return f"an object whose {key!r} is of the right type, not {value[key]!r}"
        return None

    return check


def _plain(ok: Callable[[Any], bool], expected: str) -> Callable[[Any], str | None]:
    return lambda value: None if ok(value) else expected


# record -> its check: None when the value is acceptable, else what was expected (for the message).
RECORDS: dict[str, Callable[[Any], str | None]] = {
    "format": _plain(lambda v: v == layout.META_FORMAT, repr(layout.META_FORMAT)),
    "version": _plain(_is_int, "an integer"),
    "step": _plain(_is_int, "an integer >= 0"),
    "complete": _plain(lambda v: isinstance(v, bool), "true or false"),
    "files": _plain(lambda v: isinstance(v, dict), "an object of file entries"),
    "world_size": _plain(lambda v: _is_int(v, 1, MAX_WORLD), f"an integer 1..{MAX_WORLD}"),
    "zero_stage": _plain(lambda v: _is_int(v, 0, 3), "0, 1, 2 or 3"),
    "precision": _plain(lambda v: v in PRECISIONS, " or ".join(PRECISIONS)),
    "dp_world_size": _plain(_optional(lambda v: _is_int(v, 1, MAX_WORLD)), f"an integer 1..{MAX_WORLD}"),
    "consumed_samples": _plain(_int_or_none, "an integer >= 0 or null"),
    "consumed_tokens": _plain(_int_or_none, "an integer >= 0 or null"),
    "param_shapes": _plain(
        _optional(lambda v: isinstance(v, dict) and all(_shape(s) for s in v.values())),
        "an object of parameter shapes (lists of integers >= 0)",
    ),
    "model": _plain(_optional(lambda v: isinstance(v, dict)), "an object or null"),
    "config": _plain(_optional(lambda v: isinstance(v, dict)), "an object or null"),
    "tokenizer": _fields(_TOKENIZER_FIELDS),
    "data": _fields(_DATA_FIELDS),
    "init_only": _plain(_optional(lambda v: isinstance(v, bool)), "true or false"),
    "time": _plain(_optional(lambda v: _is_number(v) and 0 <= v < MAX_TIME), "a unix time"),
    "created": _plain(_str_or_none, "a string"),
    "tag": _plain(_str_or_none, "a string"),
    "tool": _plain(_str_or_none, "a string"),
    "config_hash": _plain(_str_or_none, "a string or null"),
    "num_parameters": _plain(_int_or_none, "an integer >= 0"),
    "save_seconds": _plain(_optional(_is_number), "a number"),
    "expert_parallel": _plain(_optional(lambda v: _is_int(v, 1)), "an integer >= 1 or null"),
    "rng": _plain(_optional(lambda v: isinstance(v, dict)), "an object"),
    "versions": _plain(_optional(lambda v: isinstance(v, dict)), "an object"),
}


@dataclass(frozen=True)
class TensorLayout:
    """meta.json's ``tensor_parallel``, checked: the degree, and for every sharded weight the dimension it
    is cut along and the whole weight's shape (see :mod:`llmtools.ckpt.tensor_shards`)."""

    degree: int
    split_dims: dict[str, int]
    shapes: dict[str, tuple[int, ...]]


def parse_tensor_layout(record: Any, where: str) -> TensorLayout | None:
    """The tensor-parallel record checked (None: none recorded); InputError naming ``where`` otherwise."""
    if record is None:
        return None
    if not isinstance(record, dict):
        raise InputError(f"{where}: {record!r}, expected an object")
    found = record.get("degree")
    if not _is_int(found, 1, MAX_DEGREE):
        raise InputError(f"{where}[degree]: {found!r} (an integer 1..{MAX_DEGREE})")
    dims, shapes = record.get("split_dims"), record.get("shapes")
    if not isinstance(dims, dict) or not isinstance(shapes, dict) or set(dims) != set(shapes):
        raise InputError(f"{where}: split_dims and shapes must be objects naming the same parameters")
    out_shapes = {}
    for name, dim in dims.items():
        shape = shapes[name]
        if not _shape(shape) or not _is_int(dim) or not dim < len(shape):
            raise InputError(f"{where}[{name}]: split dimension {dim!r} of shape {shape!r} is not valid")
        out_shapes[name] = tuple(shape)
    return TensorLayout(found, dict(dims), out_shapes)


class CheckpointMeta(dict):
    """A meta.json whose every record passed :data:`RECORDS` (a dict, so it is read and written back as
    one); ``path`` is the file it came from."""

    path: Path
    layout: TensorLayout | None


def check(meta: dict[str, Any], meta_path: str | Path) -> CheckpointMeta:
    """``meta`` (parsed from ``meta_path``) checked record by record; the first bad one is an InputError."""
    if not isinstance(meta, dict):
        raise InputError(f"{meta_path}: expected a JSON object")
    for key in REQUIRED_KEYS:
        if key not in meta:
            raise InputError(f"{meta_path}[{key}]: missing")
    for key, check_record in RECORDS.items():
        if key in meta:
            expected = check_record(meta[key])
            if expected is not None:
                raise InputError(f"{meta_path}[{key}]: {_short(meta[key])}, expected {expected}")
    for name, entry in meta["files"].items():
        if not (
            isinstance(entry, dict) and _is_int(entry.get("size")) and isinstance(entry.get("sha256"), str)
        ):
            raise InputError(f"{meta_path}[files.{name}]: expected {{size: integer, sha256: string}}")
    out = CheckpointMeta(meta)
    out.path = Path(meta_path)
    out.layout = parse_tensor_layout(meta.get("tensor_parallel"), f"{meta_path}[tensor_parallel]")
    # Data-parallel replicas times tensor-parallel shards are ranks of the run: no more than it had.
    replicas = meta.get("dp_world_size") or meta["world_size"]
    if replicas * (out.layout.degree if out.layout else 1) > meta["world_size"]:
        raise InputError(
            f"{meta_path}[dp_world_size]: {replicas} data-parallel replica(s) of "
            f"{out.layout.degree if out.layout else 1} tensor-parallel shard(s) are more ranks than "
            f"world_size {meta['world_size']}"
        )
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def read_meta(path: str | Path) -> CheckpointMeta:
    """meta.json of a checkpoint folder, every record checked; InputError naming the file and the record
    when it is missing or malformed."""
    meta_path = Path(path) / layout.META
    try:
        text = meta_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(
            f"{meta_path}: missing (the save did not finish, or this is not a checkpoint)"
        ) from None
    except UnicodeDecodeError as error:
        raise InputError(f"{meta_path}: byte {error.start}: not UTF-8") from None
    try:
        meta = jsonfile.loads(text, ours=True)
    except json.JSONDecodeError as error:
        raise InputError(f"{meta_path}:{error.lineno}: not valid JSON ({error.msg})") from None
    except (ValueError, RecursionError) as error:
        raise InputError(f"{meta_path}: not valid JSON ({error})") from None
    return check(meta, meta_path)


def tensor_layout(meta: dict[str, Any] | None) -> TensorLayout | None:
    """The tensor-parallel layout of a checkpoint's meta (None without one): the one parsed when the
    file was read, or, for a summary we built ourselves, parsed now by the same check."""
    if isinstance(meta, CheckpointMeta):
        return meta.layout
    return parse_tensor_layout((meta or {}).get("tensor_parallel"), "meta.json[tensor_parallel]")


@dataclass(frozen=True)
class RecordedTokenizer:
    """The tokenizer a checkpoint's data was made with: where it is now, and the hash it must have."""

    source: str
    hash: str | None
    where: str  # FOLDER/meta.json[tokenizer] for messages


def recorded_tokenizer(checkpoint: str | Path, meta: CheckpointMeta) -> RecordedTokenizer | None:
    """meta.json's tokenizer, its source resolved against the run folder (RUN for RUN/checkpoints/step_*,
    else the checkpoint's own folder), never against the current folder; None when none is recorded."""
    record = meta.get("tokenizer") or {}
    source = record.get("source")
    if not source:
        return None
    where = f"{meta.path}[tokenizer]"
    if source == "byte":
        return RecordedTokenizer(source, record.get("hash"), where)
    path = Path(source)
    if not path.is_absolute():
        checkpoint = Path(checkpoint)
        in_run = checkpoint.parent.name == layout.CHECKPOINTS
        path = (checkpoint.parent.parent if in_run else checkpoint) / path
    return RecordedTokenizer(str(path), record.get("hash"), where)


__all__ = [
    "REQUIRED_KEYS",
    "RECORDS",
    "CheckpointMeta",
    "TensorLayout",
    "RecordedTokenizer",
    "check",
    "read_meta",
    "parse_tensor_layout",
    "tensor_layout",
    "recorded_tokenizer",
]
