"""Everything that can be checked before compute starts: model shape, data, lengths, DeepSpeed config.

``make_plan`` turns a TrainConfig and a DeepSpeed config into a :class:`TrainPlan` or raises an
InputError naming the file and key: an unknown model field, a tokenizer whose vocabulary does not fit
the model, a sequence longer than the model's positions, data that ends before the requested steps,
a DeepSpeed value that contradicts the train config. No torch here; the datasets are numpy memmaps.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from llmtools.ckpt.init_from import init_model_source  # an HF folder, or one of our checkpoints
from llmtools.errors import InputError, LlmtoolsError
from llmtools.model import ModelConfig, load_model_config
from llmtools.model.config import shape_mismatch
from llmtools.tokenize.loader import load_tokenizer
from llmtools.tokenize.token_bytes import byte_lengths_for
from llmtools.train.config import TrainConfig, check_run_length
from llmtools.train.deepspeed_config import resolve_ds_config, zero_stage
from llmtools.train.downstream import load_tasks
from llmtools.train.moe import check_expert_parallel, expert_parallel_ds_config
from llmtools.train.optimizers import check_optimizer
from llmtools.train.sequence import check_sequence_parallel, zero3_reduction
from llmtools.train.tasks import Task, TaskData, make_task
from llmtools.train.tensor import check_tensor_parallel, plan_tensor_parallel


@dataclass
class TrainPlan:
    config: TrainConfig
    task: Task
    model_config: Any  # llmtools.model.ModelConfig
    train_data: TaskData
    valid_data: TaskData | None  # None when the task or the data has no valid split, or eval is off
    ds_config: dict
    world_size: int
    steps: int
    total_steps: int
    grad_accumulation: int
    warnings: list[str]
    eval_byte_lengths: Any = None
    """UTF-8 bytes per token id of the valid data's tokenizer (numpy), for bits per byte; None: unknown."""
    eval_tasks: list = field(default_factory=list)
    """The downstream tasks of ``eval.tasks``, read and tokenized (:mod:`llmtools.train.downstream`)."""
    data_resume: tuple | None = None
    """(checkpoint path, DataResume): the train data a resume from that checkpoint continues with,
    decided before any compute (a run that loads another checkpoint decides again)."""

    @property
    def seq_length(self) -> int:
        """The data's: read from the training data, never from the config."""
        return self.train_data.seq_length

    @property
    def tokenizer(self) -> dict | None:
        return self.train_data.tokenizer

    @property
    def zero_stage(self) -> int:
        return zero_stage(self.ds_config)

    @property
    def tokens_per_sample(self) -> int:
        """Tokens the model runs per sample: ``seq_length`` per sequence (a preference pair has two)."""
        return self.seq_length * self.task.sequences_per_sample

    @property
    def tokens_per_step(self) -> int:
        return self.config.training.global_batch_size * self.tokens_per_sample


