"""Resuming a run: which config keys may change between two runs, which may not, and applying the changes.

A resumed run is the run it claims to be. Its config is compared key by key with the one its checkpoint
was trained with (``meta.json[config]``); every difference is looked up in :data:`POLICY`, which gathers the
rules the config's fields declare beside themselves (:mod:`llmtools.train.resume_rules`) and those of the
values the run resolves (:data:`RESOLVED_RULES`):

- ``apply``: the new value is used from the first resumed step on, and announced on stderr and as a
  ``config_change`` event in ``metrics.jsonl``;
- ``reset-data``: allowed only with ``--reset-data`` (the data position belongs to the old data); a
  task whose data keeps a ledger (pretraining, :mod:`llmtools.data.ledger`) continues changed data
  (``data.*``, the plan) by the ledger's rules instead: every source where it stopped, announced, or
  refused when it cannot be continued;
- ``reshard``: allowed only with ``--reshard`` (the optimizer state goes through a DeepSpeed universal
  checkpoint);
- ``never``: refused, whatever the flags;
- ``derived``: not compared (it follows from other keys).

A refusal is an :class:`~llmtools.errors.InputError` (exit 2) naming the key, both values and the flag that
would allow it, raised before anything is written to the run folder.

The learning rate after a change of ``optimizer.lr`` or ``schedule.*``: the schedule is a function of the
step, ``lr(s) = optimizer.lr x factor(s)`` (:mod:`llmtools.train.schedule`); a resumed run continues at
its step on the *new* function. The first resumed step ``s + 1`` uses ``new_lr x new_factor(s + 1)``, so a
new peak scales the rest of the curve and a new shape (kind, warmup, total_steps, ...) is joined where it
stands at that step; nothing is re-warmed.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmtools.ckpt import rng
from llmtools.ckpt.reshard import check_layout
from llmtools.errors import InputError, RuntimeFailure
from llmtools.formats import jsonfile
from llmtools.model.config import SHAPE_FIELDS
from llmtools.model.presets import load_model_config
from llmtools.train.config import SECTION_TYPES, TrainConfig, config_key
from llmtools.train.engine import param_groups
from llmtools.train.optimizers import OPTIMIZERS
from llmtools.train.resume_rules import (
    APPLY,
    DERIVED,
    EACH_KEY,
    NEVER,
    NEW_RUN,
    OTHER_RUN,
    RESET_DATA,
    RESHARD,
    Rule,
    has_rules,
    rule_of,
    whole_rule,
)
from llmtools.train.tasks import TASKS

# ZeRO stages DeepSpeed's universal checkpoint converts between (it refuses ZeRO-0 and ZeRO-3 here).
RESHARDABLE_STAGES = {1, 2}

# Keys the run resolves rather than reads from its config (see view()).
RESOLVED_RULES = {
    "tokenizer": Rule(NEVER, "token ids would mean something else (a different tokenizer)", OTHER_RUN),
    "data.plan": Rule(RESET_DATA, "another sample plan under this data"),
    "world_size": Rule(
        APPLY, "resharded through a DeepSpeed universal checkpoint; RNG streams are not restored"
    ),
    "zero_optimization.stage": Rule(RESHARD, "the optimizer state is partitioned for the old stage"),
}


def _config_rules() -> dict[str, Rule]:
    """The rules the config's fields declare (llmtools.train.resume_rules), keyed ``section.key`` (``task``,
    ``lora`` for a top-level field; ``model.*`` for the model's inline fields)."""
    rules = {f.name: rule_of(f) for f in dataclasses.fields(TrainConfig) if rule_of(f) is not None}
    for name, section in SECTION_TYPES.items():
        if not has_rules(section):
            continue
        if whole_rule(section) is not None:
            rules[name] = whole_rule(section)
        for f in dataclasses.fields(section):
            if EACH_KEY in f.metadata:  # a mapping of inline keys: its own exceptions, then the rest
                rules.update({f"{name}.{key}": rule for key, rule in f.metadata[EACH_KEY].items()})
                rules[f"{name}.*"] = rule_of(f)
            else:
                rules[f"{name}.{config_key(f)}"] = rule_of(f)
    return rules


