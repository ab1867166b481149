"""Sequence parallelism (``parallel.sequence: N``, DeepSpeed-Ulysses) in the trainer.

Ranks ``[g*N, (g+1)*N)`` form sequence-parallel group ``g``: they read the same samples (data-parallel
rank ``g`` of ``world/N``) and each keeps the ``r``-th t/N slice of every sequence. DeepSpeed's own
groups are made by ``deepspeed.runtime.sequence_parallel.parallel_state_sp`` and handed to
``deepspeed.initialize`` as its ``mpu``: ZeRO then partitions over every rank and averages gradients
over the data-parallel replicas only (it sums the group's shares), and the model's attention layers
exchange heads with DeepSpeed's ``DistributedAttention`` (:mod:`llmtools.model.sequence_parallel`).

The loss of a micro-batch is the mean over the whole rows, so each rank contributes its share
``sum(its tokens' losses) / (tokens of the whole rows)``; what it reports is N times that share, whose
mean over the ranks is the step's loss exactly as without sequence parallelism.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmtools.errors import InputError

SUPPORTED_TASKS = ("pretrain",)


def check_sequence_parallel(config, model_config, world_size: int, seq_length: int, where: str) -> None:
    """Refuse, in one line, what sequence parallelism of this degree cannot run."""
    n = config.parallel.sequence
    if n == 1:
        return
    key = f"{where}: parallel.sequence={n}"
    check_group(key, n, world_size, model_config, "DeepSpeed-Ulysses hands each rank whole heads")
    if seq_length % n:
        raise InputError(
            f"{key}: does not divide seq_length {seq_length} (each rank holds seq_length/N tokens)"
        )
    if config.task not in SUPPORTED_TASKS:
        raise InputError(f"{key}: not supported with task {config.task} (pretraining only so far)")
    if model_config.num_experts:
        raise InputError(
            f"{key}: not supported with a MoE model: the router's load-balancing loss would be computed "
            "over each rank's part of the tokens, not the whole batch, and the run would differ from N=1"
        )
    if config.lora is not None:
        raise InputError(f"{key}: not supported with LoRA (not tested together)")
    if config.eval.per_source or config.eval.tasks:
        raise InputError(
            f"{key}: not supported with eval.per_source or eval.tasks (they score whole rows on each rank, "
            "and a rank holds 1/N of each row)"
        )


def check_group(key: str, n: int, world_size: int, model_config, why_heads: str) -> None:
    """What every group of N ranks sharing a sample needs (a sequence- or tensor-parallel group): N
    divides the world size, and the attention and key/value heads (each rank keeps whole heads)."""
    if world_size % n:
        raise InputError(f"{key}: does not divide the world size {world_size} (start N x replicas ranks)")
    heads, kv = model_config.num_attention_heads, model_config.num_key_value_heads
    if heads % n or kv % n:
        raise InputError(
            f"{key}: the model's {heads} attention heads and {kv} key/value heads must both divide by it "
            f"({why_heads})"
        )


def zero3_reduction(ds_config: dict, ds_source: str) -> None:
    """Under ZeRO-3, have DeepSpeed reduce gradients through its all-reduce path.

    DeepSpeed 0.19.8's ZeRO-3 reduce-scatter path (``stage3.py``, ``__avg_scatter_grads``) averages over
    every rank of the sequence x data grid, while its all-reduce path (``__avg_scatter_contiguous_grads``)
    and ZeRO-1/2 average over the data-parallel replicas only, summing a sequence-parallel group's
    shares: with reduce-scatter the gradients come out N times too small. The all-reduce path is taken
    with ``contiguous_gradients: true`` and ``reduce_scatter: false``; a config that asks for
    reduce-scatter is refused.
    """
    zero = ds_config.get("zero_optimization")
    if not isinstance(zero, dict) or zero.get("stage") != 3:
        return
    if zero.get("reduce_scatter") is True:
        raise InputError(
            f"{ds_source}[zero_optimization][reduce_scatter]: true is not supported with parallel.sequence > 1 "
            "at ZeRO-3 (DeepSpeed's reduce-scatter path averages the sequence-parallel shares instead of "
            "summing them); leave it out"
        )
    zero["reduce_scatter"] = False
    zero["contiguous_gradients"] = True


@dataclass
class SequenceSlice:
    """This rank's place in its sequence-parallel group."""

    size: int
    rank: int
    group: object  # the torch.distributed group of the N ranks

    def local(self, x):
        """This rank's slice of (b, t, ...) along t."""
        part = x.shape[1] // self.size
        return x[:, self.rank * part : (self.rank + 1) * part]

    def share(self, token_losses, mask=None):
        """The rank's loss for backward and report: sum over its tokens / the rows' token count, with the
        value N x that (the group's ranks average to the whole rows' loss) and the gradient of the share
        (DeepSpeed sums the group's gradients)."""
        import torch
        import torch.distributed as dist

        weights = torch.ones_like(token_losses) if mask is None else mask.to(token_losses.dtype)
        count = weights.sum().detach().clone()
        dist.all_reduce(count, group=self.group)
        share = (token_losses * weights).sum() / count.clamp(min=1.0)
        return share + (share * (self.size - 1)).detach()


def start_sequence_parallel(size: int):
    """Make DeepSpeed's sequence-parallel groups; returns (the mpu for deepspeed.initialize, this rank's slice)."""
    from deepspeed.runtime.sequence_parallel import parallel_state_sp

    parallel_state_sp.initialize_sequence_parallel(size)
    group = parallel_state_sp.get_sequence_parallel_group()
    return parallel_state_sp, SequenceSlice(size, parallel_state_sp.get_sequence_parallel_rank(), group)


__all__ = [
    "check_group",
    "check_sequence_parallel",
    "start_sequence_parallel",
    "zero3_reduction",
    "SequenceSlice",
]
