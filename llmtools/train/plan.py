"""Everything that can be checked before compute starts: model shape, data, lengths, DeepSpeed config.

``make_plan`` turns a TrainConfig and a DeepSpeed config into a :class:`TrainPlan` or raises an
InputError naming the file and key: an unknown model field, a tokenizer whose vocabulary does not fit
the model, a sequence longer than the model's positions, data that ends before the requested steps,
a DeepSpeed value that contradicts the train config. No torch here; the datasets are numpy memmaps.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any

from llmtools.errors import InputError
from llmtools.train.config import TrainConfig
from llmtools.train.deepspeed_config import resolve_ds_config, zero_stage
from llmtools.train.tasks import Task, TaskData, make_task


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
    def tokens_per_step(self) -> int:
        return self.config.training.global_batch_size * self.seq_length


def resolve_model_config(config: TrainConfig):
    """The ModelConfig: preset (or the init_from folder's config.json) with inline overrides applied."""
    from llmtools.model import ModelConfig, load_model_config

    section = config.model
    where = config.source or "<train config>"
    fields = [f.name for f in dataclasses.fields(ModelConfig)]
    for key in section.overrides:
        if key not in fields:
            close = difflib.get_close_matches(key, fields + ["preset", "init_from"], n=1, cutoff=0.6)
            hint = f" (did you mean 'model.{close[0]}'?)" if close else ""
            raise InputError(f"{where}: unknown key model.{key}{hint}")
    init_base = None
    if section.init_from is not None:
        from llmtools.ckpt.init_from import init_model_source  # an HF folder, or one of our checkpoints

        # Read even when a preset names the shape: a missing or broken folder fails here, before compute.
        init_base = load_model_config(init_model_source(section.init_from)).to_dict()
    if section.preset is not None:
        base = load_model_config(section.preset).to_dict()
    elif init_base is not None:
        base = init_base
    else:
        base = {}
    merged = {**base, **section.overrides}
    if not merged:
        raise InputError(f"{where}: model: give model.preset, model.init_from, or the model fields inline")
    try:
        return load_model_config(merged)
    except InputError as error:
        raise InputError(f"{where}: model: {error}") from None


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
    train = task.open_data("train", lambda seq_length: config.steps(seq_length) * t.global_batch_size)
    seq_length = train.seq_length
    steps = config.steps(seq_length)
    total_steps = config.total_steps(seq_length)
    if steps > total_steps:
        raise InputError(
            f"{where}: the run has {steps} steps but schedule.total_steps={total_steps}: "
            "raise schedule.total_steps (the LR curve would end before the data does)"
        )

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
        warnings.append("the data has no sidecar: its tokenizer's vocabulary size is unknown, not checked")
    if seq_length > model_config.max_position_embeddings:
        raise InputError(
            f"{where}: seq_length {seq_length} is longer than model.max_position_embeddings="
            f"{model_config.max_position_embeddings}"
        )

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

    ds_config = resolve_ds_config(
        ds_raw,
        config,
        world_size=world_size,
        total_steps=total_steps,
        hidden_size=model_config.hidden_size,
        cpu=cpu,
        ds_source=ds_source,
    )
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
    )


def check_data_length(config: TrainConfig, train: TaskData, steps: int) -> None:
    """InputError when the train data ends before ``steps`` global batches (one line, naming both)."""
    t = config.training
    needed = steps * t.global_batch_size
    available = len(train)
    if available >= needed:
        return
    source = config.data.mix or ", ".join(config.data.prefixes)
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


def _round_vocab(vocab: int, multiple: int = 64) -> int:
    # Megatron pads the vocabulary to a multiple of 128 x TP; 64 keeps matmuls aligned without much waste.
    return -(-vocab // multiple) * multiple
