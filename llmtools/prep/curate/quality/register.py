"""The quality rules and recipes in `llm-prep filter`'s table (imported by the registry on first use):
each rule's parameters from its dataclass, each recipe from `RECIPES`."""

from __future__ import annotations

from llmtools.errors import UsageError
from llmtools.prep.curate.quality.params import Param as QualityParam
from llmtools.prep.curate.quality.params import params_of, parse
from llmtools.prep.curate.quality.recipes import RECIPES, RULES
from llmtools.prep.curate.registry import Param, Recipe, Rule, register_recipe, register_rule

# how the command's table reads a value of each kind; the rest arrive as written and are read here
_TABLE_KIND = {"int": int, "int?": int, "float": float, "float?": float, "bool": bool, "words": list}

_RECIPE_HELP = {
    "fineweb": "datatrove's FineWeb pipeline after language identification",
    "gopher": "Gopher's repetition, then quality rules",
    "c4": "C4's line and document rules (add --rule c4_badwords with a local list for its bad words)",
}


def _value(p: QualityParam, value):
    if isinstance(value, str) and p.kind != "str":
        value = parse(value, p.kind, f"--set {p.qualified}")
    elif isinstance(value, list):
        value = tuple(value)
    if value is None and not p.kind.endswith("?"):
        raise UsageError(f"--set {p.qualified}: takes a value ({p.kind}), not none")
    return value


def _builder(rule_class):
    table = {p.name: p for p in params_of(rule_class)}

    def build(**values):
        return rule_class(**{name: _value(table[name], value) for name, value in values.items()})

    return build


def _help(rule_class) -> str:
    return (rule_class.__doc__ or "").strip().splitlines()[0]


for _rule in RULES.values():
    register_rule(
        Rule(
            _rule.name,
            _builder(_rule),
            tuple(
                Param(p.name, _TABLE_KIND.get(p.kind, str), p.default, p.meaning) for p in params_of(_rule)
            ),
            _help(_rule),
            changes_text=False,
        )
    )

for _name, _entries in RECIPES.items():
    _rows = []
    for _entry in _entries:
        _table = {p.name: p for p in params_of(RULES[_entry.rule])}
        _rows.append((_entry.rule, {key: _value(_table[key], text) for key, text in _entry.settings}))
    register_recipe(Recipe(_name, tuple(_rows), _RECIPE_HELP[_name]))
