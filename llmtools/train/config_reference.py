"""Every key of the train config, written out from the config dataclasses so the words never drift from the
code: ``docs/config-reference.md`` (a table per section: default, type, resume rule, meaning) and the fully
commented default config that ``llm-train --print-config default`` prints.

    python -m llmtools.train.config_reference > docs/config-reference.md

The meaning of a key is its field's docstring (:mod:`llmtools.train.schema` reads them), its resume rule the
:class:`~llmtools.train.resume_rules.Rule` declared beside it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal

from llmtools.train import config as config_module
from llmtools.train.resume_rules import rule_of, whole_rule
from llmtools.train.schema import _field_docs

# What each resume rule means (llmtools.train.resume holds the policy that reads them).
RULE_KINDS = {
    "apply": "a resumed run may change it; the new value is used from the first resumed step and announced",
    "reset-data": "changed on resume only with --reset-data (the data position belongs to the old data); "
    "a pretraining mix continues every source where it stopped instead",
    "reshard": "changed on resume only with --reshard (the optimizer state is converted)",
    "never": "a resumed run keeps it; a change is refused, naming what to do instead",
    "derived": "not compared itself: what it decides is compared",
}
TOP_LEVEL = "(top level)"


@dataclasses.dataclass(frozen=True)
class Key:
    section: str  # TOP_LEVEL for task, lora
    key: str
    type: str
    default: Any  # dataclasses.MISSING: required
    rule: str
    meaning: str

    @property
    def dotted(self) -> str:
        return self.key if self.section == TOP_LEVEL else f"{self.section}.{self.key}"


def type_text(tp) -> str:
    """A type as a reader of YAML thinks of it: ``int``, ``float or null``, ``one of: a, b``, ``list of str``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        named = [type_text(a) for a in args if a is not type(None)]
        return " or ".join(named + (["null"] if type(None) in args else []))
    if origin is Literal:
        return "one of: " + ", ".join(str(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list of {type_text(typing.get_args(tp)[0])}"
    if origin is dict:
        return "mapping"
    if origin is tuple:
        return "list"
    if dataclasses.is_dataclass(tp):
        return "section"
    return {int: "int", float: "float", str: "str", bool: "bool", type(None): "null"}.get(tp, str(tp))


def _rule_text(rule) -> str:
    if rule is None:
        return ""
    text = f"{rule.kind}: {rule.note}" if rule.note else rule.kind
    way = rule.way.replace("{checkpoint}", "CHECKPOINT")
    return f"{text} (instead: {way})" if way else text


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def keys() -> list[Key]:
    """Every key of the train config, section by section, in the order the dataclasses declare them."""
    docs = _field_docs()
    out = []
    top = {f.name: f for f in dataclasses.fields(config_module.TrainConfig)}
    for name, cls in config_module.SECTION_TYPES.items():
        hints = typing.get_type_hints(cls)
        # A section compared whole (lora): its keys follow the section's rule.
        whole = whole_rule(cls) or (rule_of(top[name]) if name in top else None)
        for f in dataclasses.fields(cls):
            if f.metadata.get("internal") or (name == "model" and f.name == "overrides"):
                continue
            out.append(
                Key(name, config_module.config_key(f), type_text(hints[f.name]), _default_of(f),
                    _rule_text(rule_of(f) or whole), docs.get((cls.__name__, f.name), ""))
            )  # fmt: skip
    hints = typing.get_type_hints(config_module.TrainConfig)
    for f in dataclasses.fields(config_module.TrainConfig):
        if f.metadata.get("internal") or (f.name in config_module.SECTION_TYPES and f.name != "lora"):
            continue
        default = _default_of(f)
        out.append(
            Key(TOP_LEVEL, f.name, "section or null" if f.name == "lora" else type_text(hints[f.name]), default,
                _rule_text(rule_of(f)), docs.get(("TrainConfig", f.name), ""))
        )  # fmt: skip
    return out


def _value(value: Any) -> str:
    """A default as YAML writes it, on one line, so that it reads back as the same value (``1e-08`` would
    read back as a string: YAML 1.1 wants ``1.0e-08``)."""
    import yaml

    if value is dataclasses.MISSING:
        return "(required)"
    if dataclasses.is_dataclass(value):
        return "{}"
    if isinstance(value, tuple):
        value = list(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 16, sort_keys=False).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _section_docs() -> dict[str, str]:
    out = {}
    for name, cls in config_module.SECTION_TYPES.items():
        doc = " ".join((cls.__doc__ or "").split())
        if name == "model":
            doc += (" Any other key under model: is a ModelConfig field (Hugging Face Llama / Qwen3 / Qwen3-MoE / "
                    "Mixtral names) overriding the preset.")  # fmt: skip
        whole = whole_rule(cls)
        if whole is not None:
            doc += f" The section as a whole on resume: {_rule_text(whole)}."
        out[name] = doc
    return out


def reference_markdown() -> str:
    """``docs/config-reference.md``."""
    lines = [
        "# Train config reference",
        "",
        "Every key of the YAML train config of `llm-train`, with its default, its type, what a resumed run may "
        "do with it and what it means. Generated from the config dataclasses (`llmtools/train/config.py`, "
        "`config_sections.py` and the task and LoRA sections) by "
        "`python -m llmtools.train.config_reference > docs/config-reference.md`; a test fails when this page "
        "and the code differ. The JSON Schema of the same keys is `schemas/train-config.schema.json`.",
        "",
        "`llm-train --print-config default` prints all of them as a commented YAML file; "
        "`llm-train --print-config NAME` prints a shipped config (" + ", ".join(_shipped_train()) + "), and "
        "`llm-train NAME --deepspeed zero2` trains it. An unknown key is refused with the key it most likely "
        "means; `--set section.key=value` overrides any key. Relative paths are relative to the working folder.",
        "",
        "Resume rules (`llm-train --resume`: the config is compared key by key with the checkpoint's):",
        "",
        *[f"- `{kind}`: {meaning}." for kind, meaning in RULE_KINDS.items()],
        "",
    ]
    section_docs = _section_docs()
    current = None
    for key in keys():
        if key.section != current:
            current = key.section
            title = "Top level" if current == TOP_LEVEL else f"`{current}:`"
            lines += ["", f"## {title}", ""]
            if current in section_docs:
                lines += [section_docs[current], ""]
            lines += ["| key | default | type | on resume | meaning |", "|---|---|---|---|---|"]
        lines.append(
            f"| `{key.dotted}` | `{_cell(_value(key.default))}` | {_cell(key.type)} | {_cell(key.rule)} | "
            f"{_cell(key.meaning)} |"
        )
    return "\n".join(lines) + "\n"


def _shipped_train() -> list[str]:
    from llmtools.resources import names

    return names("train")


def _wrap(text: str, prefix: str, width: int = 100) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width=width, initial_indent=prefix, subsequent_indent=prefix) or [
        prefix.rstrip()
    ]


def default_config_yaml() -> str:
    """Every key with its default, each under a comment saying what it means and what a resume may do with it.
    The sections only some runs have (``lora:``, a task's own) are there commented out. The model, the data
    and the length of the run have no default that trains: the header says so."""
    out = [
        "# The train config of llm-train, every key at its default (llm-train --print-config default).",
        "# Three have no default that trains: model.preset (or model.init_from, or the model's fields inline),",
        "# data.mix (a mix.json from llm-mix; or data.prefixes + data.seq_length) and training.train_steps (or",
        "# training.train_tokens). Keep what you change and delete the rest. docs/config-reference.md has the",
        "# default, type, resume rule and meaning of each key.",
    ]
    section_docs = _section_docs()
    optional = set(config_module.OPTIONAL_SECTIONS)
    current = None
    for key in keys():
        if key.section == TOP_LEVEL:
            if key.key in optional:
                continue  # written as its commented-out section
            if current != TOP_LEVEL:
                out.append("")
            current = TOP_LEVEL
            out += _wrap(f"{key.meaning} [{key.type}; resume: {key.rule}]", "# ")
            out.append(f"{key.key}: {_value(key.default)}")
            continue
        mark = "# " if key.section in optional else ""
        if key.section != current:
            current = key.section
            out += ["", *_wrap(section_docs.get(current, ""), "# ")]
            if mark:
                out.append(f"# (only when wanted: remove the '# ' of the {current}: lines below)")
            out.append(f"{mark}{current}:")
        out += _wrap(f"{key.meaning} [{key.type}; resume: {key.rule}]", "  # ")
        value = "null" if key.default is dataclasses.MISSING else _value(key.default)
        out.append(f"{mark}  {key.key}: {value}")
    return "\n".join(out) + "\n"


DEFAULT = "default"  # --print-config's name of the generated config; no shipped config takes it


def config_text(name: str) -> str:
    """What ``llm-train --print-config NAME`` prints: the commented default config, or a train config named
    by the rule every name-or-path option follows (a shipped one by name, else the file)."""
    from pathlib import Path

    from llmtools.errors import InputError
    from llmtools.resources import announce_shadow, locate

    if name == DEFAULT:
        if Path(name).exists():
            announce_shadow("train", name, Path(name).is_dir(), what="generated default config")
        return default_config_yaml()
    path = locate("train", name)
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: cannot read ({getattr(error, 'strerror', None) or error})") from None


if __name__ == "__main__":
    print(reference_markdown(), end="")
