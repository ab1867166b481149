"""The model, its optimizer and LR schedule, and the DeepSpeed engine around them."""

from __future__ import annotations

import os
import sys

from llmtools.errors import InputError
from llmtools.train.distributed import log0
from llmtools.train.plan import TrainPlan


def param_groups(model, weight_decay: float, named: bool = False) -> list[dict]:
    """Decay matrices (linear and embedding weights); never norms, biases or any 1-D parameter.

    ``named``: each group gets a ``name`` (DeepSpeed's MoE support splits groups by name)."""
    decay, no_decay = [], []
    for _name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        shape = getattr(param, "ds_shape", param.shape)  # ZeRO-3's partitioned placeholders: the real one
        (decay if len(shape) >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    if named:
        for group, name in zip(groups, ("decay", "no_decay"), strict=False):
            group["name"] = name
    return groups


def device_choices(plan: TrainPlan, device: str):
    """What this run gets on ``device`` (:func:`llmtools.train.device.choose`): DeepSpeed casts the model
    itself for bf16/fp16, so autocast is left to runs whose engine does not."""
    from llmtools.train.device import choose

    cfg, model = plan.config, plan.model_config
    # Document masking and packed SFT reach SDPA as per-document causal spans (or varlen flash), never
    # as a dense mask: no run passes SDPA an explicit mask.
    masked = False
    casts = bool(
        (plan.ds_config.get("bf16") or {}).get("enabled") or (plan.ds_config.get("fp16") or {}).get("enabled")
    )
    return choose(
        device,
        precision=cfg.training.precision,
        engine_casts=casts or cfg.training.precision == "fp32",
        head_dim=model.head_dim,
        masked=masked,
        gqa=model.num_key_value_heads != model.num_attention_heads,
    )


def compile_layers(model) -> int:
    """``torch.compile`` each decoder layer in place (parameter names unchanged, so checkpoints are the
    eager model's); one graph serves every layer of the same kind. Returns how many were compiled."""
    from llmtools.model.moe import SparseMoeBlock

    for layer in model.model.layers:
        # A MoE layer's experts see a different number of tokens every step: compiled for any size at
        # once rather than once per size seen first.
        layer.compile(dynamic=True if isinstance(layer.mlp, SparseMoeBlock) else None)
    return len(model.model.layers)


def build_model(plan: TrainPlan):
    import torch

    from llmtools.model import LlamaForCausalLM

    torch.manual_seed(plan.config.training.seed)
    model = LlamaForCausalLM(plan.model_config)
    model.gradient_checkpointing = plan.config.training.activation_checkpointing
    init_from = plan.config.model.init_from
    if init_from:
        from llmtools.ckpt.init_from import load_init_weights  # an HF folder or one of our checkpoints

        # checks the folder's shape against ours, names every mismatch; says when it merges adapters
        merged = load_init_weights(model, init_from)
        if merged is not None:
            log0(merged, int(os.environ.get("RANK", "0")))
    # LoRA freezes the base and adds adapters: after init_from, so they sit on its weights.
    if plan.config.lora is not None:
        from llmtools.model.lora import apply_lora

        counts = apply_lora(model, plan.config.lora)
        log0(
            f"lora: {counts['trainable']:,} trainable adapter parameters on {counts['modules']} projections; "
            f"{counts['frozen']:,} base parameters frozen",
            int(os.environ.get("RANK", "0")),
        )
    if plan.config.training.compile:  # last: the layers are compiled with their adapters in place
        compile_layers(model)
    return model


def build_engine(plan: TrainPlan, model, device: str):
    """AdamW with no decay on norms and biases (or the config's optimizer, or the DeepSpeed config's), the
    LR schedule, and ``deepspeed.initialize`` over the process group made by ``init_distributed``. Muon
    then learns where DeepSpeed's flat partitions cut its matrices (:mod:`~llmtools.train.optim`)."""
    from llmtools.thirdparty import import_deepspeed

    deepspeed = import_deepspeed()
    import torch

    from llmtools.train.schedule import build_lr_scheduler

    cfg = plan.config
    if cfg.optimizer.name == "muon":  # hidden matrices apart: Muon's, the rest AdamW's
        from llmtools.train.optim import muon_param_groups

        groups = muon_param_groups(model, cfg.optimizer.weight_decay)
    else:
        groups = param_groups(model, cfg.optimizer.weight_decay, named=cfg.model.expert_parallel is not None)
    optimizer = scheduler = None
    if "optimizer" not in plan.ds_config and cfg.optimizer.name != "adamw":
        from llmtools.train.optim import allow_in_deepspeed, build_optimizer

        optimizer = build_optimizer(cfg.optimizer, groups, device)
        allow_in_deepspeed(plan.ds_config, cfg.optimizer.name)
    elif "optimizer" not in plan.ds_config:
        betas = tuple(cfg.optimizer.betas)
        kwargs = {"fused": True} if device_choices(plan, device).fused_adamw else {"foreach": False}
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
    mpu = None
    if cfg.parallel.sequence > 1:  # DeepSpeed's Ulysses groups, and the head exchange in every attention
        from deepspeed import comm

        from llmtools.model.sequence_parallel import enable_sequence_parallel
        from llmtools.train.sequence import start_sequence_parallel

        comm.init_distributed(dist_backend=torch.distributed.get_backend(), dist_init_required=False)
        mpu, plan.task.sequence = start_sequence_parallel(cfg.parallel.sequence)
        enable_sequence_parallel(model, plan.task.sequence.group, cfg.parallel.sequence)
    if cfg.parallel.tensor > 1:
        # DeepSpeed's (data, tensor) mesh made first and handed over as the mpu, so that its config counts
        # the data-parallel ranks (not every rank) in train_batch_size; AutoTP then shards the model.
        from deepspeed import comm
        from deepspeed.utils import groups

        comm.init_distributed(dist_backend=torch.distributed.get_backend(), dist_init_required=False)
        groups._init_tp_mesh_device(tensor_model_parallel_size=cfg.parallel.tensor)
        mpu = groups
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=groups if optimizer is None else None,
        optimizer=optimizer,
        lr_scheduler=scheduler,
        config=plan.ds_config,
        dist_init_required=False,
        mpu=mpu,
    )
    if cfg.parallel.tensor > 1:
        from llmtools.train.tensor import sum_per_head_gradients

        sum_per_head_gradients(engine.module, cfg.parallel.tensor)
    if hasattr(engine.basic_optimizer, "bind_partitions"):
        # Muon orthogonalizes whole matrices: learn where DeepSpeed's flat partitions cut them.
        engine.basic_optimizer.bind_partitions(engine.module)
    if cfg.model.expert_parallel is not None:
        # DeepSpeed swapped our MoE blocks for its expert-parallel layer: have it report its router as ours does.
        from llmtools.train.moe import tap_expert_parallel_routers

        if not tap_expert_parallel_routers(engine.module, plan.model_config):
            raise RuntimeError("model.expert_parallel: DeepSpeed replaced no MoE block (AutoEP found none)")
    return engine