# Looked up by the exact key first, then by ``section.*``.
POLICY: dict[str, Rule] = {**_config_rules(), **RESOLVED_RULES}

# A data change the task's data ledger takes over (its own checks refuse what cannot be continued).
CONTINUED_BY_LEDGER = Rule(
    APPLY, "continued by the data ledger: every source where it stopped (see data: lines)"
)

_FLAGS = {
    RESET_DATA: "pass --reset-data to continue the step count and schedule on the new data from its beginning",
    RESHARD: "pass --reshard to convert the optimizer state through a DeepSpeed universal checkpoint",
}
# Sections compared key by key (their fields declare rules); any other top-level value is compared whole.
_SECTIONS = {name for name, cls in SECTION_TYPES.items() if has_rules(cls)}
_TOKENIZER_IDENTITY = ("hash", "vocab_size", "eod_id")


def rule_for(key: str) -> Rule:
    if key in POLICY:
        return POLICY[key]
    section = key.split(".", 1)[0]
    if f"{section}.*" in POLICY:
        return POLICY[f"{section}.*"]
    return Rule(NEVER, "not covered by the resume policy", OTHER_RUN)


@dataclass(frozen=True)
class Change:
    key: str
    old: Any
    new: Any
    rule: Rule

    def describe(self) -> str:
        return f"{self.key}: {_show(self.old)} -> {_show(self.new)} ({self.rule.note})"


def _show(value: Any) -> str:
    return json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else repr(value)


# ------------------------------------------------------------------------------------------ views
def _model_fields(model: dict) -> dict:
    """Every model field with derived ones filled in, so both sides compare alike."""
    fields = {k: v for k, v in model.items() if k not in ("preset", "init_from")}
    try:
        fields = load_model_config(dict(fields)).to_dict(full=True)
    except Exception:  # noqa: BLE001 - not a complete model config: compare the fields as given
        pass
    return {**{k: model[k] for k in ("preset", "init_from") if k in model}, **fields}


def view(resolved: dict) -> dict[str, Any]:
    """A resolved config (RUN/config.yaml, meta.json[config]) as ``key -> value`` for comparison."""
    out: dict[str, Any] = {}
    fp16 = (resolved.get("training") or {}).get("precision") == "fp16"
    for section, value in resolved.items():
        if section == "resolved" or (section == "fp16" and not fp16):  # loss scaling: fp16 runs only
            continue
        if section in _SECTIONS and isinstance(value, dict):
            if section == "model":
                # expert_parallel is left out of a config that does not set it: None then, not unknown
                value = {"expert_parallel": None, **_model_fields(value)}
            for key, item in value.items():
                out[f"{section}.{key}"] = item
        else:
            out[section] = value
    extra = resolved.get("resolved") or {}
    if "world_size" in extra:
        out["world_size"] = extra["world_size"]
    if "zero_stage" in extra:
        out["zero_optimization.stage"] = extra["zero_stage"]
    tokenizer = extra.get("tokenizer")
    if isinstance(tokenizer, dict):
        out["tokenizer"] = {k: tokenizer.get(k) for k in _TOKENIZER_IDENTITY if k in tokenizer}
    if extra.get("data_plan") is not None:
        out["data.plan"] = extra["data_plan"]
    return out


