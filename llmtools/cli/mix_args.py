"""llm-mix's option strings: counts with suffixes (``10M``, ``1.5B``), weight lists, Megatron's
``--data-path 0.7 A 0.3 B`` spelling and mixture stages (``--stage tokens:1.8B 0.7,0.3``), turned into the
values :mod:`llmtools.data.mix` takes. Each error is a one-line :class:`UsageError` naming the flag."""

from __future__ import annotations

import glob
import re

from llmtools.data.mix_config import Blend
from llmtools.data.stages import StageKey, StageSpec
from llmtools.errors import InputError, UsageError
from llmtools.formats.pathlists import LIST_MARK, expand_prefixes, read_list_file
from llmtools.numeric import MAX_COUNT, parse_float

# -- Megatron's --data-path spelling ----------------------------------------------------------------
_NUMBER = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$|^[-+]?(nan|inf|infinity)$", re.IGNORECASE)


def parse_data_path(tokens: list[str], flag: str = "--data-path") -> Blend:
    """``["0.7", "A", "0.3", "B"]`` -> Blend([A, B], [0.7, 0.3]); ``["A", "B"]`` -> weights by size.

    As Megatron's ``get_blend_from_list``: an odd count, or weights that are not numbers, means a list
    of prefixes only. A mixture (some numbers, some not, in weight places) is refused. A list may also
    be given as one string with spaces.
    """
    items = [part for token in tokens for part in str(token).split()]
    if not items:
        raise UsageError(f"{flag}: no datasets given")
    if len(items) % 2 == 1:
        return Blend(items, None, flag)
    weights, prefixes = items[0::2], items[1::2]
    numeric = [bool(_NUMBER.match(w)) for w in weights]
    if not any(numeric):
        return Blend(items, None, flag)
    if not all(numeric):
        bad = weights[numeric.index(False)]
        raise UsageError(f"{flag}: expected 'WEIGHT PREFIX' pairs, but {bad!r} is not a number")
    return Blend(prefixes, [_weight(w, f"{flag}: weight {i + 1}") for i, w in enumerate(weights)], flag)


def _weight(text: str, what: str, where: str = "") -> float:
    """One weight: a finite number >= 0 (the blend checks that their sum is finite)."""
    if not _NUMBER.match(text):
        raise UsageError(f"{what} ({text!r}{where}) is not a number")
    return parse_float(text, f"{what}{where}", lo=0.0)


def read_data_path(values: list[str], flag: str = "--data-path") -> Blend:
    """Megatron's blend spelling, with ``@FILE`` values read from FILE and globs in unweighted lists."""
    tokens = []
    for value in values:
        if value.startswith("@") and len(value) > 1:
            tokens += [t for line in read_list_file(value[1:]) for t in line.split()]
        else:
            tokens.append(value)
    blend = parse_data_path(tokens, flag)
    patterns = [p for p in blend.prefixes if glob.has_magic(p)]
    if not patterns:
        return blend
    if blend.weights is not None:
        raise UsageError(
            f"{flag}: {patterns[0]!r} is a glob in a weighted blend; give one weight per dataset "
            "(or list the prefixes without weights, to weigh them by size)"
        )
    return Blend(expand_prefixes(blend.prefixes), None, flag)


# -- counts and weights -----------------------------------------------------------------------------
_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}


def parse_count(text: str | int | None, flag: str, allow_zero: bool = False) -> int | None:
    """``"2048"``, ``"10_000"``, ``"10M"``, ``"1.5B"`` -> int; a one-line :class:`UsageError` otherwise."""
    if text is None:
        return None
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = re.fullmatch(r"\s*(\d[\d_]*(?:\.\d+)?)\s*([kKmMbBgGtT]?)\s*", str(text))
        if not match:
            raise UsageError(
                f"{flag}: {text!r} is not a {'non-negative' if allow_zero else 'positive'} integer"
            )
        number, suffix = match.groups()
        if len(number) > 40:
            raise UsageError(
                f"{flag}: {text[:40]!r}...: {len(number)} digits; at most {MAX_COUNT} is allowed"
            )
        scaled = float(number.replace("_", "")) * _SUFFIX[suffix.lower()]
        if scaled != int(scaled) or (not suffix and "." in number):
            raise UsageError(f"{flag}: {text!r} is not a whole number")
        value = int(scaled)
    if value > MAX_COUNT:
        raise UsageError(f"{flag}: {text!r} is beyond the largest count allowed ({MAX_COUNT})")
    if value < 0 or (value == 0 and not allow_zero):
        raise UsageError(
            f"{flag}: must be a {'non-negative' if allow_zero else 'positive'} integer, not {text!r}"
        )
    return value