def resolve_model_config(config: TrainConfig):
    """The ModelConfig: preset (or the init_from folder's config.json) with inline overrides applied."""
    section = config.model
    where = config.source or "<train config>"
    fields = [f.name for f in dataclasses.fields(ModelConfig)]
    for key in section.overrides:
        if key not in fields:
            close = difflib.get_close_matches(key, fields + ["preset", "init_from"], n=1, cutoff=0.6)
            hint = f" (did you mean 'model.{close[0]}'?)" if close else ""
            raise InputError(f"{where}: unknown key model.{key}{hint}")
    init_base = init_config = None
    if section.init_from is not None:
        # Read even when a preset names the shape: a missing or broken folder fails here, before compute.
        init_config = load_model_config(init_model_source(section.init_from), names=False)
        init_base = init_config.to_dict()
    if section.preset is not None:
        try:
            base = load_model_config(section.preset).to_dict()
        except InputError as error:
            raise InputError(f"{where}: model.preset: {str(error).removeprefix('model: ')}") from None
    elif init_base is not None:
        base = init_base
    else:
        base = {}
    merged = {**base, **section.overrides}
    if not merged:
        raise InputError(f"{where}: model: give model.preset, model.init_from, or the model fields inline")
    try:
        model_config = load_model_config(merged)
    except InputError as error:  # its message names the field: model.FIELD: ...
        raise InputError(f"{where}: {error}") from None
    if init_config is not None:  # the weights must fit the shape (a MoE preset with a dense folder, ...)
        mismatch = shape_mismatch(model_config, init_config)
        if mismatch:
            name, ours, theirs = mismatch
            folder = os.path.join(section.init_from, "config.json")
            source = folder if os.path.isfile(folder) else f"model.init_from {section.init_from}"
            fix = (
                f"remove model.preset (the folder's shape is then used) or set model.{name}: {theirs!r}"
                if section.preset is not None
                else f"set model.{name}: {theirs!r} or remove it"
            )
            raise InputError(f"{source}[{name}]: {theirs!r} but the model config has {ours!r}; {fix}")
    return model_config


def _check_unvouched_ids(train, vocab_size: int) -> None:
    """Data without a sidecar names no tokenizer, so nothing vouches for its ids: one pass over each
    source's tokens (numpy's max, in C) before the first step, instead of an IndexError in the embedding."""
    data = train
    while getattr(data, "parts", None) is None and getattr(data, "dataset", None) is not None:
        data = data.dataset  # the run's data (ledger) around the blended dataset
    seen = set()
    for part in getattr(data, "parts", None) or []:
        tokens, reader = getattr(part, "tokens", None), getattr(part, "reader", None)
        if tokens is None or reader is None or reader.prefix in seen or not tokens.size:
            continue
        seen.add(reader.prefix)
        top = int(tokens.max())
        if top >= vocab_size or (tokens.dtype.kind == "i" and int(tokens.min()) < 0):
            bad = top if top >= vocab_size else int(tokens.min())
            position = int(np.argmax(tokens == bad))
            raise InputError(
                f"{reader.bin_file}: token id {bad} (token {position}) is outside the model's vocab_size "
                f"{vocab_size}; the data has no sidecar naming its tokenizer, and its ids do not fit this model"
            )