def saved_view(meta: dict) -> dict[str, Any]:
    """What a checkpoint was trained with: meta.json[config], or what older checkpoints recorded."""
    config = meta.get("config")
    if isinstance(config, dict):
        saved = view(config)
    else:  # saved before meta.json carried the config: the few keys it has
        resolved: dict[str, Any] = {
            "world_size": meta.get("world_size"),
            "zero_stage": meta.get("zero_stage"),
            "tokenizer": meta.get("tokenizer"),
        }
        raw: dict[str, Any] = {"training": {"precision": meta.get("precision")}, "resolved": resolved}
        if isinstance(meta.get("model"), dict):
            raw["model"] = dict(meta["model"])
        fingerprint = (meta.get("data") or {}).get("fingerprint")
        try:
            raw["data"] = jsonfile.loads(fingerprint, ours=True) if isinstance(fingerprint, str) else None
        except ValueError:
            raw["data"] = None
        if not isinstance(raw["data"], dict):
            raw.pop("data")
        saved = {k: v for k, v in view(raw).items() if v is not None}
    plan = (meta.get("data") or {}).get("plan")
    if plan is not None:
        saved["data.plan"] = plan
    if "expert_parallel" in meta:  # the layout the files were written in, whatever the config said
        saved["model.expert_parallel"] = meta["expert_parallel"]
    return saved


# ------------------------------------------------------------------------------------------ review
def review(
    meta: dict,
    checkpoint: str | Path,
    current: dict,
    *,
    reset_data: bool = False,
    reshard: bool = False,
    own_scheduler: bool = False,
    data_ledger: bool = False,
) -> list[Change]:
    """Compare the checkpoint's config with ``current`` (a resolved config); the changes to apply, or
    InputError for the first refused one (naming the key, both values and what would allow it).
    ``data_ledger``: the task's data keeps a ledger, which continues a change of ``data.*``."""
    where = Path(checkpoint) / "meta.json"
    saved, now = saved_view(meta), view(current)
    if "data.plan" in saved and "data.plan" not in now:
        now["data.plan"] = None  # the run no longer reads a plan with an identity (prefixes, or none yet)
    changes, refused = [], []
    for key in sorted((k for k in now if k in saved), key=_order):  # stable: the config's own order within
        if saved[key] == now[key]:
            continue
        rule = rule_for(key)
        if rule.kind == DERIVED:
            continue
        if rule.kind == RESET_DATA and data_ledger and key.startswith("data.") and not reset_data:
            rule = CONTINUED_BY_LEDGER
        change = Change(key, saved[key], now[key], rule)
        allowed = (
            rule.kind == APPLY
            or (rule.kind == RESET_DATA and reset_data)
            or (rule.kind == RESHARD and reshard)
        )
        (changes if allowed else refused).append(change)
    step = int(meta.get("step") or 0)
    for change in refused:  # a stage no flag converts: say so, rather than name a flag that refuses it too
        if change.key == "zero_optimization.stage":
            _check_applicable(change, where, step, own_scheduler)
    if refused:
        first, rest = refused[0], refused[1:]
        also = f" (and {len(rest)} more: {', '.join(c.key for c in rest)})" if rest else ""
        raise InputError(
            f"{where}[{first.key}]: checkpoint has {_show(first.old)}, the config has {_show(first.new)}; "
            f"{first.rule.note} ({_way(first.rule, checkpoint)}){also}"
        )
    task = TASKS.get(now.get("task"))
    for change in changes:
        _check_applicable(change, where, step, own_scheduler)
        refusal = task.refuse_resumed_change(change.key, change.old, change.new) if task else None
        if refusal:  # the task's own reason, before it computes anything or config.yaml is rewritten
            raise InputError(
                f"{where}[{change.key}]: checkpoint has {_show(change.old)}, the config has {_show(change.new)}; "
                f"{refusal}"
            )
        _check_reshardable(change, where, now.get("optimizer.name"))
    _check_layout(meta, where, now)
    return changes


def _check_layout(meta: dict, where: Path, now: dict[str, Any]) -> None:
    """A layout the checkpoint cannot be loaded in is refused here, before any work, as such (never as a
    damaged checkpoint, nor by trying older ones that share its layout)."""
    world, stage = now.get("world_size"), now.get("zero_optimization.stage")
    if not isinstance(world, int) or not isinstance(stage, int):
        return
    tensor, sequence = now.get("parallel.tensor", 1), now.get("parallel.sequence", 1)
    check_layout(
        meta,
        where.parent,
        world=world,
        stage=stage,
        tensor=tensor if isinstance(tensor, int) else 1,
        sequence=sequence if isinstance(sequence, int) else 1,
    )


