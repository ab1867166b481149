"""The training loop: a DeepSpeed engine over the LLaMA model, fed by the blended dataset.

``train(config, ds_config, run_dir)`` is the library entry point (``llm-train`` is a thin adapter):

1. plan (before any compute): model shape, data, lengths, DeepSpeed config -> errors name file and key;
2. process group (one process, or a launcher's), model (seeded), AdamW with no decay on norms/biases,
   the LR schedule, ``deepspeed.initialize``;
3. per step: ``grad_accumulation`` micro-batches per rank (forward, fp32 cross-entropy, backward), then
   the update; health checks gate the update (NaN/inf, grad-norm spikes); a metrics record and a stderr
   line every ``log_every`` steps; eval every ``eval.every``; a checkpoint every ``save_every``.

Only rank 0 writes the run folder's logs. The loss reported for a step is the mean of the micro-batch
losses over all ranks, i.e. the loss of the global batch.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmtools.errors import InputError, RuntimeFailure, UsageError
from llmtools.fsutil import write_text_atomic
from llmtools.train.config import TrainConfig
from llmtools.train.deepspeed_config import prefer_torch_adam
from llmtools.train.plan import TrainPlan, make_plan

# Dense bf16 peak of one device, for MFU (TFLOP/s). CPU peaks are unknown: MFU is null there unless
# LLMTOOLS_PEAK_TFLOPS says; the record still carries the achieved TFLOP/s.
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "4090": 165.0}


@dataclass
class RunOptions:
    run_dir: Path
    ds_source: str = "<deepspeed config>"
    tensorboard: bool = False
    resume: str | None = None
    force: bool = False
    quiet: bool = False
    on_step: Callable[[int, float], None] | None = None
    """Called on every rank after each step with (step, loss); for benchmarks and embedding programs."""
    reset_data: bool = False  # llm-ckpt (issue 6): continue step count and schedule, restart the data


@dataclass
class RunResult:
    run_dir: Path
    steps: int
    final_loss: float | None
    first_loss: float | None
    checkpoint: Path | None
    losses: list[float] = field(default_factory=list)
    eval_loss: float | None = None
    stopped: str | None = None


def _log(message: str, rank: int, quiet: bool = False) -> None:
    if rank == 0 and not quiet:
        print(message, file=sys.stderr, flush=True)


def peak_tflops(device: str) -> float | None:
    env = os.environ.get("LLMTOOLS_PEAK_TFLOPS")
    if env:
        return float(env)
    if device.startswith("cuda"):
        import torch

        name = torch.cuda.get_device_name()
        for key, value in PEAK_TFLOPS.items():
            if key in name:
                return value
    return None


def memory_mb(device: str) -> float | None:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.max_memory_allocated() / 2**20
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except ImportError:
        return None


def param_groups(model, weight_decay: float) -> list[dict]:
    """Decay matrices (linear and embedding weights); never norms, biases or any 1-D parameter."""
    decay, no_decay = [], []
    for _name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


class HealthGate:
    """Decides, inside the optimizer step, whether this update is applied.

    DeepSpeed computes the global grad norm (all ranks agree on it) before it calls the inner optimizer,
    so the check runs there: the wrapped ``step`` of the basic optimizer asks :meth:`allow`. A skipped
    update leaves the weights and Adam moments untouched; the LR schedule still advances, so the step
    count and the curve stay aligned. With ``stop`` the update is refused too, so the checkpoint written
    before stopping holds the last good weights.
    """

    def __init__(self, health, norm_source) -> None:
        self.health = health
        self.norm_source = norm_source  # () -> float | None, the global pre-clip grad norm
        self.history: deque[float] = deque(maxlen=health.spike_window)
        self.reset()
        self.consecutive_skips = 0

    def reset(self) -> None:
        self.loss_bad = False
        self.decided = False
        self.skip = False
        self.reason: str | None = None  # "nan" | "spike"
        self.stop = False
        self.norm: float | None = None
        self.precomputed_norm: float | None = None

    def allow(self) -> bool:
        if not self.decided:
            self._decide()
        return not self.skip

    def overflowed(self) -> None:
        """DeepSpeed found non-finite gradients and skipped the update before asking the optimizer."""
        self.decided = True
        norm = self.norm_source()
        self.norm = float("inf") if norm is None else float(norm)
        self.reason, self.skip, self.stop = "nan", True, self.health.nan_action == "stop"

    def _decide(self) -> None:
        self.decided = True
        norm = self.norm_source()
        if norm is None:
            norm = self.precomputed_norm
        self.norm = None if norm is None else float(norm)
        h = self.health
        if self.loss_bad or (self.norm is not None and not math.isfinite(self.norm)):
            self.reason, self.skip, self.stop = "nan", True, h.nan_action == "stop"
        elif (
            h.spike_factor > 0
            and self.norm is not None
            and len(self.history) == self.history.maxlen
            and self.norm > h.spike_factor * statistics.median(self.history)
        ):
            self.reason = "spike"
            self.skip = h.spike_action in ("skip", "stop")
            self.stop = h.spike_action == "stop"
        if self.norm is not None and math.isfinite(self.norm) and not self.skip:
            self.history.append(self.norm)


def _wrap_step(optimizer, gate: HealthGate) -> None:
    original = optimizer.step

    def step(*args, **kwargs):
        # Marked like torch's own LR-scheduler wrapper, so torch does not warn that step() was replaced.
        optimizer._opt_called = True
        if not gate.allow():
            return None
        return original(*args, **kwargs)

    step._wrapped_by_lr_sched = True
    optimizer.step = step


def coalesce_reductions(engine, grad_accumulation: int, world: int) -> bool:
    """Whether to reduce gradients once per step instead of after every micro-batch.

    DeepSpeed's ZeRO-1/2 reduce (flatten, all-reduce, copy into the partition) after every backward;
    with one rank that is pure overhead: 14-17% of a tiny-model step at ZeRO-2. There, and only there,
    the micro-batches run inside ``engine.coalesce_grad_reduction()`` (one reduction at the boundary),
    with DeepSpeed's manual boundary (``set_gradient_accumulation_boundary``: False during the
    micro-batches, True for the one ``step()``). With several ranks, ZeRO-2's point is
    to hold only a partition of the gradients between micro-batches, so DeepSpeed's per-micro-batch
    reduction is kept. ``LLMTOOLS_COALESCE=0`` turns this off (for comparisons).
    """
    if os.environ.get("LLMTOOLS_COALESCE", "1") == "0" or world != 1 or grad_accumulation == 1:
        return False
    if engine.zero_optimization_stage() not in (1, 2) or not hasattr(
        engine.optimizer, "_coalesce_grad_reduction"
    ):
        return False  # stage 0, 3 (its own partitioned path), or an optimizer wrapper (bf16 at stage 0)
    return True


def _cross_entropy(logits, labels):
    import torch.nn.functional as F

    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def _to_batch(array, device):
    import torch

    tokens = torch.from_numpy(array).to(device=device, dtype=torch.long, non_blocking=True)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def _all_mean(values: list[float], device) -> list[float]:
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor)
        tensor /= dist.get_world_size()
    return tensor.tolist()


def _any(flag: bool, device) -> bool:
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([1.0 if flag else 0.0], device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item() > 0)


def _grad_norm_of(module) -> float:
    import torch

    total = torch.zeros((), dtype=torch.float64)
    for param in module.parameters():
        if param.grad is not None:
            total += param.grad.detach().double().pow(2).sum().cpu()
    return float(total.sqrt())


def prepare_run_dir(run_dir: Path, resume: str | None, force: bool, rank: int = 0) -> None:
    """Refuse to train over an existing run unless resuming (or --force, which starts over: rank 0 clears).

    Every rank checks, so a refusal stops every rank alike (no rank is left waiting for the others).
    """
    if force and rank != 0:
        return
    existing = [run_dir / name for name in ("metrics.jsonl", "checkpoints") if (run_dir / name).exists()]
    if existing and resume is None:
        if not force:
            raise UsageError(
                f"{run_dir}: already holds a run ({existing[0].name}); --resume auto continues it, "
                "--force starts over, -o picks another folder"
            )
        import shutil

        for name in ("metrics.jsonl", "config.yaml", "ds_config.json"):
            (run_dir / name).unlink(missing_ok=True)
        for name in ("checkpoints", "tensorboard"):
            shutil.rmtree(run_dir / name, ignore_errors=True)


def write_resolved(plan: TrainPlan, run_dir: Path) -> None:
    """RUN/config.yaml (the fully resolved train config) and RUN/ds_config.json."""
    import yaml

    resolved = plan.config.to_dict()
    resolved["model"] = {
        "preset": plan.config.model.preset,
        "init_from": plan.config.model.init_from,
        **plan.model_config.to_dict(),
    }
    resolved["data"]["seq_length"] = plan.seq_length
    resolved["training"]["train_steps"] = plan.steps
    resolved["schedule"]["total_steps"] = plan.total_steps
    resolved["resolved"] = {
        "world_size": plan.world_size,
        "grad_accumulation": plan.grad_accumulation,
        "zero_stage": plan.zero_stage,
        "tokens_per_step": plan.tokens_per_step,
        "num_parameters": plan.model_config.num_parameters(),
        "tokenizer": plan.tokenizer,
        "config_hash": plan.config.fingerprint(),
    }
    header = f"# written by llm-train from {plan.config.source}; every default filled in\n"
    write_text_atomic(run_dir / "config.yaml", header + yaml.safe_dump(resolved, sort_keys=False))
    write_text_atomic(run_dir / "ds_config.json", json.dumps(plan.ds_config, indent=2) + "\n")


def build_model(plan: TrainPlan):
    import torch

    from llmtools.model import LlamaForCausalLM

    torch.manual_seed(plan.config.training.seed)
    model = LlamaForCausalLM(plan.model_config)
    model.gradient_checkpointing = plan.config.training.activation_checkpointing
    init_from = plan.config.model.init_from
    if init_from:
        from llmtools.train.sft import load_init_weights  # issue 8: an HF folder or one of our checkpoints

        load_init_weights(model, init_from)  # checks the folder's shape against ours, names every mismatch
    # --- lora (issue 8): freeze the base, add adapters (after init_from, so they sit on its weights) ---
    if plan.config.lora is not None:
        from llmtools.train.lora import apply_lora

        counts = apply_lora(model, plan.config.lora)
        _log(
            f"lora: {counts['trainable']:,} trainable adapter parameters on {counts['modules']} projections; "
            f"{counts['frozen']:,} base parameters frozen",
            int(os.environ.get("RANK", "0")),
        )
    # --- end lora ---
    return model


def _data_fingerprint(plan: TrainPlan) -> str:
    data = plan.config.data
    return json.dumps(
        {
            "mix": data.mix,
            "prefixes": data.prefixes,
            "weights": data.weights,
            "seq_length": plan.seq_length,
            "seed": data.seed,
            "split": data.split,
        },
        sort_keys=True,
    )


def train(config: TrainConfig, ds_raw: dict, options: RunOptions) -> RunResult:
    """Run training as the library entry point (call on every rank)."""
    from llmtools.train.distributed import detect_environment, init_distributed

    detect_environment()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    # Every check before any compute, before torch is even imported (a bad config fails in about a second)
    # and before the process group exists (so it fails on every rank alike).
    plan = make_plan(config, ds_raw, world_size=world, cpu=False, ds_source=options.ds_source)
    prepare_run_dir(options.run_dir, options.resume, options.force, rank)
    import torch

    if not torch.cuda.is_available():
        prefer_torch_adam(plan.ds_config)
    # The process group outlives the run (DeepSpeed keeps its own handle on it); the CLI tears it down.
    dist_info = init_distributed()
    return _train(plan, options, dist_info)


def _quiet_deepspeed() -> None:
    import logging
    import warnings

    # DeepSpeed's ZeRO calls torch.distributed APIs that torch 2.13 deprecates, once per bucket per step.
    warnings.filterwarnings("ignore", category=FutureWarning, message=r".*torch\.distributed\.")

    level = logging.INFO if os.environ.get("LLMTOOLS_DEBUG") else logging.WARNING
    try:
        from deepspeed.utils import logger

        logger.setLevel(level)
        # DeepSpeed logs to stdout; stdout is for results (paths, JSON), so its messages go to stderr.
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and getattr(handler, "stream", None) is sys.stdout:
                handler.setStream(sys.stderr)
    except ImportError:
        pass


def _train(plan: TrainPlan, options: RunOptions, dist_info) -> RunResult:
    import deepspeed
    import torch

    from llmtools.data.dataset import MicroBatchSampler
    from llmtools.model.flops import flops_per_token
    from llmtools.train import checkpointing
    from llmtools.train.metrics import build_metrics_logger
    from llmtools.train.schedule import build_lr_scheduler

    _quiet_deepspeed()
    cfg = plan.config
    rank, world, device = dist_info.rank, dist_info.world_size, dist_info.device
    quiet = options.quiet
    run_dir = options.run_dir
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_resolved(plan, run_dir)
        for warning in plan.warnings:
            _log(f"warning: {warning}", rank)

    model = build_model(plan)
    groups = param_groups(model, cfg.optimizer.weight_decay)
    optimizer = scheduler = None
    if "optimizer" not in plan.ds_config and cfg.optimizer.name != "adamw":
        from llmtools.train.optim import allow_in_deepspeed, build_optimizer

        optimizer = build_optimizer(cfg.optimizer, groups, device)
        allow_in_deepspeed(plan.ds_config, cfg.optimizer.name)
    elif "optimizer" not in plan.ds_config:
        betas = tuple(cfg.optimizer.betas)
        kwargs = {"fused": True} if device.startswith("cuda") else {"foreach": False}
        optimizer = torch.optim.AdamW(
            groups,
            lr=cfg.optimizer.lr,
            betas=betas,
            eps=cfg.optimizer.eps,
            weight_decay=cfg.optimizer.weight_decay,
            **kwargs,
        )
    if "scheduler" not in plan.ds_config:
        if optimizer is not None:
            scheduler = build_lr_scheduler(optimizer, cfg.schedule, plan.total_steps)
        else:
            scheduler = lambda opt: build_lr_scheduler(opt, cfg.schedule, plan.total_steps)  # noqa: E731
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=groups if optimizer is None else None,
        optimizer=optimizer,
        lr_scheduler=scheduler,
        config=plan.ds_config,
        dist_init_required=False,
    )

    def norm_source():
        value = getattr(engine.optimizer, "_global_grad_norm", None)
        if value is None or engine.optimizer is engine.basic_optimizer:
            return None
        return float(value)

    gate = HealthGate(cfg.health, norm_source)
    _wrap_step(engine.basic_optimizer, gate)
    own_norm = engine.optimizer is engine.basic_optimizer  # ZeRO-0 fp32: DeepSpeed keeps no norm
    coalesce = coalesce_reductions(engine, plan.grad_accumulation, world)

    manager = checkpointing.make_manager(run_dir, cfg.checkpoint.keep_last, cfg.checkpoint.keep_every)
    model_identity = plan.model_config.to_dict()
    start_step, consumed_samples, consumed_tokens = 0, 0, 0
    path, client_state = checkpointing.resume(
        manager, engine, options.resume, model=model_identity, tokenizer=plan.tokenizer
    )
    metrics = build_metrics_logger(run_dir, rank, tensorboard=options.tensorboard or cfg.logging.tensorboard)
    if client_state:
        start_step = int(client_state.get("step", 0))
        consumed_samples = int(client_state.get("consumed_samples", 0))
        consumed_tokens = int(client_state.get("consumed_tokens", 0))
        # --- llm-ckpt (issue 6): a changed data section is refused unless --reset-data restarts the data ---
        saved_data, current_data = client_state.get("data_fingerprint"), _data_fingerprint(plan)
        if options.reset_data:
            consumed_samples = 0
            _log(
                f"--reset-data: step {start_step} and the schedule continue; the data starts from its beginning",
                rank,
                quiet,
            )
        elif saved_data is not None and saved_data != current_data:
            raise InputError(
                f"{path}/meta.json[data]: the checkpoint was trained on data {saved_data}, the config "
                f"now has {current_data}; pass --reset-data to continue the step count and schedule "
                "on the new data from its beginning"
            )
        # --- end llm-ckpt ---
        _log(f"resumed from {path} at step {start_step} ({consumed_samples} samples)", rank, quiet)
        metrics.log(
            {
                "kind": "event",
                "step": start_step,
                "time": time.time(),
                "event": "resume",
                "message": f"resumed from {path}",
            },
            start_step,
        )
    else:
        metrics.log(
            {
                "kind": "event",
                "step": 0,
                "time": time.time(),
                "event": "start",
                "message": f"{plan.model_config.num_parameters():,} parameters, {world} rank(s), "
                f"ZeRO-{plan.zero_stage}, {cfg.training.precision}",
            },
            0,
        )

    def client_state_at(step: int) -> dict[str, Any]:
        return {
            "step": step,
            "consumed_samples": consumed_samples,
            "consumed_tokens": consumed_tokens,
            "config_hash": cfg.fingerprint(),
            "model": model_identity,
            "tokenizer": plan.tokenizer,
            "data_fingerprint": _data_fingerprint(plan),
            # issue 8: llm-ckpt convert reads it (merge / --adapter-only)
            "lora": cfg.lora.to_dict() if cfg.lora is not None else None,
        }

    def save(step: int) -> Path:
        saved = checkpointing.save(manager, engine, step, client_state_at(step))
        metrics.log(
            {
                "kind": "event",
                "step": step,
                "time": time.time(),
                "event": "checkpoint",
                "message": str(saved),
            },
            step,
        )
        _log(f"checkpoint {saved}", rank, quiet)
        return saved

    micro, gas = cfg.training.micro_batch_size, plan.grad_accumulation
    sampler = MicroBatchSampler(
        plan.steps * cfg.training.global_batch_size,
        micro,
        cfg.training.global_batch_size,
        rank,
        world,
        consumed_samples=consumed_samples,
    )
    batches = iter(sampler)
    fpt = flops_per_token(plan.model_config, plan.seq_length)
    peak = peak_tflops(device)
    _log(
        f"training {plan.model_config.num_parameters():,} parameters for {plan.steps} steps "
        f"({plan.tokens_per_step:,} tokens/step, {world} rank(s) x {gas} micro-batch(es) of {micro}, "
        f"ZeRO-{plan.zero_stage}, {cfg.training.precision}) -> {run_dir}",
        rank,
        quiet,
    )

    result = RunResult(run_dir=run_dir, steps=start_step, final_loss=None, first_loss=None, checkpoint=None)
    window = _new_window()
    last_saved: Path | None = None
    engine.train()
    # --- llm-ckpt (issue 6): SIGTERM/SIGINT finish the current step, save, and return (exit 0) ---
    from llmtools.ckpt.signals import StopRequested, resume_command

    stop = StopRequested(announce=rank == 0).install()
    # --- end llm-ckpt ---
    for step in range(start_step + 1, plan.steps + 1):
        started = time.perf_counter()
        gate.reset()
        losses = []
        lr = engine.get_lr()[0] if engine.get_lr() else cfg.optimizer.lr
        if coalesce:  # DeepSpeed's documented manual boundary: not one until all micro-batches are in
            engine.set_gradient_accumulation_boundary(False)
        with engine.coalesce_grad_reduction() if coalesce else contextlib.nullcontext():
            for m in range(gas):
                indices = next(batches)
                if cfg.task == "sft":  # --- sft (issue 8): loss only where the mask is 1 ---
                    from llmtools.train.sft import micro_batch_loss

                    loss = micro_batch_loss(
                        engine, plan.train_data.batch(indices), engine.device, plan.train_data.packed
                    )
                else:
                    inputs, labels = _to_batch(plan.train_data.batch(indices), engine.device)
                    logits = engine(inputs)
                    loss = _cross_entropy(logits, labels)
                losses.append(loss.detach())
                engine.backward(loss)
                if m < gas - 1 and not coalesce:
                    engine.step()  # DeepSpeed counts micro-steps; the update waits for the boundary
        # the accumulation boundary: health checks, then the update
        local = torch.stack(losses).float()
        gate.loss_bad = _any(not bool(torch.isfinite(local).all()), engine.device)
        if own_norm:
            gate.precomputed_norm = _grad_norm_of(engine.module)
        if coalesce:
            engine.set_gradient_accumulation_boundary(True)
        engine.step()
        if not gate.decided:  # the optimizer was not reached (DeepSpeed skipped an overflowing step itself)
            gate.overflowed()
        grad_norm = gate.norm
        step_loss = _all_mean([float(torch.stack(losses).float().mean())], engine.device)[0]
        consumed_samples += cfg.training.global_batch_size
        consumed_tokens += plan.tokens_per_step
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        step_time = time.perf_counter() - started
        result.steps = step
        result.losses.append(step_loss)
        if result.first_loss is None:
            result.first_loss = step_loss
        result.final_loss = step_loss

        if options.on_step is not None:
            options.on_step(step, step_loss)

        if gate.reason is not None:
            gate.consecutive_skips = gate.consecutive_skips + 1 if gate.skip else 0
            what = (
                "NaN/inf loss or grad norm"
                if gate.reason == "nan"
                else (
                    f"grad-norm spike {grad_norm:.3g} > {cfg.health.spike_factor} x median "
                    f"{statistics.median(gate.history):.3g}"
                )
            )
            action = "stopping" if gate.stop else ("update skipped" if gate.skip else "continuing")
            metrics.log(
                {
                    "kind": "event",
                    "step": step,
                    "time": time.time(),
                    "event": gate.reason,
                    "message": f"{what}; {action}",
                },
                step,
            )
            _log(f"step {step}: {what}; {action}", rank)
        else:
            gate.consecutive_skips = 0
        window["loss"] += step_loss if math.isfinite(step_loss) else 0.0
        window["n"] += 1 if math.isfinite(step_loss) else 0
        window["time"] += step_time
        window["steps"] += 1
        window["tokens"] += plan.tokens_per_step
        window["skipped"] += int(gate.skip)

        if step % cfg.logging.log_every == 0 or step == plan.steps or gate.reason:
            tokens_per_s = window["tokens"] / max(window["time"], 1e-9)
            achieved = fpt * tokens_per_s / world
            record = {
                "kind": "train",
                "step": step,
                "time": time.time(),
                "consumed_samples": consumed_samples,
                "consumed_tokens": consumed_tokens,
                "loss": window["loss"] / window["n"] if window["n"] else float("nan"),
                "grad_norm": grad_norm,
                "lr": lr,
                "step_time_s": window["time"] / window["steps"],
                "tokens_per_s": tokens_per_s,
                "mfu": achieved / (peak * 1e12) if peak else None,
                "memory_mb": memory_mb(device),
                "tflops_per_device": achieved / 1e12,
            }
            if window["skipped"]:
                record["skipped"] = True
                record["skipped_steps"] = window["skipped"]
            metrics.log(record, step)
            mfu_text = f" | mfu {record['mfu']:.1%}" if record["mfu"] is not None else ""
            gn = f"{grad_norm:.3f}" if grad_norm is not None else "n/a"
            mem = f" | mem {record['memory_mb']:.0f} MB" if record["memory_mb"] is not None else ""
            _log(
                f"step {step:>6}/{plan.steps} | loss {record['loss']:.4f} | lr {lr:.3e} | grad norm {gn} | "
                f"{tokens_per_s:,.0f} tok/s | {1000 * record['step_time_s']:.0f} ms/step{mfu_text}{mem}",
                rank,
                quiet,
            )
            window = _new_window()

        if gate.stop or gate.consecutive_skips >= cfg.health.max_skips:
            reason = "health.nan_action=stop" if gate.reason == "nan" else "health.spike_action=stop"
            if not gate.stop:
                reason = f"{gate.consecutive_skips} consecutive skipped steps (health.max_skips)"
            saved = save(step)
            metrics.log(
                {
                    "kind": "event",
                    "step": step,
                    "time": time.time(),
                    "event": "stop",
                    "message": f"stopped at step {step}: {reason}; checkpoint {saved}",
                },
                step,
            )
            metrics.close()
            stop.restore()
            raise RuntimeFailure(
                f"stopped at step {step}: {reason} (the update was not applied); the last good state is "
                f"saved in {saved}; fix the cause and continue with --resume {saved}"
            )

        if (
            plan.valid_data is not None
            and cfg.eval.every
            and (step % cfg.eval.every == 0 or step == plan.steps)
        ):
            eval_loss = evaluate(engine, plan, rank, world)
            result.eval_loss = eval_loss
            ppl = math.exp(min(eval_loss, 700.0))
            metrics.log(
                {
                    "kind": "eval",
                    "step": step,
                    "time": time.time(),
                    "consumed_tokens": consumed_tokens,
                    "eval_loss": eval_loss,
                    "eval_ppl": ppl,
                },
                step,
            )
            _log(f"step {step:>6}/{plan.steps} | eval loss {eval_loss:.4f} | eval ppl {ppl:.2f}", rank, quiet)

        if (cfg.checkpoint.save_every and step % cfg.checkpoint.save_every == 0) or (
            step == plan.steps and cfg.checkpoint.save_final
        ):
            last_saved = save(step)

        # --- llm-ckpt (issue 6) ---
        if stop.should_stop():
            if last_saved is None or last_saved.name != f"step_{step:08d}":
                last_saved = save(step)
            result.stopped = stop.signal_name
            metrics.log(
                {
                    "kind": "event",
                    "step": step,
                    "time": time.time(),
                    "event": "stop",
                    "message": f"stopped by {stop.signal_name} at step {step}; checkpoint {last_saved}",
                },
                step,
            )
            _log(stop.resume_hint(resume_command(), str(last_saved)), rank)
            break
    stop.restore()
    # --- end llm-ckpt ---

    result.checkpoint = last_saved
    metrics.close()
    return result


def _new_window() -> dict:
    return {"loss": 0.0, "n": 0, "time": 0.0, "tokens": 0, "skipped": 0, "steps": 0}


def evaluate(engine, plan: TrainPlan, rank: int, world: int) -> float:
    """Mean next-token loss over the first ``eval.iters`` micro-batches per rank of the valid split."""
    import numpy as np
    import torch

    data = plan.valid_data
    micro = plan.config.training.micro_batch_size
    n = len(data)
    engine.eval()
    losses = []
    with torch.no_grad():
        for i in range(plan.config.eval.iters):
            start = (i * world + rank) * micro
            indices = [int(j % n) for j in range(start, start + micro)]
            inputs, labels = _to_batch(data.batch(np.asarray(indices)), engine.device)
            losses.append(float(_cross_entropy(engine(inputs), labels)))
    engine.train()
    return _all_mean([sum(losses) / len(losses)], engine.device)[0]
