"""The train config: its sections (:mod:`llmtools.train.config_sections`) assembled, loaded from YAML with
``--set`` overrides.

Layout (``schemas/train-config.schema.json``; example ``configs/train/tiny.yaml``)::

    model:      preset (name in configs/models/, a path, or null) + inline ModelConfig fields, init_from
    data:       mix (a mix.json) or prefixes + weights + seq_length; split, seed, cache_dir
    training:   micro_batch_size, global_batch_size, train_steps or train_tokens, precision, clip_grad, seed
    fp16:       DeepSpeed's loss scaling when training.precision is fp16 (dynamic by default)
    optimizer:  adamw | adafactor | lion | muon (lr, betas, eps, weight_decay; no decay on norms and biases)
    schedule:   warmup then cosine | linear | constant | wsd | inverse_sqrt; total_steps fixed in the config
    eval:       every N steps on the valid split (loss, perplexity, token accuracy, bits per byte), iters batches
    logging:    log_every, report_to (tensorboard, wandb, mlflow), norms (parameter norm, update norm and update/parameter ratio)
    checkpoint: save_every, keep_last, keep_every
    health:     NaN/inf loss, grad-norm and update-ratio spikes: skip the step or stop with a checkpoint

Every key is checked: an unknown key is an error with a ``difflib`` suggestion, a wrong type names the key
and the file. Nothing here imports torch, so ``llm-train --help`` and config validation stay instant.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import types
import typing
from dataclasses import field
from typing import Any, Literal

from llmtools.errors import InputError, UsageError
from llmtools.formats import yamlfile
from llmtools.model.lora import LoraSection  # no torch at import: config validation stays instant
from llmtools.resources import locate, shown
from llmtools.train.config_sections import (
    CheckpointSection,
    DataSection,
    DistributedSection,
    EvalSection,
    Fp16Section,
    HealthSection,
    LoggingSection,
    ModelSection,
    OptimizerSection,
    ParallelSection,
    ScheduleSection,
    TrainingSection,
    did_you_mean,
)
from llmtools.train.resume_rules import NEVER, OTHER_RUN, Rule, config_section, ruled
from llmtools.train.tasks import TASKS, check_sections, check_task, task_sections

# The optimizer keys only Muon reads.
MUON_KEYS = ("momentum", "nesterov", "ns_steps", "muon_lr", "muon_adjust_lr")
DEFAULT_TASK = "pretrain"


@config_section
class TrainConfig:
    """The whole train config. ``source`` is the YAML it came from (for messages and relative paths)."""

    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=lambda: DataSection(mix="mix.json"))
    training: TrainingSection = field(default_factory=lambda: TrainingSection(train_steps=100))
    fp16: Fp16Section = field(default_factory=Fp16Section)
    optimizer: OptimizerSection = field(default_factory=OptimizerSection)
    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    eval: EvalSection = field(default_factory=EvalSection)
    logging: LoggingSection = field(default_factory=LoggingSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    health: HealthSection = field(default_factory=HealthSection)
    distributed: DistributedSection = field(default_factory=DistributedSection)
    parallel: ParallelSection = field(default_factory=ParallelSection)
    task: str = ruled(Rule(NEVER, "another training task", OTHER_RUN), DEFAULT_TASK)
    """What is trained: a name in the table of tasks (llmtools.train.tasks.TASKS)."""
    lora: LoraSection | None = ruled(Rule(NEVER, "other adapters than the checkpoint holds", OTHER_RUN), None)
    """LoRA adapters on a frozen base; None trains every weight."""
    task_sections: dict[str, Any] = field(default_factory=dict, metadata={"internal": True})
    """The task's own section (``name: section``, from the table of tasks), with its defaults when not given;
    written as the section's key beside the others."""
    source: str | None = field(default=None, metadata={"internal": True})

    # -- derived values --------------------------------------------------------------------------
    def data_parallel(self, world_size: int) -> int:
        """Data-parallel replicas: the ranks of a sequence- or tensor-parallel group read the same samples."""
        return max(1, world_size // self.model_parallel)

    @property
    def model_parallel(self) -> int:
        """Ranks that share each sample: a sequence-parallel or a tensor-parallel group."""
        return self.parallel.sequence * self.parallel.tensor

    def grad_accumulation(self, world_size: int) -> int:
        """Micro-batches per rank per step; the global batch must split evenly over the data-parallel ranks."""
        world_size = self.data_parallel(world_size)
        per_step = self.training.micro_batch_size * world_size
        if self.training.global_batch_size % per_step:
            raise UsageError(
                f"training.global_batch_size={self.training.global_batch_size} is not a multiple of "
                f"training.micro_batch_size={self.training.micro_batch_size} x world size {world_size}"
            )
        return self.training.global_batch_size // per_step

    def steps(self, seq_length: int) -> int:
        """Optimizer steps of this run (train_steps, or train_tokens rounded up to whole steps)."""
        if self.training.train_steps is not None:
            return self.training.train_steps
        return math.ceil(self.training.train_tokens / (self.training.global_batch_size * seq_length))

    def total_steps(self, seq_length: int) -> int:
        """Length of the LR curve: schedule.total_steps, else this run's steps."""
        return self.schedule.total_steps or self.steps(seq_length)

    def to_dict(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            if f.metadata.get("internal"):
                continue
            value = getattr(self, f.name)
            if not dataclasses.is_dataclass(value):  # task (a string), lora when not given (None)
                out[f.name] = value
                continue
            section = _section_dict(value)
            if f.name == "model":
                section = {
                    "preset": section["preset"],
                    "init_from": section["init_from"],
                    **({"expert_parallel": section["expert_parallel"]} if section["expert_parallel"] else {}),
                    **section["overrides"],
                }
            out[f.name] = section
        for name in TASK_SECTIONS:  # every task's section, None where not this task's
            value = self.task_sections.get(name)
            out[name] = None if value is None else _section_dict(value)
        return out

    def task_inputs(self) -> list[str | None]:
        """Paths the task's own section reads (its fields marked ``input``): a run never writes over them."""
        return [
            getattr(section, f.name)
            for section in self.task_sections.values()
            for f in dataclasses.fields(section)
            if f.metadata.get("input")
        ]

    def fingerprint(self) -> str:
        """sha256 over what determines the trained weights (model, data, batch, optimizer, schedule)."""
        d = self.to_dict()
        keep = {k: d[k] for k in ("model", "data", "training", "optimizer", "schedule")}
        keep["training"].pop("activation_checkpointing", None)  # same weights with or without it
        keep["training"].pop("compile", None)  # the same weights within rounding, and older hashes stay
        # Keys an optimizer or precision does not read leave the hash as it was before they existed.
        if self.optimizer.name != "muon":
            for key in MUON_KEYS:
                keep["optimizer"].pop(key, None)
        if self.training.precision == "fp16":
            keep["fp16"] = d["fp16"]
        # Configs written before tasks and LoRA existed keep their hash: both enter it only when set.
        if self.task != DEFAULT_TASK or self.lora is not None:
            keep.update(task=d["task"], lora=d["lora"])
        for name, section in self.task_sections.items():  # less its fields that leave the weights as they are
            keep[name] = {
                config_key(f): d[name][config_key(f)]
                for f in dataclasses.fields(section)
                if f.metadata.get("fingerprint", True)
            }
        return "sha256:" + hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()


# The tasks' own sections (``name: section class``), from the table of tasks.
TASK_SECTIONS = task_sections()

SECTION_TYPES = {
    "model": ModelSection,
    "data": DataSection,
    "training": TrainingSection,
    "fp16": Fp16Section,
    "optimizer": OptimizerSection,
    "schedule": ScheduleSection,
    "eval": EvalSection,
    "logging": LoggingSection,
    "checkpoint": CheckpointSection,
    "health": HealthSection,
    "distributed": DistributedSection,
    "parallel": ParallelSection,
    "lora": LoraSection,
    **TASK_SECTIONS,
}
# Sections that may be given as null (not given).
OPTIONAL_SECTIONS = ("lora", *TASK_SECTIONS)


def _section_dict(value) -> dict:
    """A section as its YAML keys and plain values."""
    plain = dataclasses.asdict(value)
    return {config_key(f): plain[f.name] for f in dataclasses.fields(value)}


def config_key(f: dataclasses.Field) -> str:
    """The YAML key of a section field: its name, unless that is a Python keyword (``async`` -> ``async_``)."""
    return f.metadata.get("key", f.name)


def field_name(cls: type, key: str) -> str | None:
    """The dataclass field behind a YAML key of section ``cls``, or None when there is none."""
    for f in dataclasses.fields(cls):
        if config_key(f) == key:
            return f.name
    return None


def all_keys() -> list[str]:
    """Every ``section.key`` the config knows (for suggestions and the schema)."""
    keys = []
    for name, cls in SECTION_TYPES.items():
        for f in dataclasses.fields(cls):
            if name == "model" and f.name == "overrides":
                continue
            keys.append(f"{name}.{config_key(f)}")
    return keys


# Names other trainers (HF Trainer, Megatron, nanoGPT) give our keys: spelling distance alone maps
# optimizer.learning_rate to optimizer.name.
ALIASES = {
    "learning_rate": "optimizer.lr",
    "lr_rate": "optimizer.lr",
    "max_steps": "training.train_steps",
    "num_steps": "training.train_steps",
    "train_iters": "training.train_steps",
    "max_iters": "training.train_steps",
    "steps": "training.train_steps",
    "warmup": "schedule.warmup_steps",
    "lr_warmup_iters": "schedule.warmup_steps",
    "warmup_iters": "schedule.warmup_steps",
    "lr_decay_iters": "schedule.total_steps",
    "lr_scheduler_type": "schedule.kind",
    "batch_size": "training.global_batch_size",
    "per_device_train_batch_size": "training.micro_batch_size",
    "max_grad_norm": "training.clip_grad",
    "gradient_clipping": "training.clip_grad",
    "max_seq_length": "data.seq_length",
    "seq_len": "data.seq_length",
    "block_size": "data.seq_length",
    "save_steps": "checkpoint.save_every",
    "eval_steps": "eval.every",
    "logging_steps": "logging.log_every",
}


def suggest(word: str, choices) -> str:
    """`` (did you mean 'X'?)`` for an unknown key or value: a known alias first, then the same key in
    another section, then spelling distance."""
    choices = [str(c) for c in choices]
    section, _, leaf = word.rpartition(".")
    target = ALIASES.get(leaf.lower())
    if target is None and section:
        target = next((k for k in all_keys() if k.rpartition(".")[2] == leaf and k != word), None)
    if target is not None and target in choices:
        return f" (did you mean {target!r}?)"
    return did_you_mean(word, choices)


# -- typed coercion ---------------------------------------------------------------------------------
def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join("null" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    if origin in (list, tuple):
        args = typing.get_args(tp)
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return "mapping"
    return {int: "integer", float: "number", str: "string", bool: "true/false"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def coerce(value: Any, tp, key: str, where: str) -> Any:
    """Check ``value`` against the annotation ``tp``; convert what is safe (int -> float, '3e-4' -> float)."""
    origin = typing.get_origin(tp)
    wrong = InputError(f"{where}: {key}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, key, where)
            except InputError:
                continue
        raise wrong
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise InputError(
            f"{where}: {key}: {value!r} is not one of {', '.join(map(str, typing.get_args(tp)))}"
            + (suggest(value, typing.get_args(tp)) if isinstance(value, str) else "")
        )
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise wrong
        (item,) = typing.get_args(tp) or (Any,)
        return [coerce(v, item, f"{key}[{i}]", where) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise wrong
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise wrong
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise wrong
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # PyYAML reads 3e-4 (no dot) as a string
            try:
                number = float(value)
            except ValueError:
                raise wrong from None
        else:
            raise wrong
        if not math.isfinite(number):  # .inf / .nan in YAML, or 'inf' from --set
            raise InputError(f"{where}: {key}: expected a finite number, got {value!r}")
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        raise wrong
    raise wrong


def _section_from_dict(name: str, cls: type, raw: Any, where: str):
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise InputError(f"{where}: {name}: expected a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    if cls is ModelSection:
        overrides = {}
        for key, value in raw.items():
            if key in ("preset", "init_from", "expert_parallel"):
                kwargs[key] = coerce(value, hints[key], f"model.{key}", where)
            else:
                overrides[str(key)] = value  # checked against ModelConfig's fields when the model resolves
        kwargs["overrides"] = overrides
    else:
        for key, value in raw.items():
            attr = field_name(cls, key)
            if attr is None:
                raise InputError(f"{where}: unknown key {name}.{key}" + suggest(f"{name}.{key}", all_keys()))
            kwargs[attr] = coerce(value, hints[attr], f"{name}.{key}", where)
    try:
        return cls(**kwargs)
    except InputError as error:
        raise InputError(f"{where}: {error}") from None


def from_dict(raw: Any, where: str = "<config>") -> TrainConfig:
    """Build and validate a TrainConfig from a parsed YAML mapping."""
    if not isinstance(raw, dict):
        raise InputError(f"{where}: a train config must be a mapping of sections, got {type(raw).__name__}")
    sections: dict[str, Any] = {}
    own: dict[str, Any] = {}  # the tasks' own sections
    for key, value in raw.items():
        if key == "task":  # a name, not a section
            sections["task"] = check_task(value, where)
            continue
        if key in OPTIONAL_SECTIONS and value is None:  # `lora: null` (or `lora:`): not given
            continue
        if key not in SECTION_TYPES:
            raise InputError(
                f"{where}: unknown section {key!r}" + suggest(str(key), list(SECTION_TYPES) + all_keys())
            )
        section = _section_from_dict(key, SECTION_TYPES[key], value, where)
        if key in TASK_SECTIONS:
            own[key] = section
        else:
            sections[key] = section
    if "data" not in sections:
        raise InputError(f"{where}: missing section 'data' (data.mix or data.prefixes)")
    if "training" not in sections:
        raise InputError(
            f"{where}: missing section 'training' (training.train_steps or training.train_tokens)"
        )
    config = TrainConfig(**sections, task_sections=own, source=where)
    check_sections(config)
    name = TASKS[config.task].section
    if name is not None and name not in own:  # the task's own section, with its defaults
        own[name] = SECTION_TYPES[name]()
    if config.training.train_steps is not None:  # in tokens: checked once the data names seq_length
        check_run_length(config, config.training.train_steps, where)
    return config


def check_run_length(config: TrainConfig, steps: int, where: str, seq_length: int | None = None) -> None:
    """Every check on the run's length, whichever way it is given: ``steps`` are training.train_steps, or
    training.train_tokens in whole steps of ``seq_length`` tokens per sample (known once the data is open)."""
    if config.training.train_steps is not None or seq_length is None:
        given, follows = f"training.train_steps={steps}", "training.train_steps"
    else:
        tokens, batch = config.training.train_tokens, config.training.global_batch_size
        given = f"training.train_tokens={tokens} ({steps} steps of {batch} x {seq_length} tokens)"
        follows = "training.train_tokens"
    total = config.schedule.total_steps
    if total is not None and steps > total:
        raise InputError(
            f"{where}: {given} runs past schedule.total_steps={total}; "
            f"set schedule.total_steps >= {steps} or remove it (it then follows {follows})"
        )
    length = total if total is not None else steps
    warmup = config.schedule.warmup_steps
    if warmup > 0 and warmup >= length:
        which = f"schedule.total_steps={total}" if total is not None else given
        raise InputError(
            f"{where}: schedule.warmup_steps={warmup} is not shorter than {which}: the whole "
            f"run would be warmup; set schedule.warmup_steps below {length} (e.g. {max(length // 10, 0)})"
        )


def parse_set(item: str) -> tuple[list[str], Any]:
    """``section.key=value`` -> (["section", "key"], value parsed as YAML)."""
    if "=" not in item:
        raise UsageError(f"--set {item!r}: expected KEY=VALUE, e.g. --set optimizer.lr=1e-3")
    key, text = item.split("=", 1)
    key = key.strip()
    parts = key.split(".")
    if len(parts) != 2 or not all(parts):
        raise UsageError(
            f"--set {item!r}: KEY must be section.key, e.g. training.train_steps" + suggest(key, all_keys())
        )
    try:
        value = yamlfile.loads(text, f"--set {item!r}") if text.strip() else None
    except yamlfile.Refused as error:  # what YAML builds from a value is bounded as for a file
        raise UsageError(str(error)) from None
    except InputError:
        value = text  # not YAML: the text as it is (the key's type then judges it)
    return parts, value


@dataclasses.dataclass(frozen=True)
class Override:
    """One ``--set`` item, parsed and checked once: every later look at it reads ``value``, never the text."""

    item: str
    section: str
    key: str
    value: Any

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.key}"


def parse_overrides(overrides: list[str]) -> list[Override]:
    """``--set`` items parsed as YAML and checked against the key's type as the file's value is (``+8``,
    ``8.0`` and ``8`` are one integer, here as in a file); unknown keys are refused with a suggestion."""
    known = set(all_keys())
    parsed = []
    for item in overrides:
        (section, key), value = parse_set(item)
        dotted = f"{section}.{key}"
        if dotted not in known and section != "model":
            raise UsageError(f"--set {item!r}: unknown key {dotted}" + suggest(dotted, known))
        if section != "model":  # the model's inline keys are checked when the model resolves
            attr = field_name(SECTION_TYPES[section], key)
            value = coerce(
                value, typing.get_type_hints(SECTION_TYPES[section])[attr], dotted, f"--set {item!r}"
            )
        parsed.append(Override(item, section, key, value))
    return parsed


def apply_overrides(raw: dict, overrides: list[str] | list[Override]) -> dict:
    """Apply ``--set`` items (text, or already parsed) to a parsed config."""
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    if overrides and isinstance(overrides[0], str):
        overrides = parse_overrides(overrides)
    for override in overrides:
        target = raw.setdefault(override.section, {})
        if target is None:
            target = raw[override.section] = {}
        if not isinstance(target, dict):
            raise UsageError(
                f"--set {override.item!r}: section {override.section} is not a mapping in the config"
            )
        target[override.key] = override.value
    return raw


def load_train_config(path: str | os.PathLike | None, overrides: list[str] | None = None) -> TrainConfig:
    """Read a YAML train config (or start from an empty one when ``path`` is None) and apply ``--set``.

    ``path`` is a file when it has a ``/`` or ends in .yaml/.yml, else the name of a shipped config (``tiny``;
    :func:`llmtools.resources.locate`)."""
    raw: Any = {}
    where = "<--set>"
    if path is not None:
        given, path = path, locate("train", path)
        where = shown("train", given, path)
        raw = yamlfile.read(path, "train config") or {}
    if not isinstance(raw, dict):
        raise InputError(f"{where}: a train config must be a mapping of sections")
    parsed = parse_overrides(overrides or [])
    _schedule_follows_steps(raw, parsed, where)
    raw = apply_overrides(raw, parsed)
    config = from_dict(raw, where)
    return config


def _file_steps(section: Any, key: str) -> int | None:
    """An integer of the file's ``section`` read as from_dict reads it (None when absent or not one)."""
    value = section.get(key) if isinstance(section, dict) else None
    try:
        return coerce(value, int, key, "")
    except InputError:
        return None  # not an integer: from_dict names it


def _schedule_follows_steps(raw: dict, overrides: list[Override], where: str) -> None:
    """``--set training.train_steps=N`` over a file whose schedule.total_steps equals its train_steps (a
    full curve, as the file's author meant it): the schedule would stay on the file's length and the run
    stop part-way down its curve without a word. Refused with both values and the two ways out. A file
    whose total_steps differs from its train_steps (one curve over several runs) is taken as written."""
    keys = {override.dotted for override in overrides}
    if "training.train_steps" not in keys or "schedule.total_steps" in keys:
        return
    total = _file_steps(raw.get("schedule"), "total_steps")
    steps = _file_steps(raw.get("training"), "train_steps")
    new = [o.value for o in overrides if o.dotted == "training.train_steps"][-1]
    if total is None or total != steps or new is None or new == total:
        return
    raise UsageError(
        f"--set training.train_steps={new}: {where} sets schedule.total_steps={total} (its full run), so the "
        f"learning rate would not finish its curve in {new} steps; add --set schedule.total_steps={new} (a "
        f"curve of {new} steps) or --set schedule.total_steps={total} (stop part-way on purpose)"
    )
