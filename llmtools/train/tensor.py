"""Tensor parallelism (``parallel.tensor: N``, DeepSpeed AutoTP training) in the trainer.

Ranks ``[g*N, (g+1)*N)`` form tensor-parallel group ``g`` (DeepSpeed's (data, tensor) device mesh): they
read the same samples (data-parallel rank ``g`` of ``world/N``). ``deepspeed.initialize`` with
``tensor_parallel.autotp_size: N`` swaps every attention and MLP projection for DeepSpeed's sharded
layers: q/k/v, gate and up keep 1/N of their output rows (``LinearLayer``), o and down 1/N of their input
columns and all-reduce their output (``LinearAllreduce``); embeddings, norms and the LM head stay whole on
every rank. ZeRO then partitions over the data-parallel ranks of each shard.

A checkpoint holds one ``mp_rank_NN_model_states.pt`` (and ZeRO files) per shard; meta.json's
``tensor_parallel`` names the degree and the dimension each sharded parameter is cut along, which is what
``llm-ckpt convert`` needs to put the shards back together (:mod:`llmtools.ckpt.tensor_shards`).
"""

from __future__ import annotations

from llmtools.errors import InputError
from llmtools.train.sequence import check_group

SUPPORTED_TASKS = ("pretrain",)
SUPPORTED_STAGES = (1, 2)


def check_tensor_parallel(config, model_config, world_size: int, where: str) -> None:
    """Refuse, in one line, what tensor parallelism of this degree cannot run."""
    n = config.parallel.tensor
    if n == 1:
        return
    key = f"{where}: parallel.tensor={n}"
    check_group(key, n, world_size, model_config, "AutoTP gives each rank whole heads")
    if config.parallel.sequence > 1:
        raise InputError(f"{key}: not supported together with parallel.sequence (not tested together)")
    if config.task not in SUPPORTED_TASKS:
        raise InputError(f"{key}: not supported with task {config.task} (pretraining only so far)")
    if model_config.num_experts:
        raise InputError(f"{key}: not supported with a MoE model (AutoTP shards dense projections only)")
    if config.lora is not None:
        raise InputError(f"{key}: not supported with LoRA (not tested together)")
    if config.optimizer.name == "muon":
        raise InputError(
            f"{key}: not supported with optimizer muon (it orthogonalizes whole matrices; a rank holds 1/{n})"
        )


def plan_tensor_parallel(config, ds_config: dict, ds_source: str) -> None:
    """Ask DeepSpeed for AutoTP of the configured degree; refuse a ZeRO stage it is not run with, or a
    DeepSpeed config that asks for another degree."""
    n = config.parallel.tensor
    own = ds_config.get("tensor_parallel")
    if n == 1:
        if isinstance(own, dict) and own.get("autotp_size") not in (None, 0, 1):
            raise InputError(
                f"{ds_source}[tensor_parallel]: set parallel.tensor in the train config instead (llm-train "
                "keeps the data, checkpoints and conversion in step with it)"
            )
        return
    stage = int((ds_config.get("zero_optimization") or {}).get("stage") or 0)
    if stage not in SUPPORTED_STAGES:
        raise InputError(
            f"{ds_source}[zero_optimization][stage]: {stage} with parallel.tensor={n}: tensor parallelism runs "
            f"with ZeRO-{' or ZeRO-'.join(map(str, SUPPORTED_STAGES))}"
        )
    if isinstance(own, dict) and own.get("autotp_size") not in (None, n):
        raise InputError(
            f"{ds_source}[tensor_parallel][autotp_size]: {own.get('autotp_size')}, the train config says "
            f"parallel.tensor={n}; leave it out"
        )
    ds_config["tensor_parallel"] = {**(own if isinstance(own, dict) else {}), "autotp_size": n}


# Weights kept whole on every rank that act on one rank's heads only: Qwen3's per-head query/key norms.
# Each rank's gradient of them is its heads' part; the whole gradient is the group's sum.
PER_HEAD_WEIGHTS = (".self_attn.q_norm.weight", ".self_attn.k_norm.weight")


def sum_per_head_gradients(module, degree: int) -> int:
    """Have the gradient of every weight in :data:`PER_HEAD_WEIGHTS` summed over the tensor-parallel
    group as it is computed (a hook on the parameter, before DeepSpeed accumulates or reduces it):
    AutoTP keeps these whole and would otherwise update each rank's copy with its heads' part alone.
    Returns how many weights were hooked."""
    if degree == 1:
        return 0
    import torch.distributed as dist
    from deepspeed.utils import groups

    group = groups.get_tensor_model_parallel_group()

    def summed(grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=group)
        return grad

    hooked = 0
    for name, param in module.named_parameters():
        if name.endswith(PER_HEAD_WEIGHTS) and param.requires_grad:
            param.register_hook(summed)
            hooked += 1
    return hooked


def tensor_layout(engine, degree: int) -> dict | None:
    """meta.json's ``tensor_parallel`` record of a built engine (None without tensor parallelism); every
    rank calls it once, after ``deepspeed.initialize``."""
    if degree == 1:
        return None
    from deepspeed.utils import groups

    from llmtools.ckpt.tensor_shards import describe

    return describe(engine.module, degree, groups.get_tensor_model_parallel_group())


__all__ = ["check_tensor_parallel", "plan_tensor_parallel", "sum_per_head_gradients", "tensor_layout"]
