"""A standard DeepSpeed config, with ``"auto"`` values filled from the train config (as the HF Trainer does).

A real value that disagrees with the train config is an error naming both (the DeepSpeed file and key, the
train-config key and its value), so there is exactly one source of truth for batch sizes, clipping,
precision, the optimizer and the schedule. Whatever is still ``"auto"`` after filling is an error too.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import KeysView
from pathlib import Path
from typing import Any

from llmtools.errors import InputError
from llmtools.formats import jsonfile
from llmtools.resources import locate, shown
from llmtools.thirdparty import import_deepspeed
from llmtools.train.config import TrainConfig, suggest

AUTO = "auto"

# DeepSpeed scheduler types and the train-config schedule kind each one is.
DS_SCHEDULERS = {"WarmupLR": "constant", "WarmupDecayLR": "linear", "WarmupCosineLR": "cosine"}


def find_ds_config(path: str | os.PathLike) -> Path:
    """A DeepSpeed config file (a path: a ``/`` or ``.json``), or the name of one shipped with the package
    (``zero2``); :func:`llmtools.resources.locate` is the one rule."""
    return locate("deepspeed", path)


def load_ds_config(path: str | os.PathLike) -> dict:
    """Read a DeepSpeed JSON config (a path or a shipped name); a syntax error names the line and column."""
    given, path = path, find_ds_config(path)
    where = shown("deepspeed", given, path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{where}: no such DeepSpeed config") from None
    try:
        data = jsonfile.loads(text, finite=True)
    except json.JSONDecodeError as error:
        raise InputError(f"{where}:{error.lineno}:{error.colno}: not valid JSON ({error.msg})") from None
    if not isinstance(data, dict):
        raise InputError(f"{where}: a DeepSpeed config must be a JSON object")
    return data


class _Filler:
    def __init__(self, ds: dict, ds_source: str, cfg_source: str) -> None:
        self.ds = ds
        self.ds_source = ds_source
        self.cfg_source = cfg_source

    def fill(self, path: str, value: Any, cfg_key: str, *, shown: str | None = None) -> None:
        """Set ``path`` (dotted) to ``value`` when absent or "auto"; a different real value is an error."""
        node = self.ds
        parts = path.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise InputError(f"{self.ds_source}[{path}]: expected an object at {part!r}")
        key = parts[-1]
        current = node.get(key, AUTO)
        if current == AUTO:
            node[key] = value
            return
        if not _same(current, value):
            raise InputError(
                f"{self.ds_source}[{path}]={json.dumps(current)} contradicts {shown or f'{cfg_key}={json.dumps(value)}'} "
                f'in {self.cfg_source} (write "auto" in the DeepSpeed config, or make them agree)'
            )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(a - b) <= 1e-12 * max(abs(a), abs(b), 1.0)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def resolve_ds_config(
    ds: dict,
    config: TrainConfig,
    *,
    world_size: int,
    total_steps: int,
    hidden_size: int | None = None,
    cpu: bool = True,
    ds_source: str = "<deepspeed config>",
) -> dict:
    """Return a copy of ``ds`` with every ``"auto"`` filled and checked against ``config``."""
    ds = copy.deepcopy(ds)
    cfg_source = config.source or "<train config>"
    fill = _Filler(ds, ds_source, cfg_source).fill
    t = config.training
    gas = config.grad_accumulation(world_size)

    fill("train_micro_batch_size_per_gpu", t.micro_batch_size, "training.micro_batch_size")
    fill(
        "gradient_accumulation_steps",
        gas,
        f"training.global_batch_size/(training.micro_batch_size x {world_size} ranks)",
    )
    fill("train_batch_size", t.global_batch_size, "training.global_batch_size")
    fill("gradient_clipping", t.clip_grad, "training.clip_grad")

    shown = f"training.precision={t.precision!r}"
    fill("bf16.enabled", t.precision == "bf16", "training.precision", shown=shown)
    fp16 = t.precision == "fp16"
    if fp16 or "fp16" in ds:
        fill("fp16.enabled", fp16, "training.precision", shown=shown)
    if fp16:  # DeepSpeed's loss scaler, from the train config's fp16 section
        scaling = config.fp16
        fill("fp16.loss_scale", scaling.loss_scale, "fp16.loss_scale")
        fill("fp16.initial_scale_power", scaling.initial_scale_power, "fp16.initial_scale_power")
        fill("fp16.loss_scale_window", scaling.loss_scale_window, "fp16.loss_scale_window")
        fill("fp16.hysteresis", scaling.hysteresis, "fp16.hysteresis")
        fill("fp16.consecutive_hysteresis", scaling.consecutive_hysteresis, "fp16.consecutive_hysteresis")
        fill("fp16.min_loss_scale", scaling.min_loss_scale, "fp16.min_loss_scale")

    opt = config.optimizer
    if "optimizer" in ds and opt.name != "adamw":
        raise InputError(
            f"{ds_source}[optimizer]: optimizer.name={opt.name!r} in {cfg_source} is built by llm-train; "
            "remove the optimizer section from the DeepSpeed config"
        )
    if "optimizer" in ds:
        section = ds["optimizer"]
        kind = str(section.get("type", AUTO))
        if kind == AUTO:
            section["type"] = "AdamW"
        elif kind.lower() not in ("adam", "adamw"):
            raise InputError(
                f"{ds_source}[optimizer.type]={kind!r} contradicts optimizer.name={opt.name!r} in {cfg_source}"
            )
        fill("optimizer.params.lr", opt.lr, "optimizer.lr")
        fill("optimizer.params.betas", list(opt.betas), "optimizer.betas")
        fill("optimizer.params.eps", opt.eps, "optimizer.eps")
        fill("optimizer.params.weight_decay", opt.weight_decay, "optimizer.weight_decay")
        if kind.lower() == "adam":
            fill("optimizer.params.adam_w_mode", True, "optimizer.name (adamw = decoupled decay)")
        if cpu:
            prefer_torch_adam(ds)

    sched = config.schedule
    if "scheduler" in ds:
        section = ds["scheduler"]
        kind = section.get("type", AUTO)
        if kind == AUTO:
            kind = section["type"] = {v: k for k, v in DS_SCHEDULERS.items()}.get(sched.kind, AUTO)
            if kind == AUTO:
                raise InputError(
                    f"{ds_source}[scheduler.type]: no DeepSpeed scheduler matches schedule.kind={sched.kind!r} "
                    f"in {cfg_source}; remove the scheduler section to use llmtools' schedule"
                )
        if DS_SCHEDULERS.get(kind) != sched.kind:
            raise InputError(
                f"{ds_source}[scheduler.type]={kind!r} contradicts schedule.kind={sched.kind!r} in {cfg_source}"
            )
        fill("scheduler.params.warmup_num_steps", sched.warmup_steps, "schedule.warmup_steps")
        fill("scheduler.params.warmup_type", "linear", "schedule (linear warmup)")
        if kind == "WarmupCosineLR":
            fill("scheduler.params.total_num_steps", total_steps, "schedule.total_steps")
            fill("scheduler.params.warmup_min_ratio", 0.0, "schedule (warmup from 0)")
            fill("scheduler.params.cos_min_ratio", sched.min_lr_ratio, "schedule.min_lr_ratio")
        else:
            fill("scheduler.params.warmup_min_lr", 0.0, "schedule (warmup from 0)")
            fill("scheduler.params.warmup_max_lr", opt.lr, "optimizer.lr")
            if kind == "WarmupDecayLR":
                if sched.min_lr_ratio != 0:
                    raise InputError(
                        f"{ds_source}[scheduler.type]=WarmupDecayLR decays to 0, which contradicts "
                        f"schedule.min_lr_ratio={sched.min_lr_ratio} in {cfg_source}"
                    )
                fill("scheduler.params.total_num_steps", total_steps, "schedule.total_steps")

    zero = ds.get("zero_optimization")
    if isinstance(zero, dict) and zero.get("contiguous_gradients") == AUTO:
        # On CUDA the contiguous buffer avoids allocator fragmentation; on CPU it is only an extra copy of
        # every gradient (measured: ~5-10% of a tiny model's step at ZeRO-1/2, benchmarks/bench_train.py).
        zero["contiguous_gradients"] = not cpu
    if isinstance(zero, dict) and hidden_size:
        for key, value in (
            ("reduce_bucket_size", hidden_size * hidden_size),
            ("stage3_prefetch_bucket_size", int(0.9 * hidden_size * hidden_size)),
            ("stage3_param_persistence_threshold", 10 * hidden_size),
        ):
            if zero.get(key) == AUTO:
                zero[key] = value

    leftover = list(_find_auto(ds))
    if leftover:
        raise InputError(f'{ds_source}[{leftover[0]}]: "auto" that llm-train does not know how to fill')

    micro, accum, total = (
        ds["train_micro_batch_size_per_gpu"],
        ds["gradient_accumulation_steps"],
        ds["train_batch_size"],
    )
    replicas = config.data_parallel(world_size)  # a sequence-parallel group reads one batch
    if micro * accum * replicas != total:
        raise InputError(
            f"{ds_source}: train_batch_size={total} != train_micro_batch_size_per_gpu={micro} x "
            f"gradient_accumulation_steps={accum} x data-parallel size {replicas}"
        )
    check_with_deepspeed(ds, ds_source)
    return ds


class _Recorder(dict):
    """A config dict that remembers which top-level keys were looked up (shared by its copies)."""

    seen: set

    def _note(self, key):
        self.seen.add(key)
        return key

    def __getitem__(self, key):
        return super().__getitem__(self._note(key))

    def __contains__(self, key):
        return super().__contains__(self._note(key))

    def get(self, key, default=None):
        return super().get(self._note(key), default)

    def pop(self, key, *default):
        return super().pop(self._note(key), *default)

    def setdefault(self, key, default=None):
        return super().setdefault(self._note(key), default)

    def keys(self):
        return KeysView(self)


def check_with_deepspeed(ds: dict, ds_source: str) -> None:
    """What the installed DeepSpeed makes of ``ds``, before any compute.

    DeepSpeed ignores a top-level key it does not read (``trian_batch_size`` passes silently), and checks
    the values of its sections (``zero_optimization.stage: 7``) only when the engine starts. Here its own
    ``DeepSpeedConfig`` parses the config once, recording the keys it looks up: a key it never reads, or a
    value it refuses, is an InputError naming it. Keys starting with ``_`` are comments.
    """
    try:
        deepspeed = import_deepspeed()
        from deepspeed.runtime.config import DeepSpeedConfig
    except ImportError:  # nothing to check against (llm-train itself needs DeepSpeed to run)
        return
    import logging

    # train_batch_size (checked above against the world size) is left out: DeepSpeed derives it from the
    # other two with the world size it finds now, 1 or the launcher's WORLD_SIZE, before any process group.
    skip = ("train_batch_size",)
    probe = _Recorder(
        copy.deepcopy({k: v for k, v in ds.items() if not str(k).startswith("_") and k not in skip})
    )
    probe.seen = set()
    version = getattr(deepspeed, "__version__", "?")
    logger = logging.getLogger("DeepSpeed")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        DeepSpeedConfig(probe)
    except Exception as error:  # noqa: BLE001 - pydantic, ValueError, AssertionError, DeepSpeedConfigError
        raise InputError(f"{ds_source}{_deepspeed_complaint(error, version)}") from None
    finally:
        logger.setLevel(level)
    unknown = [key for key in probe if key not in probe.seen]
    if unknown:
        raise InputError(
            f"{ds_source}[{unknown[0]}]: not a key DeepSpeed {version} reads (it would be ignored)"
            + suggest(str(unknown[0]), sorted(probe.seen))
        )


def _deepspeed_complaint(error: Exception, version: str) -> str:
    errors = getattr(error, "errors", None)
    if callable(errors):  # a pydantic ValidationError: name the field
        try:
            first = errors()[0]
            title = getattr(error, "title", "")
            section = {"DeepSpeedZeroConfig": "zero_optimization"}.get(title, title)
            loc = ".".join(str(part) for part in (section, *first.get("loc", ())) if part)
            value = first.get("input")
            shown = f" (got {json.dumps(value)})" if isinstance(value, (int, float, str, bool)) else ""
            return f"[{loc}]: DeepSpeed {version} refuses it: {first.get('msg')}{shown}"
        except Exception:  # noqa: BLE001 - fall back to the plain message
            pass
    text = " ".join(str(error).split()) or type(error).__name__
    return f": DeepSpeed {version} refuses this config: {text}"


def prefer_torch_adam(ds: dict) -> None:
    """On CPU, a DeepSpeed-config Adam(W) without ``torch_adam`` compiles a C++ op (~150 s); torch's is the
    same maths, so use it unless the config says otherwise."""
    section = ds.get("optimizer")
    if isinstance(section, dict) and str(section.get("type", "")).lower() in ("adam", "adamw"):
        section.setdefault("params", {}).setdefault("torch_adam", True)


def _find_auto(node: Any, prefix: str = ""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _find_auto(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _find_auto(value, f"{prefix}[{i}]")
    elif node == AUTO:
        yield prefix


def zero_stage(ds: dict) -> int:
    zero = ds.get("zero_optimization") or {}
    return int(zero.get("stage", 0)) if isinstance(zero, dict) else 0
