"""JSON in and out with the one error model: reading a file reports a message naming it; every JSON text
we write (files, ``--json`` output) goes through :func:`dumps`, which never writes ``NaN`` or
``Infinity`` (Python's json does by default, and no other JSON reader accepts them).

Paths, by one rule in every file and output of ours: a path whose bytes are UTF-8 is a JSON string; any
other is ``{"bytes_b64": BASE64}`` of its exact bytes (:func:`portable`). Our readers of our own files
(``loads(..., ours=True)``) give such an object back as the very path Python had before writing it, so a
mix.json, sidecar or meta.json under any name the filesystem allows reads back as written."""

from __future__ import annotations

import base64
import json
import math
import os
from pathlib import Path

from llmtools.errors import InputError, RuntimeFailure


class _NonFinite(ValueError):
    pass


def _no_constant(name: str):
    raise _NonFinite(name)


def loads(text: str | bytes, finite: bool = False, ours: bool = False):
    """``json.loads``, with input nested too deeply for the parser reported as a JSON error (the
    standard library raises RecursionError, with no place, a few thousand levels down).

    ``finite``: refuse ``NaN`` / ``Infinity`` (which Python's json accepts, and JSON does not) as a
    JSON error at its place. ``ours``: a file we wrote, whose ``{"bytes_b64": ...}`` objects are paths
    (:func:`portable`) given back as such; never for a file of someone else's, where such an object is
    data."""
    hook = _path_back if ours else None
    try:
        if finite:
            return json.loads(text, parse_constant=_no_constant, object_hook=hook)
        return json.loads(text, object_hook=hook)
    except _NonFinite as error:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        raise json.JSONDecodeError(
            f"{error} is not a number JSON allows (numbers must be finite)",
            text,
            max(text.find(str(error)), 0),
        ) from None
    except RecursionError:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        depth = len(text) - len(text.lstrip("[{ \t"))
        raise json.JSONDecodeError(
            "nested too deeply (arrays/objects more than ~1000 levels deep)", text, min(depth, len(text))
        ) from None


def read_json_object(path: str | os.PathLike, what: str = "JSON file", ours: bool = False) -> dict:
    """Parse ``path`` as a JSON object; :class:`InputError` naming the file when it is not one.
    ``ours`` as for :func:`loads`."""
    path = Path(path)
    try:
        data = loads(path.read_text(encoding="utf-8"), ours=ours)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: not a valid {what} ({error})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: a {what} must be a JSON object")
    return data


def dumps(obj, what: str = "JSON output", **kwargs) -> str:
    """``json.dumps(portable(obj), **kwargs)`` with ``allow_nan=False``: a non-finite number that got this
    far is a :class:`RuntimeFailure` naming ``what``, never a file of ours that strict readers refuse;
    a path that is not UTF-8 is written by the module's one rule, never as Python's lone surrogates."""
    try:
        return json.dumps(portable(obj), allow_nan=False, **kwargs)
    except ValueError as error:
        raise RuntimeFailure(
            f"{what}: refusing to write a non-finite number (NaN or Infinity) as JSON ({error})"
        ) from None


def output(obj, what: str = "JSON output", **kwargs) -> str:
    """What a ``--json`` option prints: :func:`dumps` of ``obj``."""
    return dumps(obj, what, **kwargs)


def portable(obj):
    """``obj`` with every value that is not Unicode text replaced by ``{"bytes_b64": BASE64}`` of its bytes.

    Such strings are paths with bytes that are not UTF-8 (Python carries each as a lone surrogate,
    ``\\udcff``, which strict JSON readers refuse or replace): the object gives the exact bytes back in
    any language, and a path that is UTF-8 stays a plain string. ``os.PathLike`` values become their
    path string (or bytes) first. Dictionary keys are left as they are (JSON keys are strings).
    """
    if isinstance(obj, os.PathLike):
        obj = os.fspath(obj)
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
            return obj
        except UnicodeEncodeError:
            return {
                "bytes_b64": _b64(
                    os.fsencode(obj) if _fs_escapes_only(obj) else obj.encode("utf-8", "surrogatepass")
                )
            }
    if isinstance(obj, bytes):
        try:
            return obj.decode("utf-8")
        except UnicodeDecodeError:
            return {"bytes_b64": _b64(obj)}
    if isinstance(obj, dict):
        return {k: portable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [portable(v) for v in obj]
    return obj


def _path_back(obj: dict):
    """``{"bytes_b64": B}`` (and nothing else) -> the path of those bytes, as :func:`portable` found it."""
    if len(obj) == 1 and isinstance(obj.get("bytes_b64"), str):
        try:
            return os.fsdecode(base64.b64decode(obj["bytes_b64"], validate=True))
        except ValueError:  # not base64: left as the object it is (a reader then finds it not a path)
            return obj
    return obj


def _fs_escapes_only(text: str) -> bool:
    """Every surrogate in ``text`` is one ``surrogateescape`` makes (U+DC80..U+DCFF, a byte >= 0x80)."""
    return all("\udc80" <= c <= "\udcff" for c in text if "\ud800" <= c <= "\udfff")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def nulls(obj):
    """``obj`` with every non-finite float replaced by None, for values where NaN is a fact to report (a
    diverged loss) rather than a bug: JSON's null, with the count or steps reported beside it."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: nulls(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [nulls(v) for v in obj]
    return obj


def dump(obj, handle, what: str = "JSON output", **kwargs) -> None:
    """:func:`dumps` into an open text file."""
    handle.write(dumps(obj, what, **kwargs))