def make_plan(
    config: TrainConfig,
    ds_raw: dict,
    *,
    world_size: int = 1,
    cpu: bool = True,
    ds_source: str = "<deepspeed config>",
    consumed_samples: int = 0,
    open_valid: bool = True,
    check_length: bool = True,
) -> TrainPlan:
    """Check everything and open the data; raise before any compute. ``check_length=False`` leaves the
    data's length to be checked once a resumed run knows where its data continues
    (:func:`check_data_length`)."""
    where = config.source or "<train config>"
    warnings: list[str] = []
    model_config = resolve_model_config(config)
    t = config.training
    gas = config.grad_accumulation(world_size)

    # The data: a mix fixes seq_length and the number of samples; otherwise the task opens what the run
    # needs, which depends on seq_length when the run is given in tokens.
    task = make_task(config)
    per_sample = task.sequences_per_sample  # training.train_tokens counts every sequence the model runs
    train = task.open_data(
        "train", lambda seq_length: config.steps(seq_length * per_sample) * t.global_batch_size
    )
    seq_length = train.seq_length
    steps = config.steps(seq_length * per_sample)
    total_steps = config.total_steps(seq_length * per_sample)
    check_run_length(config, steps, where, seq_length * per_sample)

    if check_length:
        check_data_length(config, train, steps)

    # The tokenizer must fit the model's embedding.
    tokenizer, vocab = train.tokenizer, train.vocab_size
    if vocab is not None and vocab > model_config.vocab_size:
        name = (tokenizer or {}).get("name") or (tokenizer or {}).get("source") or "the data's tokenizer"
        raise InputError(
            f"{config.data.mix or config.data.prefixes[0]}: tokenizer {name!r} has {vocab} ids but the model's "
            f"vocab_size is {model_config.vocab_size} (model.preset={config.model.preset!r}): "
            f"--set model.vocab_size={_round_vocab(vocab)}"
        )
    if vocab is None:
        _check_unvouched_ids(train, model_config.vocab_size)
    if seq_length > model_config.max_position_embeddings:
        raise InputError(
            f"{where}: seq_length {seq_length} is longer than model.max_position_embeddings="
            f"{model_config.max_position_embeddings}"
        )

    check_sequence_parallel(config, model_config, world_size, seq_length, where)
    check_tensor_parallel(config, model_config, world_size, where)

    valid = None
    if config.eval.every > 0 and not task.evaluates:
        warnings.append(f"task {config.task} has no valid split yet; eval.every ignored")
    elif open_valid and config.eval.every > 0:
        try:
            valid = task.open_data("valid", lambda _: config.eval.iters * t.micro_batch_size * world_size)
        except (InputError, ValueError, KeyError) as error:
            warnings.append(f"no valid split to evaluate on ({error}); eval.every ignored")
            valid = None
        if valid is not None and len(valid) == 0:
            warnings.append("the valid split is empty; eval.every ignored")
            valid = None
    check_per_source(config, task, valid, where)
    eval_byte_lengths = None
    if valid is not None:
        eval_byte_lengths, why = byte_lengths_for(valid.tokenizer)
        if why is not None:
            warnings.append(f"eval: no bits per byte: {why}")

    eval_tasks = _load_eval_tasks(config, train, model_config, warnings)
    if eval_tasks and valid is None:
        warnings.append(
            "eval.tasks are scored with the valid split's evaluation, and there is none: not evaluated"
        )

    ds_config = resolve_ds_config(
        _with_expert_parallel_defaults(ds_raw, config),
        config,
        world_size=world_size,
        total_steps=total_steps,
        hidden_size=model_config.hidden_size,
        cpu=cpu,
        ds_source=ds_source,
    )
    _plan_expert_parallel(config, model_config, ds_config, world_size, ds_source)
    if config.parallel.sequence > 1:
        zero3_reduction(ds_config, ds_source)
    plan_tensor_parallel(config, ds_config, ds_source)
    _plan_precision_and_optimizer(config, ds_config, ds_source)
    _plan_compile(config, ds_config, ds_source)
    return TrainPlan(
        config=config,
        task=task,
        model_config=model_config,
        train_data=train,
        valid_data=valid,
        ds_config=ds_config,
        world_size=world_size,
        steps=steps,
        total_steps=total_steps,
        grad_accumulation=gas,
        warnings=warnings,
        eval_byte_lengths=eval_byte_lengths,
        eval_tasks=eval_tasks,
    )


def check_per_source(config: TrainConfig, task: Task, valid, where: str) -> None:
    """``eval.per_source`` is honoured or refused, never silently dropped: each source of the valid split
    (its own blend when the mix has one) is scored; a task whose samples are no source's text, or a valid
    split that does not record which source each sample came from, is refused in one line."""
    if not config.eval.per_source:
        return
    if not task.per_source:
        raise InputError(
            f"{where}: eval.per_source: task {task.name}'s samples are not a source's text "
            "(pretraining only); set eval.per_source: false"
        )
    from llmtools.train.evaluate import source_names  # it imports this module (TrainPlan)

    if valid is not None and source_names(valid) is None:
        raise InputError(
            f"{where}: eval.per_source: the valid split is not a blend of sources (nothing records which "
            "source each sample came from); set eval.per_source: false"
        )