def _order(key: str) -> int:
    # Refusals name the most fundamental key first: the model's shape, the rest of the model, then the
    # tokenizer, precision, data ...
    if key.startswith("model.") and key[len("model.") :] in SHAPE_FIELDS:
        return 0
    first = (
        "model.",
        "tokenizer",
        "task",
        "lora",
        "training.precision",
        "zero_optimization",
        "optimizer.name",
    )
    for rank, prefix in enumerate(first, start=1):
        if key.startswith(prefix):
            return rank
    return len(first) + 1


def _way(rule: Rule, checkpoint: str | Path) -> str:
    if rule.kind in _FLAGS:
        return _FLAGS[rule.kind]
    return "no flag allows it: " + rule.way.format(checkpoint=checkpoint)


def _check_reshardable(change: Change, where: Path, optimizer: str | None) -> None:
    """Resharding goes through DeepSpeed's universal checkpoint, which carries Adam's moments (exp_avg,
    exp_avg_sq) and nothing else: Lion's, Muon's or Adafactor's state cannot cross it."""
    if change.key not in ("world_size", "zero_optimization.stage") or optimizer is None:
        return
    if optimizer in OPTIMIZERS and OPTIMIZERS[optimizer].reshardable:
        return
    raise InputError(
        f"{where}[{change.key}]: checkpoint has {_show(change.old)}, the config has {_show(change.new)}; "
        f"optimizer.name={optimizer!r}: DeepSpeed's universal checkpoint, which reshards the optimizer state, "
        f"carries Adam's moments only: resume with {change.key.split('.')[-1]} {_show(change.old)}, or "
        f"{NEW_RUN.format(checkpoint=where.parent)}"
    )


def _check_applicable(change: Change, where: Path, step: int, own_scheduler: bool) -> None:
    key = change.key
    if key == "model.expert_parallel" and (change.old is None) != (change.new is None):
        path = where.parent
        if change.old is None:
            raise InputError(
                f"{where}[{key}]: saved without expert parallelism, and this run sets model.expert_parallel="
                f"{change.new}; resume it without (or start from its weights: model.init_from {path})"
            )
        raise InputError(
            f"{where}[{key}]: saved with model.expert_parallel={change.old} (DeepSpeed's expert-parallel layout); "
            "set model.expert_parallel to resume it (any value dividing the world size), or start from its "
            f"weights: llm-ckpt convert {path} --to hf, then model.init_from"
        )
    if key == "zero_optimization.stage" and not {change.old, change.new} <= RESHARDABLE_STAGES:
        raise InputError(
            f"{where}[{key}]: checkpoint has {change.old!r}, the config has {change.new!r}; --reshard converts "
            f"between ZeRO-1 and ZeRO-2 only (DeepSpeed's universal checkpoint): keep ZeRO-{change.old}, "
            f"or {NEW_RUN.format(checkpoint=where.parent)}"
        )
    if key == "training.train_steps" and isinstance(change.new, int) and change.new <= step:
        raise InputError(
            f"{where}[{key}]: the checkpoint is at step {step}, the config now ends at step {change.new}: "
            f"nothing to train (raise training.train_steps above {step})"
        )
    if own_scheduler and (key in ("optimizer.lr", "optimizer.muon_lr") or key.startswith("schedule.")):
        raise InputError(
            f"{where}[{key}]: checkpoint has {_show(change.old)}, the config has {_show(change.new)}; the "
            "DeepSpeed config's own scheduler keeps its state in the checkpoint and cannot take a new value "
            "(remove 'scheduler' from the DeepSpeed config to use the train config's schedule)"
        )


