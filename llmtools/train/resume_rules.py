"""What each config key may do on resume, declared beside the field it governs.

Every field of a train-config section carries its :class:`Rule` in its metadata (:func:`ruled`), and a section
class is declared with :func:`config_section`, which refuses at class creation a field that has none: a new
key cannot be added without deciding whether a resumed run may change it. :mod:`llmtools.train.resume`
reads the rules from the fields; the kinds are explained there.

Light on purpose (no import of our package): the config sections, the tasks' own sections and the resume
policy all import it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

APPLY, RESET_DATA, RESHARD, NEVER, DERIVED = "apply", "reset-data", "reshard", "never", "derived"

# What a refused key says the user can do instead.
NEW_RUN = "start a new run from these weights, -o NEW_RUN --init-from {checkpoint}"
OTHER_RUN = "train it as a new run, -o NEW_RUN"

RULE = "resume"  # the metadata key of a field's rule
EACH_KEY = "resume_each"  # a mapping field's rules for some of its keys (the model's inline fields)


@dataclass(frozen=True)
class Rule:
    kind: str
    note: str  # how an applied change takes effect, or why a change is refused
    way: str = ""  # for ``never``: what to do instead


# Rules several fields share.
FROM_NEXT_STEP = Rule(APPLY, "from the next step on")
DATA_POSITION = Rule(RESET_DATA, "the data position belongs to the old data")
WEIGHTS_FROM_CHECKPOINT = Rule(APPLY, "no effect on a resumed run: its weights come from the checkpoint")


def ruled(rule: Rule, default: Any = dataclasses.MISSING, **options: Any) -> Any:
    """A dataclass field with its resume rule (``options``: ``default_factory``, ``metadata``, ...)."""
    metadata = {**options.pop("metadata", {}), RULE: rule}
    return dataclasses.field(default=default, metadata=metadata, **options)


def rule_of(f: dataclasses.Field) -> Rule | None:
    return f.metadata.get(RULE)


def whole_rule(cls: type) -> Rule | None:
    """The rule of a section's own key, compared whole where one side has no such section."""
    return getattr(cls, "__resume_whole__", None)


def has_rules(cls: Any) -> bool:
    """A section whose keys are compared one by one on resume (declared with :func:`config_section`)."""
    return isinstance(cls, type) and getattr(cls, "__resume_rules__", False)


def config_section(cls: type | None = None, *, whole: Rule | None = None) -> Any:
    """``@dataclass`` for a config section, refusing a field without a resume rule (internal fields and
    sections that carry their own rules aside). ``whole``: the rule of the section's own key (a section
    that may be absent, compared whole where one side has none)."""

    def wrap(cls: type) -> type:
        cls = dataclass(cls)
        for f in dataclasses.fields(cls):
            if rule_of(f) is None and not f.metadata.get("internal") and not _section_field(f):
                raise TypeError(
                    f"{cls.__qualname__}.{f.name}: no resume rule; declare one beside the field "
                    "(llmtools.train.resume_rules.ruled): may a resumed run change it?"
                )
        cls.__resume_rules__ = True
        cls.__resume_whole__ = whole
        return cls

    return wrap if cls is None else wrap(cls)


def _section_field(f: dataclasses.Field) -> bool:
    factory = f.default_factory
    return factory is not dataclasses.MISSING and has_rules(type(factory()))
