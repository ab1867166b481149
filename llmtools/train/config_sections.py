"""The sections of the train config (``model:``, ``data:``, ``training:`` ...): dataclasses that check
themselves and declare, field by field, what a resumed run may change (:mod:`llmtools.train.resume_rules`).

:mod:`llmtools.train.config` assembles them into a :class:`~llmtools.train.config.TrainConfig` and reads it
from YAML. Nothing here imports torch.
"""

from __future__ import annotations

import difflib
import math
from typing import Any, Literal

from llmtools.errors import InputError
from llmtools.formats.mix import MIN_SEQ_LENGTH
from llmtools.logs.trackers import tracking_uri_problem
from llmtools.train.optimizers import OPTIMIZERS
from llmtools.train.resume_rules import (
    APPLY,
    DATA_POSITION,
    DERIVED,
    EACH_KEY,
    FROM_NEXT_STEP,
    NEVER,
    NEW_RUN,
    OTHER_RUN,
    RESET_DATA,
    WEIGHTS_FROM_CHECKPOINT,
    Rule,
    config_section,
    ruled,
)

PRECISIONS = ("fp32", "bf16", "fp16")
SCHEDULES = ("cosine", "linear", "constant", "wsd", "inverse_sqrt")
WSD_DECAYS = ("linear", "cosine", "1-sqrt")
MUON_LR_ADJUSTMENTS = ("match_rms_adamw", "original")
HEALTH_ACTIONS = ("skip", "stop")
SPIKE_ACTIONS = ("skip", "stop", "warn")
UPDATE_SPIKE_ACTIONS = ("warn", "stop")
REPORTERS = ("tensorboard", "wandb", "mlflow")

# Resume rules several sections' fields share (each field still names its own).
# Only an fp16 run reads its section (the resume view leaves it out otherwise), and DeepSpeed restores its
# loss scaler, settings and current scale, from the checkpoint: a new value would be ignored.
LOSS_SCALER = Rule(
    NEVER, "DeepSpeed restores its loss scaler, settings included, from the checkpoint", NEW_RUN
)
NEW_CURVE = Rule(APPLY, "the learning rate follows the new curve from this step on")
THIS_RUNS_GROUPS = Rule(APPLY, "the process groups of this run use it")
# The model's inline fields (ModelConfig's) a resumed run may change; any other is another model.
MODEL_FIELDS_THAT_MAY_CHANGE = {
    "initializer_range": WEIGHTS_FROM_CHECKPOINT,
    "router_aux_loss_coef": Rule(APPLY, "the router's auxiliary loss weighs this from the next step on"),
    "router_z_loss_coef": Rule(APPLY, "the router's z-loss weighs this from the next step on"),
    # no parameter depends on it: what a capacity collapse's stop advises
    "moe_capacity_factor": Rule(APPLY, "the experts take this many tokens from the next step on"),
}


def _bad(key: str, message: str) -> InputError:
    return InputError(f"{key}: {message}")