def _load_eval_tasks(config: TrainConfig, train, model_config, warnings: list[str]) -> list:
    """``eval.tasks`` read and tokenized with the data's tokenizer (before any compute)."""
    if not config.eval.tasks:
        return []
    if not config.eval.every:
        warnings.append("eval.tasks are evaluated every eval.every steps, which is 0: not evaluated")
        return []
    identity = train.tokenizer or {}
    source = identity.get("source")
    if not source:
        raise InputError("eval.tasks: the data records no tokenizer to tokenize the tasks with")
    try:
        tokenizer = load_tokenizer(str(source), backend="tokenizers")
    except LlmtoolsError as error:
        raise InputError(f"eval.tasks: the data's tokenizer could not be loaded: {error}") from None
    if identity.get("hash") and tokenizer.hash != identity["hash"]:
        raise InputError(f"eval.tasks: the tokenizer at {source} is not the one the data was made with")
    base = Path(config.source).parent if config.source else None
    return load_tasks(config.eval.tasks, tokenizer, base, model_config.max_position_embeddings - 1)


def check_data_length(config: TrainConfig, train: TaskData, steps: int, done: int | None = None) -> None:
    """InputError when the train data ends before ``steps`` global batches (one line, naming both).

    ``done``: the steps a --reset-data resume has trained already; the data, read from its first sample
    again, must hold only the steps left."""
    t = config.training
    source = config.data.mix or ", ".join(config.data.prefixes)
    available = len(train)
    if done is not None:
        needed = max(steps - done, 0) * t.global_batch_size
        if available >= needed:
            return
        longer = f"a mix of {needed} samples or more (llm-mix --num-samples {needed})"
        fits = available // t.global_batch_size
        fewer = f"--set training.train_steps={done + fits}, or " if fits else ""
        raise InputError(
            f"{source}: --reset-data: the data holds {available} samples, but the {steps - done} steps left "
            f"(step {done} to training.train_steps={steps}) need {needed}; {fewer}{longer}"
        )
    needed = steps * t.global_batch_size
    if available >= needed:
        return
    seq_length = train.seq_length
    plan = getattr(train, "plan", None)  # a data ledger's plan (pretraining), else none
    resumed_at = getattr(train, "plan_base", 0)
    if resumed_at:
        raise InputError(
            f"{source}: taken up at sample {resumed_at} (step {resumed_at // t.global_batch_size}), its data ends "
            f"at sample {available}, before training.train_steps={steps} (sample {needed}); make the mix "
            f"longer (llm-mix --num-samples {needed - resumed_at} or more)"
        )
    if plan is not None and getattr(plan, "staged", False):
        raise InputError(
            f"{source}: the stage schedule ends at sample {available} (step {available // t.global_batch_size}), "
            f"before training.train_steps={steps} (sample {needed}); end the last stage with 'end' in a mix "
            "of more samples (llm-mix --num-samples)"
        )
    raise InputError(
        f"{source}: the data ends before the requested steps: {available} training samples of "
        f"{seq_length} tokens, but {steps} steps x global batch {t.global_batch_size} = {needed} samples "
        f"are needed (fewer steps: --set training.train_steps={available // t.global_batch_size}, "
        "or a mix with more samples: llm-mix --num-samples)"
    )


def _with_expert_parallel_defaults(ds_raw: dict, config: TrainConfig) -> dict:
    """DeepSpeed's MoE support needs contiguous gradients at ZeRO-1/2 (our CPU default is off)."""
    zero = ds_raw.get("zero_optimization")
    if config.model.expert_parallel is None or not isinstance(zero, dict):
        return ds_raw
    if zero.get("contiguous_gradients", "auto") == "auto":
        return {**ds_raw, "zero_optimization": {**zero, "contiguous_gradients": True}}
    return ds_raw


