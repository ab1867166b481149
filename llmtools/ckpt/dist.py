"""The little of torch.distributed the checkpoint code needs, harmless when it is not initialized."""

from __future__ import annotations

from typing import Any


def _initialized() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    if not _initialized():
        return 0
    import torch.distributed as dist

    return dist.get_rank()


def world_size() -> int:
    if not _initialized():
        return 1
    import torch.distributed as dist

    return dist.get_world_size()


def barrier() -> None:
    if _initialized() and world_size() > 1:
        import torch.distributed as dist

        dist.barrier()


def broadcast(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (a picklable object)."""
    if not _initialized() or world_size() == 1:
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _flag(flag: bool):
    """A one-element tensor where the backend can reduce it (NCCL reduces only CUDA tensors)."""
    import torch
    import torch.distributed as dist

    device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
    return torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)


def any_rank(flag: bool) -> bool:
    """True on every rank when it is true on at least one."""
    if not _initialized() or world_size() == 1:
        return flag
    import torch.distributed as dist

    tensor = _flag(flag)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())


def all_ranks(flag: bool) -> bool:
    """True on every rank when it is true on all of them."""
    if not _initialized() or world_size() == 1:
        return flag
    import torch.distributed as dist

    tensor = _flag(flag)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return bool(tensor.item())


def gather(value: Any) -> list[Any] | None:
    """Every rank's ``value`` (picklable) as a list on rank 0; None on the others."""
    if not _initialized() or world_size() == 1:
        return [value]
    import torch.distributed as dist

    out: list[Any] | None = [None] * world_size() if rank() == 0 else None
    dist.gather_object(value, out, dst=0)
    return out
