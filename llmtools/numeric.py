"""The one checked reading of a number that an input controls (a flag, a config key, a file's field).

Every number is finite, inside the range its use allows, and — for a list that is summed (weights) —
has a finite sum. Python's ``float()`` accepts ``nan``, ``inf`` and ``1e999`` (infinite) and ``int()``
accepts any length of digits; a value like that, accepted once, turns into a ``ZeroDivisionError``, a
``NaN`` written into a JSON file, or an allocation of gigabytes several steps later. Refused here instead,
with the one error model: an :class:`InputError` (exit 2) naming ``what``.

Counts have a bound (:data:`MAX_COUNT`) unless the caller gives a tighter one: no count we take from an
input is meaningful beyond 2**53 (a float64 holds every integer up to it exactly), and a larger one is a
typo or an attack.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from llmtools.errors import InputError

MAX_COUNT = 2**53
"""The largest count any input may give (samples, tokens, shards...): every integer up to it is exact in
float64, which the plans' arithmetic uses."""

MAX_DIGITS = 40
"""Longer digit strings are refused before conversion (``int()`` of 10**5 digits costs seconds)."""

_FLOAT = re.compile(r"^\s*[-+]?((\d[\d_]*(\.\d*)?|\.\d+)([eE][-+]?\d+)?|nan|inf|infinity)\s*$", re.IGNORECASE)
_INT = re.compile(r"^\s*[-+]?\d[\d_]*\s*$")


def _bounds(value, lo, hi, what: str, raw) -> None:
    if lo == 0 and value < 0:
        raise InputError(f"{what} is negative ({raw}); it must be >= 0")
    if lo is not None and value < lo:
        raise InputError(f"{what}: {raw!r} is below the smallest value allowed ({lo})")
    if hi is not None and value > hi:
        raise InputError(f"{what}: {raw!r} is above the largest value allowed ({hi})")


def finite(value, what: str, lo: float | None = None, hi: float | None = None) -> float:
    """``value`` (a number already parsed, e.g. from JSON) as a finite float in ``[lo, hi]``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{what} ({value!r}) is not a number")
    try:
        number = float(value)
    except OverflowError:  # an int beyond float range
        raise InputError(f"{what}: {value!r} is too large") from None
    if not math.isfinite(number):
        raise InputError(f"{what} is {value!r}; it must be a finite number (NaN and infinities are refused)")
    _bounds(number, lo, hi, what, value)
    return number


def parse_float(text, what: str, lo: float | None = None, hi: float | None = None) -> float:
    """A decimal number from text (``0.7``, ``1e-3``, ``1_000``), finite and in ``[lo, hi]``.

    ``nan``, ``inf`` and spellings that overflow (``1e999``) are refused."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return finite(text, what, lo, hi)
    raw = str(text)
    if len(raw) > 400 or not _FLOAT.match(raw):
        raise InputError(f"{what} ({raw[:60]!r}) is not a number")
    return finite(float(raw.replace("_", "")), what, lo, hi)


def parse_int(text, what: str, lo: int | None = 0, hi: int | None = MAX_COUNT) -> int:
    """A whole number from text or JSON, in ``[lo, hi]`` (by default ``0..MAX_COUNT``)."""
    if isinstance(text, bool):
        raise InputError(f"{what}: {text!r} is not a whole number")
    if isinstance(text, int):
        value = text
    elif isinstance(text, float):
        if not math.isfinite(text) or text != int(text):
            raise InputError(f"{what}: {text!r} is not a whole number")
        value = int(text)
    else:
        raw = str(text)
        digits = raw.strip().lstrip("+-").replace("_", "")
        if len(digits) > MAX_DIGITS:
            raise InputError(f"{what}: a number of {len(digits)} digits is far outside any allowed range")
        if not _INT.match(raw):
            raise InputError(f"{what}: {raw!r} is not a whole number")
        value = int(raw.replace("_", ""))
    _bounds(value, lo, hi, what, text)
    return value


def finite_sum(values: Iterable[float], what: str) -> float:
    """``math.fsum(values)``, refused when it is not finite (``1e308 + 1e308`` is infinite, and every
    weight divided by it is 0 or NaN)."""
    values = list(values)
    try:
        total = math.fsum(values)
    except OverflowError:
        total = math.inf
    if not math.isfinite(total):
        raise InputError(
            f"{what}: the values sum to infinity ({len(values)} values up to {max(values)!r}); "
            "give smaller numbers (only their ratios matter)"
        )
    return total