def check_fp16_support(where: str) -> None:
    """fp16 needs a device with fp16 arithmetic: DeepSpeed's CPU accelerator has it only where oneDNN
    does (AVX512-FP16 / AMX-FP16 CPUs). Refused here, before the model is built, in one line."""
    from llmtools.thirdparty import import_deepspeed

    import_deepspeed()
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    if not accelerator.is_fp16_supported():
        raise InputError(
            f"{where}: training.precision=fp16: DeepSpeed's {accelerator.device_name()} accelerator has no fp16 "
            "on this machine; use bf16 or fp32 here (fp16 is for GPUs without bf16)"
        )


def coalesce_reductions(engine, grad_accumulation: int, world: int) -> bool:
    """Whether to reduce gradients once per step instead of after every micro-batch.

    DeepSpeed's ZeRO-2 reduces (flattens, all-reduces, copies into the partition) after every backward
    (ZeRO-1 at the accumulation boundary only); with one rank that is pure overhead (8.5-17% of a
    tiny-model step at ZeRO-2 on 2 CPU cores). There, and only there, the micro-batches run inside
    ``engine.coalesce_grad_reduction()`` (one reduction at the boundary) with DeepSpeed's manual boundary
    (``set_gradient_accumulation_boundary``: False during the micro-batches, True for the one
    ``step()``); ZeRO-1 takes the same path, which costs it nothing. With several ranks, ZeRO-2's point
    is to hold only a partition of the gradients between micro-batches, so DeepSpeed's per-micro-batch
    reduction is kept. ``LLMTOOLS_COALESCE=0`` turns this off (for comparisons).
    """
    if os.environ.get("LLMTOOLS_COALESCE", "1") == "0" or world != 1 or grad_accumulation == 1:
        return False
    if getattr(engine, "has_moe_layers", False):  # expert groups: DeepSpeed's own reduction path
        return False
    if engine.zero_optimization_stage() not in (1, 2) or not hasattr(
        engine.optimizer, "_coalesce_grad_reduction"
    ):
        return False  # stage 0, 3 (its own partitioned path), or an optimizer wrapper (bf16 at stage 0)
    return True


def grad_norm_of(module) -> float:
    import torch

    total = torch.zeros((), dtype=torch.float64)
    for param in module.parameters():
        if param.grad is not None:
            total += param.grad.detach().double().pow(2).sum().cpu()
    return float(total.sqrt())


def release_engine(engine) -> None:
    """Free what DeepSpeed allocated for an engine once its run is over.

    DeepSpeed keeps every engine reachable from module-level registries (ZeRO-3's stack of forward modules,
    its parameter coordinator's caches, the hooks left on the model), so an engine that goes out of scope is
    never collected: a ZeRO-3 engine keeps ~2 GB of gradient buckets (`reduce_bucket_size` elements) for the
    life of the process. A program that trains twice, and a test process that forks after training
    in-process, would carry every earlier run's buffers. `destroy()` frees the buffers and removes the hooks;
    dropping the model from that stack lets the rest go."""
    try:
        engine.destroy()
    finally:
        for hook_name in ("module_forward_pre_hook", "module_forward_post_hook"):
            hook = getattr(engine, hook_name, None)
            if hook is not None:
                hook.remove()
        offload = sys.modules.get("deepspeed.runtime.zero.parameter_offload")
        stack = getattr(offload, "FWD_MODULE_STACK", None)
        if isinstance(stack, list):
            stack[:] = [module for module in stack if module is not engine.module]