# ------------------------------------------------------------------------------------------ apply
def decayed_groups(engine, config, groups: list[dict]) -> list[dict]:
    """The optimizer groups a fresh run of ``config`` decays, whatever the checkpoint's decay was (0
    included): the groups are laid out as a fresh run lays them out (same builder, same order; under ZeRO
    a group holds flat partitions, so its parameters' shapes no longer tell); DeepSpeed's MoE support
    splits named groups, whose names keep ``no_decay``."""
    if groups and all(isinstance(g.get("name"), str) for g in groups):
        return [g for g in groups if "no_decay" not in g["name"]]
    module = getattr(engine, "module", None)
    if module is None:
        return [g for g in groups if g.get("weight_decay", 0.0) != 0.0]
    if config.optimizer.name == "muon":
        from llmtools.train.optim import muon_param_groups  # torch: imported once a model exists

        fresh = muon_param_groups(module, 1.0)
    else:
        fresh = param_groups(module, 1.0)
    if len(fresh) != len(groups):
        raise RuntimeFailure(
            f"optimizer.weight_decay: the checkpoint's optimizer has {len(groups)} parameter groups, a fresh "
            f"run {len(fresh)}: cannot tell which to decay"
        )
    return [group for group, new in zip(groups, fresh, strict=True) if new["weight_decay"] != 0.0]


def apply(engine, changes: list[Change], config) -> list[str]:
    """Put the changed optimizer and schedule values into the loaded engine; notes on what moved.

    Everything else the loop reads from the new config by itself (steps, cadences, clipping through the
    DeepSpeed config, the data with --reset-data).
    """
    keys = {c.key for c in changes}
    notes: list[str] = []
    optimizer = engine.optimizer
    groups = optimizer.param_groups
    if keys & {"optimizer.betas", "optimizer.eps", "optimizer.weight_decay"}:
        decayed = decayed_groups(engine, config, groups)
        for group in groups:
            if "optimizer.betas" in keys and "betas" in group:
                group["betas"] = tuple(config.optimizer.betas)
            if "optimizer.eps" in keys and "eps" in group and not group.get("muon"):  # Muon's eps is its own
                group["eps"] = config.optimizer.eps
        if "optimizer.weight_decay" in keys:
            for group in decayed:  # norms and biases keep no decay
                group["weight_decay"] = config.optimizer.weight_decay
    if "training.clip_grad" in keys and hasattr(optimizer, "clip_grad"):
        # DeepSpeed's ZeRO-1/2 and bf16 optimizers take their clipping back from the checkpoint.
        optimizer.clip_grad = config.training.clip_grad
    muon = {
        "optimizer.momentum": ("momentum", config.optimizer.momentum),
        "optimizer.nesterov": ("nesterov", config.optimizer.nesterov),
        "optimizer.ns_steps": ("ns_steps", config.optimizer.ns_steps),
        "optimizer.muon_adjust_lr": ("adjust_lr_fn", config.optimizer.muon_adjust_lr),
    }
    for key in keys & set(muon):
        name, value = muon[key]
        for group in groups:
            if group.get("muon"):
                group[name] = value
    if keys & {"optimizer.lr", "optimizer.muon_lr"} or any(k.startswith("schedule.") for k in keys):
        scheduler = engine.lr_scheduler
        before = [g["lr"] for g in scheduler.optimizer.param_groups]
        # LambdaLR's lambdas were built from the new schedule; only its peak came back from the checkpoint.
        # Muon's matrices have their own peak (optimizer.muon_lr, or optimizer.lr when unset).
        peaks = [
            (config.optimizer.muon_lr or config.optimizer.lr) if g.get("muon") else config.optimizer.lr
            for g in scheduler.optimizer.param_groups
        ]
        scheduler.base_lrs = peaks
        for group, fn, base in zip(
            scheduler.optimizer.param_groups, scheduler.lr_lambdas, scheduler.base_lrs, strict=True
        ):
            group["initial_lr"] = base
            group["lr"] = base * fn(scheduler.last_epoch)
        scheduler._last_lr = [g["lr"] for g in scheduler.optimizer.param_groups]
        step = scheduler.last_epoch + 1
        notes.append(f"learning rate at step {step}: {before[0]:.6g} -> {scheduler._last_lr[0]:.6g}")
    if "training.seed" in keys:
        rng.seed_all(config.training.seed)
        notes.append(f"RNG streams restarted from seed {config.training.seed}")
    return notes
