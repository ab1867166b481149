"""The training loop: a DeepSpeed engine over the LLaMA model, fed by the blended dataset.

``train(config, ds_config, run_dir)`` is the library entry point (``llm-train`` is a thin adapter):

1. plan (before any compute, :mod:`~llmtools.train.plan`): model shape, data, lengths, DeepSpeed config
   -> errors name file and key; the run folder (:mod:`~llmtools.train.rundir`);
2. process group (one process, or a launcher's), model (seeded), AdamW with no decay on norms/biases,
   the LR schedule, ``deepspeed.initialize`` (:mod:`~llmtools.train.engine`);
3. per step (:func:`accumulate_and_update`): ``grad_accumulation`` micro-batches per rank (forward, fp32
   cross-entropy, backward), then the update; health checks gate the update
   (:mod:`~llmtools.train.health`); a metrics record and a stderr line every ``log_every`` steps
   (:mod:`~llmtools.train.metrics`); eval every ``eval.every``; a checkpoint every ``save_every``.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmtools.errors import InputError, RuntimeFailure
from llmtools.train import losses as loss_fns
from llmtools.train.config import TrainConfig
from llmtools.train.deepspeed_config import prefer_torch_adam
from llmtools.train.distributed import all_mean, any_rank, log0
from llmtools.train.health import HealthGate, wrap_step
from llmtools.train.plan import TrainPlan, make_plan
from llmtools.train.rundir import prepare_run_dir, write_resolved


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
    rollback: bool = False  # resuming from an older checkpoint moves the newer ones aside


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
    prepare_run_dir(options.run_dir, options.resume, options.force, rank, rollback=options.rollback)
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


def _event(metrics, step: int, event: str, message: str) -> None:
    metrics.log(
        {"kind": "event", "step": step, "time": time.time(), "event": event, "message": message}, step
    )


def accumulate_and_update(engine, plan: TrainPlan, batches, gate: HealthGate, coalesce: bool, own_norm: bool):
    """One optimizer step: every micro-batch's forward and backward, the health checks, the update.
    Returns the micro-batch losses (detached)."""
    import torch

    cfg, gas = plan.config, plan.grad_accumulation
    losses = []
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
                inputs, labels = loss_fns.to_batch(plan.train_data.batch(indices), engine.device)
                loss = loss_fns.cross_entropy(engine(inputs), labels)
            losses.append(loss.detach())
            engine.backward(loss)
            if m < gas - 1 and not coalesce:
                engine.step()  # DeepSpeed counts micro-steps; the update waits for the boundary
    # the accumulation boundary: health checks, then the update
    local = torch.stack(losses).float()
    gate.loss_bad = any_rank(not bool(torch.isfinite(local).all()), engine.device)
    if own_norm:
        from llmtools.train.engine import grad_norm_of

        gate.precomputed_norm = grad_norm_of(engine.module)
    if coalesce:
        engine.set_gradient_accumulation_boundary(True)
    engine.step()
    if not gate.decided:  # the optimizer was not reached (DeepSpeed skipped an overflowing step itself)
        gate.overflowed()
    return losses


def _train(plan: TrainPlan, options: RunOptions, dist_info) -> RunResult:
    import torch

    from llmtools.data.dataset import MicroBatchSampler
    from llmtools.model.flops import flops_per_token
    from llmtools.train import checkpointing
    from llmtools.train.engine import build_engine, build_model, coalesce_reductions
    from llmtools.train.metrics import StepWindow, build_metrics_logger, peak_tflops, step_line

    _quiet_deepspeed()
    cfg = plan.config
    rank, world, device = dist_info.rank, dist_info.world_size, dist_info.device
    quiet = options.quiet
    run_dir = options.run_dir
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_resolved(plan, run_dir)
        for warning in plan.warnings:
            log0(f"warning: {warning}", rank)

    engine = build_engine(plan, build_model(plan), device)

    def norm_source():
        value = getattr(engine.optimizer, "_global_grad_norm", None)
        if value is None or engine.optimizer is engine.basic_optimizer:
            return None
        return float(value)

    gate = HealthGate(cfg.health, norm_source)
    wrap_step(engine.basic_optimizer, gate)
    own_norm = engine.optimizer is engine.basic_optimizer  # ZeRO-0 fp32: DeepSpeed keeps no norm
    coalesce = coalesce_reductions(engine, plan.grad_accumulation, world)

    manager = checkpointing.make_manager(run_dir, cfg.checkpoint.keep_last, cfg.checkpoint.keep_every)
    model_identity = plan.model_config.to_dict()
    start_step, consumed_samples, consumed_tokens = 0, 0, 0
    path, client_state = checkpointing.resume(
        manager, engine, options.resume, model=model_identity, tokenizer=plan.tokenizer, rollback=options.rollback
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
            log0(
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
        log0(f"resumed from {path} at step {start_step} ({consumed_samples} samples)", rank, quiet)
        _event(metrics, start_step, "resume", f"resumed from {path}")
    else:
        _event(
            metrics,
            0,
            "start",
            f"{plan.model_config.num_parameters():,} parameters, {world} rank(s), "
            f"ZeRO-{plan.zero_stage}, {cfg.training.precision}",
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
        _event(metrics, step, "checkpoint", str(saved))
        log0(f"checkpoint {saved}", rank, quiet)
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
    log0(
        f"training {plan.model_config.num_parameters():,} parameters for {plan.steps} steps "
        f"({plan.tokens_per_step:,} tokens/step, {world} rank(s) x {gas} micro-batch(es) of {micro}, "
        f"ZeRO-{plan.zero_stage}, {cfg.training.precision}) -> {run_dir}",
        rank,
        quiet,
    )

    result = RunResult(run_dir=run_dir, steps=start_step, final_loss=None, first_loss=None, checkpoint=None)
    window = StepWindow()
    last_saved: Path | None = None
    engine.train()
    # --- llm-ckpt (issue 6): SIGTERM/SIGINT finish the current step, save, and return (exit 0) ---
    from llmtools.ckpt.signals import StopRequested, resume_command

    stop = StopRequested(announce=rank == 0).install()
    # --- end llm-ckpt ---
    for step in range(start_step + 1, plan.steps + 1):
        started = time.perf_counter()
        gate.reset()
        lr = engine.get_lr()[0] if engine.get_lr() else cfg.optimizer.lr
        losses = accumulate_and_update(engine, plan, batches, gate, coalesce, own_norm)
        grad_norm = gate.norm
        step_loss = all_mean([float(torch.stack(losses).float().mean())], engine.device)[0]
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
            _event(metrics, step, gate.reason, f"{what}; {action}")
            log0(f"step {step}: {what}; {action}", rank)
        else:
            gate.consecutive_skips = 0
        window.add(step_loss, step_time, plan.tokens_per_step, gate.skip)
        if step % cfg.logging.log_every == 0 or step == plan.steps or gate.reason:
            record = window.record(
                step,
                consumed_samples=consumed_samples,
                consumed_tokens=consumed_tokens,
                grad_norm=grad_norm,
                lr=lr,
                device=device,
                flops_per_token=fpt,
                peak_tflops=peak,
                world=world,
            )
            metrics.log(record, step)
            log0(step_line(record, plan.steps), rank, quiet)
            window = StepWindow()

        if gate.stop or gate.consecutive_skips >= cfg.health.max_skips:
            reason = "health.nan_action=stop" if gate.reason == "nan" else "health.spike_action=stop"
            if not gate.stop:
                reason = f"{gate.consecutive_skips} consecutive skipped steps (health.max_skips)"
            saved = save(step)
            _event(metrics, step, "stop", f"stopped at step {step}: {reason}; checkpoint {saved}")
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
            eval_loss = loss_fns.evaluate(engine, plan, rank, world)
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
            log0(f"step {step:>6}/{plan.steps} | eval loss {eval_loss:.4f} | eval ppl {ppl:.2f}", rank, quiet)

        if (cfg.checkpoint.save_every and step % cfg.checkpoint.save_every == 0) or (
            step == plan.steps and cfg.checkpoint.save_final
        ):
            last_saved = save(step)

        # --- llm-ckpt (issue 6) ---
        if stop.should_stop():
            if last_saved is None or last_saved.name != f"step_{step:08d}":
                last_saved = save(step)
            result.stopped = stop.signal_name
            _event(
                metrics,
                step,
                "stop",
                f"stopped by {stop.signal_name} at step {step}; checkpoint {last_saved}",
            )
            log0(stop.resume_hint(resume_command(), str(last_saved)), rank)
            break
    stop.restore()
    # --- end llm-ckpt ---

    result.checkpoint = last_saved
    metrics.close()
    return result
