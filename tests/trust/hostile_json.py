"""Hostile JSON lines: values that cost a naive reader unbounded time or end it in an exception that is
not a JSON error (a 5,000-digit integer, nesting 100,000 deep), and values JSON forbids or no writer of
text can hold (NaN, Infinity, a number too large for a double, a lone surrogate escape).

Each generator returns the JSON text of one value; :data:`HOSTILE` names them with what every reader
must do with a line holding one in a key it does not use: ``refused`` (a bad line everywhere) or
``lenient`` (a reader may take it as Python's json does, or refuse it as a bad line)."""

from __future__ import annotations

import json


def huge_int(digits: int = 5_000, sign: str = "") -> str:
    return sign + "9" * digits


def deep_array(depth: int = 100_000) -> str:
    return "[" * depth + "]" * depth


def deep_object(depth: int = 100_000) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


def constant(name: str = "NaN") -> str:
    return name


def huge_float(exponent: int = 999_999) -> str:
    return f"1e{exponent}"


def long_float(digits: int = 5_000) -> str:
    """A float literal with a 5,000-digit integer part: a double to Python (no digit bound)."""
    return "1" * digits + ".5"


def lone_surrogate() -> str:
    return '"\\ud800"'


HOSTILE = {
    "huge-int": (huge_int(), "refused"),
    "huge-negative-int": (huge_int(4_301, "-"), "refused"),
    "deep-array": (deep_array(), "refused"),
    "deep-600": (deep_array(600), "refused"),  # deeper than our bound, within orjson's (1,024)
    "deep-object": (deep_object(), "refused"),
    "nan": (constant("NaN"), "lenient"),
    "infinity": (constant("Infinity"), "lenient"),
    "minus-infinity": (constant("-Infinity"), "lenient"),
    "huge-float": (huge_float(), "lenient"),
    "long-float": (long_float(), "lenient"),
    "lone-surrogate": (lone_surrogate(), "lenient"),
}


def record_with(base: dict, value: str, as_key: bool = False) -> str:
    """The JSON line of ``base`` plus one more member: ``"extra": VALUE``, or with ``as_key`` a member
    whose NAME is the (string) value."""
    text = json.dumps(base)[:-1]
    if as_key:
        return f'{text}, {value}: 1}}'
    return f'{text}, "extra": {value}}}'