def did_you_mean(word: str, choices) -> str:
    """`` (did you mean 'X'?)`` for the closest of ``choices`` by spelling, or nothing."""
    close = difflib.get_close_matches(word, [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


@config_section
class ModelSection:
    """Which model: a preset (a shipped one by name, or a file) with inline overrides, or all inline."""

    preset: str | None = ruled(Rule(DERIVED, "a name; the model's fields are compared one by one"), None)
    """A shipped preset by name (tiny, 125m, 1b, llama3-8b, ...) or a path (it has a '/' or ends in
    .yaml/.yml/.json: ./tiny.yaml, a Hugging Face folder as hf/); null: the init_from folder's config.json, or
    the shape all inline."""
    init_from: str | None = ruled(WEIGHTS_FROM_CHECKPOINT, None)
    """A Hugging Face folder (config.json + safetensors) whose weights start the run (continued pretraining)."""
    expert_parallel: int | None = ruled(
        Rule(APPLY, "DeepSpeed's universal conversion re-spreads the experts over the new groups"), None
    )
    """MoE models: spread each layer's experts over groups of N data-parallel ranks (DeepSpeed's
    expert-parallel layer); N divides the world size and num_experts. null: every rank holds every expert."""
    overrides: dict[str, Any] = ruled(
        Rule(NEVER, "a different model cannot continue this checkpoint", OTHER_RUN),
        default_factory=dict,
        metadata={EACH_KEY: MODEL_FIELDS_THAT_MAY_CHANGE},
    )
    """Inline ModelConfig fields (hidden_size, num_hidden_layers, ...); they override the preset's."""


@config_section
class DataSection:
    """Where the tokens come from: a mix.json from llm-mix, or prefixes with weights."""

    mix: str | None = ruled(DATA_POSITION, None)
    """A mix.json written by llm-mix (its seq_length and number of samples are used)."""
    prefixes: list[str] = ruled(DATA_POSITION, default_factory=list)
    """Indexed-dataset prefixes (PREFIX.bin/.idx), when no mix is given."""
    weights: list[float] | None = ruled(DATA_POSITION, None)
    """Sampling weights, one per prefix (default: equal)."""
    seq_length: int | None = ruled(DATA_POSITION, None)
    """Tokens per sample (required with prefixes; must match the mix when both are given)."""
    split: str = ruled(DATA_POSITION, "969,30,1")
    """train,valid,test document split, Megatron style (prefixes only; a mix carries its own)."""
    seed: int = ruled(DATA_POSITION, 1234)
    """Seed of the sample order (prefixes only; a mix carries its own)."""
    cache_dir: str | None = ruled(Rule(APPLY, "only where the sample-index cache is kept"), None)
    """Where the sample-index cache goes (prefixes only); default beside the data."""
    reset_position_ids: bool = ruled(
        Rule(APPLY, "positions of the next samples; the data position is unchanged"), False
    )
    """Megatron's flag: position ids restart at 0 after every EOD token of a sample (pretraining)."""
    reset_attention_mask: bool = ruled(
        Rule(APPLY, "attention of the next samples; the data position is unchanged"), False
    )
    """Megatron's flag: attention stays inside each document of a sample, the EOD closing its document
    (pretraining; document attention kernels, never a dense mask)."""
    eod_mask_loss: bool = ruled(
        Rule(APPLY, "loss of the next samples; the data position is unchanged"), False
    )
    """Megatron's flag: no loss where the input token is EOD (pretraining)."""

    @property
    def document_masking(self) -> bool:
        return self.reset_position_ids or self.reset_attention_mask or self.eod_mask_loss

    def __post_init__(self) -> None:
        if self.mix is None and not self.prefixes:
            raise _bad("data", "give data.mix (a mix.json) or data.prefixes (with data.seq_length)")
        if self.mix is not None and self.prefixes:
            raise _bad("data", "give data.mix or data.prefixes, not both")
        if self.prefixes and self.seq_length is None:
            raise _bad("data.seq_length", "required with data.prefixes")
        if self.weights is not None:
            if not self.prefixes:
                raise _bad("data.weights", "only with data.prefixes (a mix carries its own weights)")
            if len(self.weights) != len(self.prefixes):
                raise _bad("data.weights", f"{len(self.weights)} weights for {len(self.prefixes)} prefixes")
            if any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
                raise _bad("data.weights", "weights must be >= 0 with a positive sum")
        if self.seq_length is not None and self.seq_length < MIN_SEQ_LENGTH:
            raise _bad("data.seq_length", f"must be >= {MIN_SEQ_LENGTH}, got {self.seq_length}")


@config_section
class ParallelSection:
    """How each sequence and each weight is split over the ranks (data parallelism takes the rest)."""

    sequence: int = ruled(
        Rule(APPLY, "ZeRO partitions span every rank under any degree: the same world size loads as is"), 1
    )
    """DeepSpeed-Ulysses: each rank of a group of N holds 1/N of every sequence; attention heads are
    exchanged with all-to-all (N divides the world size, the attention heads and the sequence length)."""
    tensor: int = ruled(
        Rule(
            NEVER,
            "the checkpoint's weights and optimizer state are cut into that many shards",
            "convert it (llm-ckpt convert --to hf) and start a new run from it, -o NEW_RUN --init-from HF_FOLDER",
        ),
        1,
    )
    """DeepSpeed AutoTP: each rank of a group of N holds 1/N of every attention and MLP projection (N
    divides the world size and the attention and key/value heads); ZeRO-1/2, pretraining."""

    def __post_init__(self) -> None:
        for key in ("sequence", "tensor"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise _bad(f"parallel.{key}", f"expected an integer >= 1, got {value!r}")


@config_section
class TrainingSection:
    """Batch sizes, how long, precision, clipping."""

    micro_batch_size: int = ruled(Rule(APPLY, "same samples per step, another accumulation"), 4)
    """Samples per rank per forward/backward."""
    global_batch_size: int = ruled(
        Rule(NEVER, "the data position and the schedule are counted in batches of the old size", NEW_RUN), 8
    )
    """Samples per optimizer step over all ranks (= micro x accumulation x world size)."""
    train_steps: int | None = ruled(Rule(APPLY, "the run now ends at this step"), None)
    """Optimizer steps to run (give this or train_tokens)."""
    train_tokens: int | None = ruled(Rule(APPLY, "the run now ends after this many tokens"), None)
    """Tokens to train on; steps = ceil(tokens / (global_batch_size x seq_length))."""
    precision: Literal["fp32", "bf16", "fp16"] = ruled(
        Rule(NEVER, "the optimizer state was saved in the old precision's layout", NEW_RUN), "fp32"
    )
    """Parameter/compute precision: fp32, bf16 with fp32 master weights (DeepSpeed bf16), or fp16 with fp32
    master weights and loss scaling (DeepSpeed fp16, the fp16 section; for GPUs without bf16)."""
    clip_grad: float = ruled(Rule(APPLY, "set in the optimizer from the next step on"), 1.0)
    """Gradient clipping by global norm (0 disables)."""
    seed: int = ruled(Rule(RESET_DATA, "the RNG streams restart from the new seed"), 1234)
    """Seed of the model initialisation and of every RNG."""
    activation_checkpointing: bool = ruled(Rule(APPLY, "same results, other memory and speed"), False)
    """Recompute each decoder layer's activations in the backward pass: less memory, ~30% more compute."""
    # Same parameters and optimizer state either way; only the kernels change, whose sums may round
    # differently (within the compile-equality test's tolerance), so a switch is exact up to rounding.
    compile: bool = ruled(
        Rule(APPLY, "the same model in fused kernels from the next step on (rounding may differ)"), False
    )
    """torch.compile each decoder layer (dense and MoE): fused kernels, the same losses within rounding."""

    def __post_init__(self) -> None:
        for name in ("micro_batch_size", "global_batch_size"):
            if getattr(self, name) < 1:
                raise _bad(f"training.{name}", f"must be >= 1, got {getattr(self, name)}")
        if self.global_batch_size % self.micro_batch_size:
            raise _bad(
                "training.global_batch_size",
                f"{self.global_batch_size} is not a multiple of training.micro_batch_size={self.micro_batch_size}",
            )
        if (self.train_steps is None) == (self.train_tokens is None):
            raise _bad("training", "give exactly one of training.train_steps and training.train_tokens")
        if self.train_steps is not None and self.train_steps < 1:
            raise _bad("training.train_steps", f"must be >= 1, got {self.train_steps}")
        if self.train_tokens is not None and self.train_tokens < 1:
            raise _bad("training.train_tokens", f"must be >= 1, got {self.train_tokens}")
        if self.precision not in PRECISIONS:
            raise _bad("training.precision", f"{self.precision!r} is not one of {', '.join(PRECISIONS)}")
        if self.clip_grad < 0:
            raise _bad("training.clip_grad", f"must be >= 0, got {self.clip_grad}")


@config_section
class Fp16Section:
    """Loss scaling for training.precision fp16 (DeepSpeed's fp16 section is filled from it; unused otherwise).

    Dynamic scaling (loss_scale 0) starts at 2**initial_scale_power; a step whose gradients overflow is
    skipped and, once hysteresis overflows have been seen, the scale is halved; after loss_scale_window
    steps without an overflow it is doubled. A run whose scale has fallen to min_loss_scale and still
    overflows stops with a checkpoint of its last good state."""

    loss_scale: float = ruled(LOSS_SCALER, 0.0)
    """0: dynamic loss scaling; > 0: this fixed scale."""
    initial_scale_power: int = ruled(LOSS_SCALER, 16)
    """Dynamic scaling starts at 2**initial_scale_power."""
    loss_scale_window: int = ruled(LOSS_SCALER, 1000)
    """Double the scale after this many consecutive steps without an overflow."""
    hysteresis: int = ruled(LOSS_SCALER, 2)
    """Overflows tolerated (each still skips its step) before the scale is halved."""
    consecutive_hysteresis: bool = ruled(LOSS_SCALER, False)
    """Refill the hysteresis after every step without an overflow (not only when the scale changes)."""
    min_loss_scale: int = ruled(LOSS_SCALER, 1)
    """The smallest scale; overflowing again there stops the run."""

    def __post_init__(self) -> None:
        if not (self.loss_scale >= 0 and math.isfinite(self.loss_scale)):
            raise _bad("fp16.loss_scale", f"must be 0 (dynamic) or a positive number, got {self.loss_scale}")
        if not 0 <= self.initial_scale_power <= 63:
            raise _bad("fp16.initial_scale_power", f"must be in [0, 63], got {self.initial_scale_power}")
        if self.loss_scale_window < 1:
            raise _bad("fp16.loss_scale_window", f"must be >= 1, got {self.loss_scale_window}")
        if self.hysteresis < 1:
            raise _bad("fp16.hysteresis", f"must be >= 1, got {self.hysteresis}")
        if self.min_loss_scale < 1:
            raise _bad("fp16.min_loss_scale", f"must be >= 1, got {self.min_loss_scale}")
        if self.loss_scale == 0 and self.min_loss_scale > 2**self.initial_scale_power:
            raise _bad(
                "fp16.min_loss_scale",
                f"{self.min_loss_scale} is above the initial scale 2**{self.initial_scale_power}",
            )


MAX_LR = 1.0
"""No optimizer here trains at a learning rate above this (their usual ranges are far below)."""
# optimizer.name: one of the table's names (llmtools.train.optimizers), in its order
OptimizerName = Literal[tuple(OPTIMIZERS)]


@config_section
class OptimizerSection:
    """The optimizer; weight decay applies to matrices only (never to norms, biases, or 1-D parameters)."""

    name: OptimizerName = ruled(
        Rule(NEVER, "the optimizer state belongs to the old optimizer", NEW_RUN), "adamw"
    )
    """Optimizer: adamw; adafactor (torch.optim.Adafactor: factored second moments, no first moment; uses
    lr and weight_decay, not betas/eps); lion (sign of an interpolated momentum: lr typically 3-10x
    smaller and weight_decay 3-10x larger than AdamW's); muon (torch.optim.Muon's orthogonalized
    momentum on the hidden matrices, AdamW with lr, betas, eps on embeddings, head, norms and biases)."""
    lr: float = ruled(Rule(APPLY, "the schedule continues at this step with the new peak"), 3e-4)
    """Peak learning rate (after warmup)."""
    betas: list[float] | None = ruled(
        Rule(APPLY, "set in the optimizer from the next step on; its moments are kept"), None
    )
    """[beta1, beta2] of AdamW (and Muon's AdamW part), default [0.9, 0.95]; of Lion, default [0.9, 0.99]."""
    eps: float = ruled(Rule(APPLY, "set in the optimizer from the next step on"), 1e-8)
    """Adam epsilon."""
    weight_decay: float = ruled(Rule(APPLY, "set for the decayed parameters from the next step on"), 0.1)
    """Decoupled weight decay on matrices (embeddings and linear weights)."""
    momentum: float = ruled(Rule(APPLY, "Muon's momentum from the next step on; its buffers are kept"), 0.95)
    """Muon: momentum of the hidden matrices' updates."""
    nesterov: bool = ruled(Rule(APPLY, "Muon uses it from the next step on"), True)
    """Muon: Nesterov momentum."""
    ns_steps: int = ruled(
        Rule(APPLY, "Muon orthogonalizes with this many iterations from the next step on"), 5
    )
    """Muon: Newton-Schulz iterations that orthogonalize each update."""
    muon_lr: float | None = ruled(
        Rule(APPLY, "the schedule continues at this step with the new peak for the matrices"), None
    )
    """Muon: peak learning rate of the hidden matrices (null: optimizer.lr); the schedule scales it too."""
    muon_adjust_lr: Literal["match_rms_adamw", "original"] = ruled(
        Rule(APPLY, "Muon scales each matrix's step this way from the next step on"), "match_rms_adamw"
    )
    """Muon: per-matrix learning-rate scale. match_rms_adamw (Moonshot: 0.2 x sqrt(max(rows, cols)), so Muon
    takes AdamW's lr and weight decay) or original (Keller Jordan: sqrt(max(1, rows/cols)), lr ~0.02)."""

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise _bad("optimizer.name", f"{self.name!r} is not one of {', '.join(OPTIMIZERS)}")
        if self.betas is None:
            self.betas = list(OPTIMIZERS[self.name].default_betas)
        if not self.lr > 0:
            raise _bad("optimizer.lr", f"must be > 0, got {self.lr}")
        # Beyond it every update diverges; the divergence would be blamed on the data it met.
        if self.lr > MAX_LR:
            raise _bad(
                "optimizer.lr",
                f"{self.lr:g} is out of range: at most {MAX_LR:g} ({OPTIMIZERS[self.name].usual_lr})",
            )
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise _bad("optimizer.betas", f"must be two numbers in [0, 1), got {self.betas}")
        if not self.eps > 0:
            raise _bad("optimizer.eps", f"must be > 0, got {self.eps}")
        if self.weight_decay < 0:
            raise _bad("optimizer.weight_decay", f"must be >= 0, got {self.weight_decay}")
        if not 0 <= self.momentum < 1:
            raise _bad("optimizer.momentum", f"must be in [0, 1), got {self.momentum}")
        if not 1 <= self.ns_steps < 100:
            raise _bad("optimizer.ns_steps", f"must be in [1, 99], got {self.ns_steps}")
        if self.muon_lr is not None and not 0 < self.muon_lr <= MAX_LR:
            raise _bad(
                "optimizer.muon_lr", f"must be in (0, {MAX_LR:g}], got {self.muon_lr:g} (usually ~0.02)"
            )
        if self.muon_adjust_lr not in MUON_LR_ADJUSTMENTS:
            raise _bad(
                "optimizer.muon_adjust_lr",
                f"{self.muon_adjust_lr!r} is not one of {', '.join(MUON_LR_ADJUSTMENTS)}",
            )


@config_section
class ScheduleSection:
    """Learning rate: linear warmup, then a decay shape; total_steps fixed so incremental runs share a curve."""

    kind: Literal["cosine", "linear", "constant", "wsd", "inverse_sqrt"] = ruled(NEW_CURVE, "cosine")
    """Shape after warmup: cosine, linear, constant, wsd (warmup-stable-decay), inverse_sqrt."""
    warmup_steps: int = ruled(NEW_CURVE, 0)
    """Linear warmup from 0 to optimizer.lr over this many steps."""
    total_steps: int | None = ruled(NEW_CURVE, None)
    """Length of the curve (default: the run's train steps). Fix it to continue a run on the same curve."""
    min_lr_ratio: float = ruled(NEW_CURVE, 0.1)
    """Final learning rate as a fraction of optimizer.lr (cosine, linear, wsd)."""
    decay_fraction: float = ruled(NEW_CURVE, 0.2)
    """WSD: the last fraction of total_steps spent decaying."""
    decay_shape: Literal["linear", "cosine", "1-sqrt"] = ruled(NEW_CURVE, "1-sqrt")
    """WSD: the shape of the final decay."""

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise _bad("schedule.kind", f"{self.kind!r} is not one of {', '.join(SCHEDULES)}")
        if self.warmup_steps < 0:
            raise _bad("schedule.warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        if self.total_steps is not None and self.total_steps < 1:
            raise _bad("schedule.total_steps", f"must be >= 1, got {self.total_steps}")
        if self.total_steps is not None and self.warmup_steps > self.total_steps:
            raise _bad(
                "schedule.warmup_steps",
                f"{self.warmup_steps} is longer than schedule.total_steps={self.total_steps}",
            )
        if not 0 <= self.min_lr_ratio <= 1:
            raise _bad("schedule.min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}")
        if not 0 < self.decay_fraction <= 1:
            raise _bad("schedule.decay_fraction", f"must be in (0, 1], got {self.decay_fraction}")
        if self.decay_shape not in WSD_DECAYS:
            raise _bad("schedule.decay_shape", f"{self.decay_shape!r} is not one of {', '.join(WSD_DECAYS)}")


@config_section
class EvalSection:
    """Evaluation on the valid split: loss, perplexity, token accuracy (top-1) and bits per byte."""

    every: int = ruled(FROM_NEXT_STEP, 0)
    """Evaluate every N steps (and after the last step); 0 (the default) disables: evaluation costs compute,
    needs a valid split (llm-mix --valid-samples, 0 by default) and protects no work, which
    checkpoint.save_every_minutes does."""
    iters: int = ruled(FROM_NEXT_STEP, 4)
    """Micro-batches per rank per evaluation."""
    per_source: bool = ruled(FROM_NEXT_STEP, False)
    """Also the valid split's loss, bits per byte and tokens of each source of a blend (eval/<source>/loss,
    /bpb, /tokens); one more forward over the evaluated micro-batches."""
    tasks: list[str] = ruled(FROM_NEXT_STEP, default_factory=list)
    """Downstream tasks scored at every evaluation: JSONL files (relative to the config's folder) of
    multiple-choice ({context, choices, gold}: acc, acc_norm) or perplexity ({text}: loss, bpb) examples,
    reported as eval/<file name>/acc ... (llmtools.train.downstream)."""

    def __post_init__(self) -> None:
        if self.every < 0:
            raise _bad("eval.every", f"must be >= 0, got {self.every}")
        if self.iters < 1:
            raise _bad("eval.iters", f"must be >= 1, got {self.iters}")


@config_section
class LoggingSection:
    """What is logged, how often."""

    log_every: int = ruled(FROM_NEXT_STEP, 10)
    """A metrics record (metrics.jsonl) and a stderr line every N steps."""
    tensorboard: bool = ruled(FROM_NEXT_STEP, False)
    """Also write TensorBoard events to RUN_DIR/tensorboard/ (the same as tensorboard in report_to)."""
    report_to: list[str] = ruled(FROM_NEXT_STEP, default_factory=list)
    """Where rank 0 reports besides metrics.jsonl: any of tensorboard, wandb, mlflow (wandb and mlflow are
    the extra ``track``). W&B runs offline into RUN_DIR/wandb unless WANDB_MODE says otherwise; MLflow writes
    to RUN_DIR/mlruns unless tracking_uri (or MLFLOW_TRACKING_URI) names a store."""
    project: str = ruled(FROM_NEXT_STEP, "llmtools")
    """The W&B project and the MLflow experiment the run reports to."""
    tracking_uri: str | None = ruled(FROM_NEXT_STEP, None)
    """MLflow's tracking URI (a server, a folder or file:, sqlite: with the full mlflow); default
    MLFLOW_TRACKING_URI, else RUN_DIR/mlruns."""
    norms: bool = ruled(FROM_NEXT_STEP, True)
    """params_norm, update_norm and update_ratio (norm of the step's update / norm of the parameters) in
    each train record; costs a copy of the optimizer's parameters (its partition) on log steps."""

    def __post_init__(self) -> None:
        if self.log_every < 1:
            raise _bad("logging.log_every", f"must be >= 1, got {self.log_every}")
        for name in self.report_to:
            if name not in REPORTERS:
                raise _bad(
                    "logging.report_to",
                    f"{name!r} is not one of {', '.join(REPORTERS)}{did_you_mean(name, REPORTERS)}",
                )
        if self.tracking_uri is not None:
            problem = tracking_uri_problem(self.tracking_uri)
            if problem:
                raise _bad("logging.tracking_uri", problem)

    def reporters(self) -> list[str]:
        """The trackers asked for, in a fixed order (``tensorboard: true`` is an alias of the first)."""
        asked = set(self.report_to) | ({"tensorboard"} if self.tensorboard else set())
        return [name for name in REPORTERS if name in asked]


@config_section
class CheckpointSection:
    """When checkpoints are written (through llmtools.ckpt) and which are kept."""

    save_every: int = ruled(FROM_NEXT_STEP, 0)
    """Save every N steps (and at the end); 0: by save_every_minutes and at the end only."""
    save_every_minutes: float = ruled(FROM_NEXT_STEP, 30.0)
    """Also save once this many minutes of training have passed since the run started (or resumed) or last
    saved, so a run killed without warning loses at most about this much work; rank 0's clock decides for
    every rank. 0 turns it off (then only save_every and the end save)."""
    save_final: bool = ruled(FROM_NEXT_STEP, True)
    """Save after the last step."""
    keep_last: int | None = ruled(FROM_NEXT_STEP, None)
    """Keep only the newest N checkpoints."""
    keep_every: int | None = ruled(FROM_NEXT_STEP, None)
    """Also keep every checkpoint whose step is a multiple of this."""
    async_: bool = ruled(FROM_NEXT_STEP, False, metadata={"key": "async"})
    """Write checkpoints in the background: the state is copied to host memory, then written, fsynced and
    hashed while training goes on; the checkpoint is committed (meta.json, rename, latest) once every rank's
    write is done. At most one save is in flight; the next save, the end of the run and SIGTERM wait for it."""

    def __post_init__(self) -> None:
        if self.save_every < 0:
            raise _bad("checkpoint.save_every", f"must be >= 0, got {self.save_every}")
        if not self.save_every_minutes >= 0:
            raise _bad(
                "checkpoint.save_every_minutes", f"must be >= 0 (0: off), got {self.save_every_minutes}"
            )
        for name in ("keep_last", "keep_every"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise _bad(f"checkpoint.{name}", f"must be >= 1, got {value}")


@config_section
class DistributedSection:
    """How long a collective may wait for the other ranks."""

    timeout_s: float = ruled(THIS_RUNS_GROUPS, 600.0)
    """Seconds any collective (and the process-group set-up) waits before the rank gives up: a host that
    vanished ends the surviving ranks within this time, with a message naming the missing ranks."""

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise _bad("distributed.timeout_s", f"must be > 0, got {self.timeout_s}")


@config_section
class HealthSection:
    """What happens on a NaN/inf loss, a grad-norm spike or a loss spike."""

    nan_action: Literal["skip", "stop"] = ruled(FROM_NEXT_STEP, "stop")
    """NaN/inf loss or grad norm: skip the update, or stop (with a checkpoint of the last good state)."""
    spike_factor: float = ruled(FROM_NEXT_STEP, 0.0)
    """A grad norm above spike_factor x the median of the last spike_window norms is a spike; 0 disables."""
    spike_window: int = ruled(FROM_NEXT_STEP, 20)
    """How many recent (healthy) grad norms the median is taken over; detection starts once it is full."""
    loss_spike_factor: float = ruled(FROM_NEXT_STEP, 0.0)
    """A step loss above loss_spike_factor x the median of the last spike_window step losses is a loss
    spike (bad data, most often); 0 disables."""
    spike_action: Literal["skip", "stop", "warn"] = ruled(FROM_NEXT_STEP, "skip")
    """On a spike (grad norm or loss): skip the update, stop with a checkpoint, or only warn."""
    max_skips: int = ruled(FROM_NEXT_STEP, 10)
    """Stop once this many consecutive steps have been skipped (fp16 overflows are the loss scaler's)."""
    update_spike_factor: float = ruled(FROM_NEXT_STEP, 0.0)
    """An update/parameter norm ratio per unit of learning rate above update_spike_factor x the median of the
    last spike_window is a spike; 0 disables (the ratio is then measured on log steps only)."""
    update_spike_action: Literal["warn", "stop"] = ruled(FROM_NEXT_STEP, "warn")
    """On an update-ratio spike: warn, or stop with a checkpoint (the ratio is known only once the update
    is applied, so it cannot be skipped)."""
    moe_collapse_action: Literal["warn", "stop", "off"] = ruled(FROM_NEXT_STEP, "warn")
    """MoE routing collapse in a logging window (a layer with at least moe_idle_fraction of its experts
    idle, or at least moe_dropped_fraction of its token assignments dropped): warn, stop with a
    checkpoint, or off."""
    moe_idle_fraction: float = ruled(FROM_NEXT_STEP, 0.5)
    """The share of a layer's experts that must be idle (under a tenth of an even share of the tokens)."""
    moe_dropped_fraction: float = ruled(FROM_NEXT_STEP, 0.5)
    """The share of a layer's token assignments that must be dropped (over the experts' capacity)."""

    def __post_init__(self) -> None:
        if self.nan_action not in HEALTH_ACTIONS:
            raise _bad("health.nan_action", f"{self.nan_action!r} is not one of {', '.join(HEALTH_ACTIONS)}")
        if self.spike_action not in SPIKE_ACTIONS:
            raise _bad(
                "health.spike_action", f"{self.spike_action!r} is not one of {', '.join(SPIKE_ACTIONS)}"
            )
        if self.spike_factor < 0 or (0 < self.spike_factor <= 1):
            raise _bad("health.spike_factor", f"must be 0 (off) or > 1, got {self.spike_factor}")
        if self.loss_spike_factor < 0 or (0 < self.loss_spike_factor <= 1):
            raise _bad("health.loss_spike_factor", f"must be 0 (off) or > 1, got {self.loss_spike_factor}")
        if self.spike_window < 2:
            raise _bad("health.spike_window", f"must be >= 2, got {self.spike_window}")
        if self.max_skips < 1:
            raise _bad("health.max_skips", f"must be >= 1, got {self.max_skips}")
        if self.moe_collapse_action not in ("warn", "stop", "off"):
            raise _bad(
                "health.moe_collapse_action", f"{self.moe_collapse_action!r} is not one of warn, stop, off"
            )
        for key in ("moe_idle_fraction", "moe_dropped_fraction"):
            if not 0 < getattr(self, key) <= 1:
                raise _bad(f"health.{key}", f"must be in (0, 1], got {getattr(self, key)}")
        if self.update_spike_factor < 0 or (0 < self.update_spike_factor <= 1):
            raise _bad(
                "health.update_spike_factor", f"must be 0 (off) or > 1, got {self.update_spike_factor}"
            )
        if self.update_spike_action not in UPDATE_SPIKE_ACTIONS:
            raise _bad(
                "health.update_spike_action",
                f"{self.update_spike_action!r} is not one of {', '.join(UPDATE_SPIKE_ACTIONS)}",
            )