def _plan_expert_parallel(
    config: TrainConfig, model_config, ds_config: dict, world_size: int, ds_source: str
):
    """Check ``model.expert_parallel`` against the model, the world and the DeepSpeed config, and turn on
    DeepSpeed's expert-parallel layer (with its AdamW, which splits the expert parameters into their own
    groups: a client optimizer cannot know them before DeepSpeed has built them)."""
    where = config.source or "<train config>"
    ep = config.model.expert_parallel
    if ep is None:
        if "expert_parallel" in ds_config:
            raise InputError(
                f"{ds_source}[expert_parallel]: set model.expert_parallel in the train config instead "
                "(llm-train fills this section from it)"
            )
        return
    check_expert_parallel(model_config, ep, world_size, where)
    stage = zero_stage(ds_config)
    if stage == 0:
        raise InputError(
            f"{where}: model.expert_parallel: needs ZeRO stage 1, 2 or 3 ({ds_source} has stage 0): DeepSpeed "
            "reduces and partitions expert parameters within their groups only in its ZeRO optimizers"
        )
    if config.lora is not None:
        raise InputError(f"{where}: model.expert_parallel: not with lora (adapters train no expert)")
    if config.optimizer.name != "adamw":
        raise InputError(
            f"{where}: model.expert_parallel: needs optimizer.name adamw, got {config.optimizer.name!r}"
        )
    if "expert_parallel" in ds_config:
        raise InputError(f"{ds_source}[expert_parallel]: remove it; model.expert_parallel={ep} fills it")
    zero = ds_config.get("zero_optimization") or {}
    if stage in (1, 2) and zero.get("contiguous_gradients") is False:
        raise InputError(
            f"{ds_source}[zero_optimization.contiguous_gradients]: false, but DeepSpeed's MoE support at "
            f'ZeRO-{stage} needs true (or "auto")'
        )
    ds_config["expert_parallel"] = expert_parallel_ds_config(model_config, ep)
    if "optimizer" not in ds_config:
        opt = config.optimizer
        ds_config["optimizer"] = {
            "type": "AdamW",
            "params": {
                "lr": opt.lr,
                "betas": list(opt.betas),
                "eps": opt.eps,
                "weight_decay": opt.weight_decay,
                "torch_adam": True,
            },
        }


def _plan_precision_and_optimizer(config: TrainConfig, ds_config: dict, ds_source: str) -> None:
    """What the precision and the optimizer cannot do with this ZeRO stage, named before compute."""
    where = config.source or "<train config>"
    stage = zero_stage(ds_config)
    if config.training.precision == "fp16" and stage == 0:
        raise InputError(
            f"{where}: training.precision=fp16: needs ZeRO stage 1, 2 or 3 ({ds_source} has stage 0): at "
            "stage 0 DeepSpeed's fp16 wrapper of our optimizer takes a first step with zero gradients "
            "(AdamW's step count and weight decay then run one step ahead)"
        )
    check_optimizer(config, ds_config, stage, where, ds_source)


def _plan_compile(config: TrainConfig, ds_config: dict, ds_source: str) -> None:
    """training.compile: what cannot be compiled, refused before compute (one line)."""
    if not config.training.compile:
        return
    where = config.source or "<train config>"
    cc = os.environ.get("CC") or "cc"
    if not (shutil.which(cc) or shutil.which("gcc") or shutil.which("clang")):
        raise InputError(
            f"{where}: training.compile: no C compiler ({cc}, gcc or clang) on PATH; torch.compile builds its "
            "kernels with one (install gcc, or set training.compile false)"
        )
    if config.model.expert_parallel is not None:
        raise InputError(
            f"{where}: training.compile: not with model.expert_parallel (DeepSpeed's expert-parallel layer "
            "exchanges tokens between ranks inside the layer, which the compiled layer would have to trace)"
        )
    if zero_stage(ds_config) == 3:
        raise InputError(
            f"{where}: training.compile: not with ZeRO stage 3 ({ds_source}): its hooks gather each layer's "
            "parameters inside the layer call, which the compiled layer would have to trace"
        )


def _round_vocab(vocab: int, multiple: int = 64) -> int:
    # Megatron pads the vocabulary to a multiple of 128 x TP; 64 keeps matmuls aligned without much waste.
    return -(-vocab // multiple) * multiple
