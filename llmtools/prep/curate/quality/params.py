"""Parameters of the quality rules: each rule is a dataclass whose fields carry their meaning and how a
value is written on a command line, so the parameter table, `--help`, the docs and overrides by name
(`gopher_quality.min_doc_words=100`) all come from one place."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from llmtools.errors import UsageError

# How a value is written. "?" lets "none" switch the rule off (datatrove's None).
KINDS = ("int", "int?", "float", "float?", "bool", "str", "words", "chars?", "pairs", "path?")


def param(default: Any, meaning: str, kind: str) -> Any:
    """A rule parameter: its published default, what it means, how it is written."""
    if kind not in KINDS:
        raise ValueError(f"unknown parameter kind {kind!r}")
    return field(default=default, metadata={"meaning": meaning, "kind": kind})


@dataclass(frozen=True)
class Param:
    rule: str
    name: str
    default: Any
    kind: str
    meaning: str

    @property
    def qualified(self) -> str:
        return f"{self.rule}.{self.name}"


def params_of(rule_class) -> list[Param]:
    return [
        Param(rule_class.name, f.name, f.default, f.metadata["kind"], f.metadata["meaning"])
        for f in dataclasses.fields(rule_class)
        if "kind" in f.metadata
    ]


def show(value: Any, kind: str) -> str:
    """A value written as the command line takes it."""
    if value is None:
        return "none"
    if kind == "bool":
        return "true" if value else "false"
    if kind == "pairs":
        return ",".join(f"{n}:{frac}" for n, frac in value)
    if kind == "words":
        return ",".join(value)
    if kind == "chars?":
        return "".join(value)
    return str(value)


def _number(text: str, cast, where: str):
    try:
        value = cast(text)
    except ValueError:
        raise UsageError(f"{where}: {text!r} is not a{'n integer' if cast is int else ' number'}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"{where}: {text!r} is not a finite number")
    return value


def parse(text: str, kind: str, where: str) -> Any:
    """The value `text` stands for, or UsageError naming `where` (the qualified parameter)."""
    text = text.strip()
    if kind.endswith("?") and text.lower() == "none":
        return None
    base = kind.rstrip("?")
    if base == "int":
        return _number(text, int, where)
    if base == "float":
        return _number(text, float, where)
    if base == "bool":
        lowered = text.lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise UsageError(f"{where}: {text!r} is not true or false")
    if base == "words":
        return tuple(word.strip() for word in text.split(",") if word.strip())
    if base == "chars":
        if not text:
            raise UsageError(f"{where}: give at least one character")
        return tuple(text)
    if base == "pairs":
        pairs = []
        for item in filter(None, (piece.strip() for piece in text.split(","))):
            n, sep, frac = item.partition(":")
            if not sep:
                raise UsageError(f"{where}: {item!r} is not N:FRACTION (e.g. 2:0.2)")
            size = _number(n, int, where)
            if size < 1:
                raise UsageError(f"{where}: an n-gram size is at least 1, not {size}")
            pairs.append((size, _number(frac, float, where)))
        return tuple(pairs)
    if base == "str":
        return text
    if base == "path":
        if not text:
            raise UsageError(f"{where}: give a path")
        return text
    raise ValueError(kind)


def split_override(text: str) -> tuple[str, str, str]:
    """'rule.param=value' -> (rule, param, value)."""
    key, sep, value = text.partition("=")
    rule, dot, name = key.strip().partition(".")
    if not sep or not dot or not rule or not name:
        raise UsageError(f"--set {text!r}: write RULE.PARAM=VALUE, e.g. gopher_quality.min_doc_words=100")
    return rule, name, value


def configure(rule_class, settings: dict[str, str]):
    """An instance of `rule_class` with `settings` (param name -> written value) over its defaults."""
    known = {p.name: p for p in params_of(rule_class)}
    values = {}
    for name, written in settings.items():
        if name not in known:
            raise UsageError(
                f"{rule_class.name}.{name}: no such parameter (it has: {', '.join(sorted(known))})"
            )
        values[name] = parse(written, known[name].kind, known[name].qualified)
    return rule_class(**values)