def parse_weights(text: str | None) -> list[float] | None:
    """``"0.7,0.3"`` -> [0.7, 0.3] (checked by :class:`Blend`); None when not given."""
    if text is None:
        return None
    parts = [p.strip() for p in str(text).replace(" ", ",").split(",") if p.strip()]
    if not parts:
        raise UsageError("--weights: empty; give one number per PREFIX, like 0.7,0.3")
    return [_weight(part, f"--weights: weight {i + 1}") for i, part in enumerate(parts)]


# -- mixture stages ---------------------------------------------------------------------------------
_UNIT_ALIASES = {"step": "step", "steps": "step", "tokens": "tokens", "token": "tokens", "samples": "samples",
                 "sample": "samples"}  # fmt: skip


def parse_stage_key(text: str, flag: str = "--stage") -> StageKey:
    """``step:800``, ``tokens:1.8B``, ``samples:12K``, ``90%`` or ``end`` -> a :class:`StageKey`."""
    raw = str(text).strip()
    if raw.lower() == "end":
        return StageKey("end")
    if raw.endswith("%"):
        try:
            value = float(raw[:-1])
        except ValueError:
            raise UsageError(f"{flag}: {raw!r} is not a percentage like 90%") from None
        if not 0 < value <= 100:
            raise UsageError(f"{flag}: {raw!r}: a share of the plan must be in (0%, 100%]")
        return StageKey("percent", value)
    unit, sep, number = raw.partition(":")
    if not sep or unit.lower() not in _UNIT_ALIASES:
        raise UsageError(
            f"{flag}: stage end {raw!r}: give step:N, tokens:T, samples:N, a share like 90%, or end"
        )
    value = parse_count(number, f"{flag} {unit}:")
    try:
        return StageKey(_UNIT_ALIASES[unit.lower()], value)
    except InputError as error:
        raise UsageError(f"{flag}: {error}") from None


def _stage_weights(parts: list[str]):
    """(weight text, where it came from) of each weight: given inline, or read from an ``@FILE`` (numbers
    separated by spaces, commas or newlines; ``#`` lines skipped), one per source of a blend of many."""
    for part in parts:
        if part.startswith(LIST_MARK) and len(part) > 1:
            for line in read_list_file(part[1:]):
                for value in line.replace(",", " ").split():
                    yield value, f" in {part[1:]}"
        else:
            yield part, ""


def parse_stages(values: list[str] | None) -> list[StageSpec] | None:
    """``["tokens:1.8B 0.7,0.3", "end 0.2 0.8"]`` -> stages; each starts where the one before ends. A weight
    ``@FILE`` stands for the weights listed in FILE."""
    if not values:
        return None
    out: list[StageSpec] = []
    start = StageKey("samples", 0)
    for k, value in enumerate(values):
        parts = str(value).replace(",", " ").split()
        flag = f"--stage {k + 1}"
        if len(parts) < 2:
            raise UsageError(
                f"{flag}: expected UNTIL WEIGHTS... (e.g. --stage tokens:1.8B 0.7,0.3), got {value!r}"
            )
        until = parse_stage_key(parts[0], flag)
        weights = []
        for part, where in _stage_weights(parts[1:]):
            weights.append(_weight(part, f"{flag}: weight {len(weights) + 1}", where))
        out.append(StageSpec(start, until, tuple(weights)))
        start = until
    return out
