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
import re
from pathlib import Path

from llmtools.errors import InputError, RuntimeFailure

MAX_INT_DIGITS = 4300
"""Digits of the longest integer any reader of ours accepts (Python's own default bound: converting a
longer one costs quadratic time). A longer integer is a JSON error at its place, whatever the
interpreter's ``sys.set_int_max_str_digits`` says."""
_LONG_DIGITS = re.compile(r"\d{%d}" % (MAX_INT_DIGITS + 1))


MAX_DEPTH = 512
"""Levels of nesting (arrays and objects) any reader of ours accepts: a bound of its own, so that what is
read does not depend on how deep the caller's stack is (Python's parser recurses per level)."""
_DEEP = f"nested too deeply (arrays/objects more than {MAX_DEPTH} levels deep)"


class _NonFinite(ValueError):
    pass


class _LongInt(ValueError):
    pass


def _no_constant(name: str):
    raise _NonFinite(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: a literal too large for a double reads as infinity
        raise _NonFinite(text)
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _LongInt(text)
    return int(text)


def loads(text: str | bytes, finite: bool = False, ours: bool = False):
    """``json.loads``, bounded: what it costs is linear in the input's size, and every way it can fail is
    a :class:`json.JSONDecodeError` (a ``ValueError``) with a place. Nesting deeper than
    :data:`MAX_DEPTH` (the standard library's own limit, a RecursionError without a place, depends on
    the caller's stack) and an integer of more than :data:`MAX_INT_DIGITS` digits (a ValueError
    without a place) are JSON errors.

    ``finite``: refuse ``NaN`` / ``Infinity`` (which Python's json accepts, and JSON does not), and a
    number too large for a double (``1e999``, which reads as infinity), as a JSON error at its place.
    ``ours``: a file we wrote, whose ``{"bytes_b64": ...}`` objects are paths (:func:`portable`) given
    back as such; never for a file of someone else's, where such an object is data."""
    if isinstance(text, bytes | bytearray):
        text = text.decode("utf-8")  # UnicodeDecodeError: a ValueError too, as json.loads raises it
    kwargs = {"object_hook": _path_back if ours else None}
    if finite:
        kwargs.update(parse_constant=_no_constant, parse_float=_finite_float)
    deep = too_deep(text)
    if deep is not None:
        raise json.JSONDecodeError(_DEEP, text, deep)
    if len(text) > MAX_INT_DIGITS and _LONG_DIGITS.search(text):  # rare: only then a hook per integer
        kwargs["parse_int"] = _bounded_int
    try:
        return json.loads(text, **kwargs)
    except json.JSONDecodeError:
        raise
    except _NonFinite as error:
        raise json.JSONDecodeError(
            f"{_shown(str(error))} is not a number JSON allows (numbers must be finite)",
            text,
            max(text.find(str(error)), 0),
        ) from None
    except _LongInt as error:
        raise json.JSONDecodeError(
            f"an integer of {len(str(error).lstrip('-')):,} digits (at most {MAX_INT_DIGITS:,} are read)",
            text,
            max(text.find(str(error)), 0),
        ) from None
    except RecursionError:  # a caller already deep in its own stack: the same error, at the same place
        raise json.JSONDecodeError(_DEEP, text, too_deep(text) or too_deep(text, 0) or 0) from None
    except ValueError as error:  # the interpreter's own integer bound, set lower than ours
        raise json.JSONDecodeError(f"a number out of range ({_shown(str(error))})", text, 0) from None


_BRACKETS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')  # a string (skipped whole), or a bracket
_BRACKETS_B = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def too_deep(text: str | bytes, depth: int | None = None) -> int | None:
    """Where ``text`` (JSON) opens a level of nesting deeper than ``depth`` (default :data:`MAX_DEPTH`),
    strings skipped; None when it does not. Two C-level counts decide for almost every text: the walk
    runs only when the text holds more brackets than the bound."""
    depth = MAX_DEPTH if depth is None else depth
    if isinstance(text, str):
        if text.count("[") + text.count("{") <= depth:
            return None
        pattern, opening, closing = _BRACKETS, "[{", "]}"
    else:
        if text.count(b"[") + text.count(b"{") <= depth:
            return None
        pattern, opening, closing = _BRACKETS_B, (b"[", b"{"), (b"]", b"}")
    level = 0
    for match in pattern.finditer(text):
        char = match.group()
        if char in opening:
            level += 1
            if level > depth:
                return match.start()
        elif char in closing:
            level -= 1
    return None


def _shown(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


class BadLine(InputError):
    """One line of a JSON-lines file that is not a value we read: ``FILE:LINE: what``. ``kind`` names
    it for the counts of skipped lines (``malformed_json``, ``invalid_utf8``, ``line_too_long``)."""

    def __init__(self, place: str, kind: str, what: str) -> None:
        super().__init__(f"{place}: {what}")
        self.place, self.kind, self.what = place, kind, what


MAX_LINE_BYTES = (1 << 31) - 1
"""The longest JSON line :func:`read_lines` reads by default."""


def parse_line(raw: str | bytes, place: str, finite: bool = False, strings: bool = False, ours: bool = False):
    """One line of a JSON-lines file, by :func:`loads`; :class:`BadLine` naming ``place`` (``FILE:LINE``)
    when it is not UTF-8 (``invalid_utf8``) or not JSON (``malformed_json``). ``strings``: a string
    anywhere in the value (a key included) holding a lone surrogate escape (``"\\ud800"``, which
    json accepts and no UTF-8 writer or tokenizer can encode) is ``invalid_utf8`` too. ``finite`` and
    ``ours`` as for :func:`loads`."""
    if isinstance(raw, bytes | bytearray):
        try:
            raw = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as error:
            raise BadLine(
                place, "invalid_utf8",
                f"invalid UTF-8 (byte 0x{raw[error.start]:02x} at column {error.start + 1})",
            ) from None  # fmt: skip
    try:
        value = loads(raw, finite=finite, ours=ours)
    except json.JSONDecodeError as error:
        what = f"malformed JSON: {error.msg} at column {error.colno}"
        raise BadLine(place, "malformed_json", what) from None
    if strings and "\\u" in raw:
        where = lone_surrogate(value)
        if where is not None:
            what = f"{where or 'the value'}: a lone surrogate escape (not valid Unicode)"
            raise BadLine(place, "invalid_utf8", what)
    return value


def read_lines(
    path: str | os.PathLike,
    skip_bad: bool = False,
    skipped: dict[str, int] | None = None,
    max_line: int = MAX_LINE_BYTES,
    **parse,
):
    """``(line number, value)`` for every non-blank line of the JSON-lines file ``path``, each by
    :func:`parse_line` (``parse``: its ``finite``, ``strings``, ``ours``). A bad line raises its
    :class:`BadLine`; with ``skip_bad`` it is counted in ``skipped[kind]`` instead. A line longer than
    ``max_line`` bytes is bad (``line_too_long``) without being held in memory whole."""
    skipped = {} if skipped is None else skipped
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed in the finally below
    except OSError as error:
        raise InputError(f"{path}: cannot read ({error.strerror})") from None
    try:
        number = 0
        while True:
            raw = handle.readline(max_line + 1)
            if not raw:
                return
            number += 1
            place = f"{path}:{number}"
            try:
                if len(raw) > max_line and not raw.endswith(b"\n"):
                    while raw and not raw.endswith(b"\n"):  # the rest of the line, dropped unread
                        raw = handle.readline(1 << 20)
                    raise BadLine(place, "line_too_long", f"a line longer than {max_line:,} bytes")
                if not raw.strip():
                    continue
                yield number, parse_line(raw, place, **parse)
            except BadLine as error:
                if not skip_bad:
                    raise
                skipped[error.kind] = skipped.get(error.kind, 0) + 1
    finally:
        handle.close()


def lone_surrogate(value, path: str = "") -> str | None:
    """The place (``[messages][0][content]``) of the first string in ``value`` (keys included) holding a
    lone surrogate, or None. Walked with a stack: the value may be as deep as :func:`loads` allows."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return where
        elif isinstance(item, dict):
            stack.extend((v, f"{where}[{k}]") for k, v in reversed(list(item.items())))
            stack.extend((k, f"{where}[{k!r} (a key)]") for k in item if isinstance(k, str))
        elif isinstance(item, list):
            stack.extend((v, f"{where}[{i}]") for i, v in reversed(list(enumerate(item))))
    return None


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
