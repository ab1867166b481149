"""The table of curation rules and recipes: a name -> a step factory and its parameters.

A module that provides rules registers them when imported (:data:`PROVIDERS` lists those modules)::

    register_rule(Rule("gopher_quality", GopherQuality, (Param("min_doc_words", int, 50, "..."), ...),
                       "Gopher's quality rules"))
    register_recipe(Recipe("fineweb", (("gopher_repetition", {}), ("fineweb_quality", {})), "..."))

A command asks for rules by name (``--rule``, ``--recipe``), sets their parameters by
``--set RULE.PARAM=VALUE`` (parsed with the parameter's own type), and gets the configured steps with
:func:`build_steps`. ``--help`` and the stats list a rule's parameters from the same table, so a
parameter is declared once.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmtools.errors import UsageError
from llmtools.prep.curate.step import Step

PROVIDERS: list[str] = [
    "llmtools.prep.curate.length",
    "llmtools.prep.curate.language",
    "llmtools.prep.curate.pii",
]
"""Modules that register rules when imported (the quality rules add theirs here)."""

_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


@dataclass(frozen=True)
class Param:
    """One parameter of a rule: ``kind`` is int, float, str, bool or list (of str, given as a,b,c)."""

    name: str
    kind: type
    default: Any
    help: str = ""

    def parse(self, text: str, flag: str) -> Any:
        """The value of ``--set RULE.PARAM=text``; a UsageError naming ``flag`` when it does not read."""
        text = text.strip()
        try:
            if self.kind is bool:
                return _BOOLS[text.lower()]
            if self.kind is list:
                return [item.strip() for item in text.split(",") if item.strip()]
            if self.kind in (int, float) and text.lower() in ("none", "null", ""):
                return None  # an optional bound switched off
            if self.kind is float:
                value = float(text)
                if value != value or value in (float("inf"), float("-inf")):
                    raise ValueError(text)
                return value
            return self.kind(text)
        except (ValueError, KeyError):
            kind = {bool: "true or false", list: "a comma-separated list"}.get(self.kind, self.kind.__name__)
            raise UsageError(f"{flag}: {self.name} expects {kind}, got {text[:60]!r}") from None


@dataclass(frozen=True)
class Rule:
    """A named rule: ``build(**params)`` returns its :class:`Step`; ``changes_text``: it may rewrite text
    (counted), never drop."""

    name: str
    build: Callable[..., Step]
    params: tuple[Param, ...] = ()
    help: str = ""
    changes_text: bool = False

    def param(self, name: str, flag: str) -> Param:
        for param in self.params:
            if param.name == name:
                return param
        known = ", ".join(p.name for p in self.params) or "none"
        raise UsageError(f"{flag}: rule {self.name!r} has no parameter {name!r} (it has: {known})")

    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}


@dataclass(frozen=True)
class Recipe:
    """Rules in order, each with the parameters the recipe sets (the rest keep their defaults)."""

    name: str
    rules: tuple[tuple[str, Mapping[str, Any]], ...]
    help: str = ""


@dataclass
class Registry:
    rules: dict[str, Rule] = field(default_factory=dict)
    recipes: dict[str, Recipe] = field(default_factory=dict)


_REGISTRY = Registry()
_loaded = False


def register_rule(rule: Rule) -> None:
    if rule.name in _REGISTRY.rules and _REGISTRY.rules[rule.name] is not rule:
        raise ValueError(f"curation rule {rule.name!r} is registered twice")
    _REGISTRY.rules[rule.name] = rule


def register_recipe(recipe: Recipe) -> None:
    if recipe.name in _REGISTRY.recipes and _REGISTRY.recipes[recipe.name] is not recipe:
        raise ValueError(f"curation recipe {recipe.name!r} is registered twice")
    _REGISTRY.recipes[recipe.name] = recipe


def registry() -> Registry:
    """Every rule and recipe, the providers imported on first use."""
    global _loaded
    if not _loaded:
        for module in PROVIDERS:
            importlib.import_module(module)
        _loaded = True
    return _REGISTRY


def rule(name: str, flag: str = "--rule") -> Rule:
    table = registry().rules
    if name not in table:
        raise UsageError(f"{flag}: no rule {name!r} (rules: {', '.join(sorted(table)) or 'none'})")
    return table[name]


def recipe(name: str) -> Recipe:
    table = registry().recipes
    if name not in table:
        raise UsageError(f"--recipe: no recipe {name!r} (recipes: {', '.join(sorted(table)) or 'none'})")
    return table[name]


def parse_settings(items: Sequence[str]) -> dict[str, dict[str, str]]:
    """``["gopher_quality.min_doc_words=30", ...]`` -> ``{"gopher_quality": {"min_doc_words": "30"}}``."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        name, eq, value = item.partition("=")
        rule_name, dot, param = name.strip().partition(".")
        if not eq or not dot or not rule_name or not param:
            raise UsageError(f"--set {item[:80]!r}: expected RULE.PARAM=VALUE (e.g. language.threshold=0.8)")
        out.setdefault(rule_name, {})[param] = value
    return out


def resolve(
    names: Sequence[tuple[str, Mapping[str, Any]]], settings: Mapping[str, Mapping[str, str]]
) -> list[tuple[Rule, dict[str, Any]]]:
    """The rules in order with their parameters: the default, then what a recipe (or the command's own
    option) gives, then ``--set``. A ``--set`` for a rule that does not run is refused."""
    chosen: list[tuple[Rule, dict[str, Any]]] = []
    seen: set[str] = set()
    for name, given in names:
        if name in seen:
            raise UsageError(f"--rule: {name!r} is asked for twice")
        seen.add(name)
        found = rule(name)
        params = found.defaults()
        for key, value in given.items():
            found.param(key, f"rule {name}")
            params[key] = value
        chosen.append((found, params))
    for name, values in settings.items():
        if name not in seen:
            raise UsageError(
                f"--set {name}.…: rule {name!r} does not run (running: {', '.join(n for n, _ in names) or 'none'})"
            )
        found, params = next((r, p) for r, p in chosen if r.name == name)
        for key, text in values.items():
            params[key] = found.param(key, f"--set {name}.{key}").parse(text, f"--set {name}.{key}")
    return chosen


def build_steps(chosen: Sequence[tuple[Rule, dict[str, Any]]]) -> list[Step]:
    return [r.build(**params) for r, params in chosen]


def describe(chosen: Sequence[tuple[Rule, dict[str, Any]]]) -> list[dict]:
    """The steps as the stats file records them: name and every parameter's value."""
    return [{"name": r.name, "params": dict(params)} for r, params in chosen]
