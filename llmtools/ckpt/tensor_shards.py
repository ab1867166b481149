"""Checkpoints of tensor-parallel runs (DeepSpeed AutoTP): one shard per rank of a tensor-parallel group,
put back together one parameter at a time.

DeepSpeed saves shard ``m`` of every sharded weight in ``mp_rank_MM_model_states.pt`` and its ZeRO
partitions in ``zero_pp_rank_R_mp_rank_MM_optim_states.pt``; each shard's files read like a checkpoint
without tensor parallelism (:class:`~llmtools.ckpt.reader.CheckpointReader` with ``mp_rank=m``). meta.json's
``tensor_parallel`` says how they fit::

    "tensor_parallel": {"degree": 2, "split_dims": {"model.layers.0.self_attn.q_proj.weight": 0, ...},
                        "shapes": {"model.layers.0.self_attn.q_proj.weight": [96, 96], ...}}

A weight named in ``split_dims`` is its shards end to end along that dimension, in shard order (DeepSpeed's
``LinearLayer`` cuts the output rows, dimension 0; ``LinearAllreduce`` the input columns, dimension 1), and
``shapes`` is the whole weight's shape; every other parameter is whole in every shard and read from shard
0. The record is untrusted like the rest of meta.json: checked before a byte is read.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from llmtools.ckpt.meta import TensorLayout, parse_tensor_layout, tensor_layout
from llmtools.errors import InputError

# How DeepSpeed's AutoTP layers cut their weight: class name -> the dimension of the weight that is split.
SPLIT_LAYERS = {"LinearLayer": 0, "LinearAllreduce": 1}


def split_dims(module) -> dict[str, int]:
    """``{parameter name: dimension it is split along}`` for the AutoTP-sharded weights of ``module``."""
    dims = {}
    for name, child in module.named_modules():
        dim = SPLIT_LAYERS.get(type(child).__name__)
        if dim is None or not type(child).__module__.startswith("deepspeed"):
            continue
        for pname, _ in child.named_parameters(recurse=False):
            if pname == "weight":
                dims[f"{name}.{pname}" if name else pname] = dim
    return dims


def describe(module, degree: int, group) -> dict[str, Any]:
    """meta.json's ``tensor_parallel`` for this rank's sharded ``module``: every rank of the tensor-parallel
    ``group`` calls it (its shard sizes are gathered, so uneven shards are recorded as they are)."""
    import torch.distributed as dist

    dims = split_dims(module)
    params = dict(module.named_parameters())
    local = {name: int(params[name].shape[dim]) for name, dim in dims.items()}
    sizes: list[dict[str, int] | None] = [None] * degree
    dist.all_gather_object(sizes, local, group=group)
    shapes = {}
    for name, dim in dims.items():
        shape = list(params[name].shape)
        shape[dim] = sum(int(s[name]) for s in sizes)  # type: ignore[index]
        shapes[name] = shape
    return {"degree": degree, "split_dims": dims, "shapes": shapes}


def degree(meta: dict[str, Any] | None) -> int:
    """The tensor-parallel degree a checkpoint was saved with (1 when meta.json records none)."""
    found = tensor_layout(meta)
    return 1 if found is None else found.degree


def check_same_replicas(meta: dict[str, Any], where: Path, saved: int, now: int) -> None:
    """A tensor-parallel checkpoint resumes on as many data-parallel replicas as it was saved with (its
    ZeRO state is not resharded)."""
    n = degree(meta)
    if n > 1 and saved != now:
        raise InputError(
            f"{where}: a tensor-parallel checkpoint (degree {n}) saved over {saved} data-parallel rank(s), now "
            f"{now}: resume on the same ranks, or convert it (llm-ckpt convert --to hf) and start a new run from it"
        )


def _checked(record: Any, where: str) -> tuple[int, dict[str, int], dict[str, tuple[int, ...]]]:
    found = record if isinstance(record, TensorLayout) else parse_tensor_layout(record, where)
    if found is None:
        raise InputError(f"{where}: not an object")
    return found.degree, found.split_dims, found.shapes


class Joined:
    """A sharded weight as one lazy tensor: its shards' sources, concatenated along ``dim`` on ``load()``
    (one whole weight in memory at a time, as the converter writes it)."""

    def __init__(self, name: str, parts: list, dim: int, shape: tuple[int, ...]) -> None:
        self.name, self.parts, self.dim, self.shape = name, parts, dim, tuple(shape)
        self.dtype = parts[0].dtype

    def load(self):
        import torch

        return torch.cat([part.load() for part in self.parts], dim=self.dim)


def join(shards: list[dict[str, Any]], record: Any, where: str) -> dict[str, Any]:
    """The whole model's sources from each shard's (``shards[m]``: name -> source of shard ``m``)."""
    n, dims, shapes = _checked(record, where)
    if len(shards) != n:
        raise InputError(f"{where}: degree {n}, but the checkpoint holds {len(shards)} shard(s)")
    first = shards[0]
    for m, shard in enumerate(shards[1:], start=1):
        if set(shard) != set(first):
            odd = sorted(set(shard) ^ set(first))[0]
            raise InputError(f"{where}: shard {m} and shard 0 hold different parameters ({odd})")
    out: dict[str, Any] = {}
    for name, source in first.items():
        if name not in dims:
            for m, shard in enumerate(shards[1:], start=1):
                if tuple(shard[name].shape) != tuple(source.shape):
                    raise InputError(
                        f"{where}[{name}]: whole in every shard, but shard {m} has another shape"
                    )
            out[name] = source
            continue
        dim, shape = dims[name], shapes[name]
        parts = [shard[name] for shard in shards]
        for m, part in enumerate(parts):
            other = [s for i, s in enumerate(part.shape) if i != dim]
            if len(part.shape) != len(shape) or other != [s for i, s in enumerate(shape) if i != dim]:
                raise InputError(
                    f"{where}[{name}]: shard {m} has shape {tuple(part.shape)}, the whole is {shape}"
                )
        if sum(part.shape[dim] for part in parts) != shape[dim]:
            raise InputError(f"{where}[{name}]: the shards do not add up to the recorded shape {shape}")
        out[name] = Joined(name, parts, dim, shape)
    missing = sorted(set(dims) - set(first))
    if missing:
        raise InputError(f"{where}[{missing[0]}]: recorded as sharded, but no shard holds it")
    return out


@contextlib.contextmanager
def joined_sources(checkpoint: Path, meta: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The fp32 parameters of a tensor-parallel checkpoint, each whole, as lazy sources."""
    from llmtools.ckpt.reader import CheckpointReader

    where = f"{checkpoint / 'meta.json'}[tensor_parallel]"
    found = tensor_layout(meta)
    if found is None:
        raise InputError(f"{where}: missing (not a tensor-parallel checkpoint)")
    with contextlib.ExitStack() as stack:
        readers = [stack.enter_context(CheckpointReader(checkpoint, mp_rank=m)) for m in range(found.degree)]
        yield join([reader.sources(include_buffers=False) for reader in readers], found, where)


def whole_parameters(shapes: dict[str, list[int]], meta: dict[str, Any]) -> int:
    """The number of parameters of the whole model, from shard 0's shapes and the record."""
    whole: dict[str, Any] = dict(shapes)
    found = tensor_layout(meta)
    whole.update(found.shapes if found is not None else {})
    return sum(math.prod(int(s) for s in shape) for shape in whole.values())


__all__ = [
    "SPLIT_LAYERS",
    "split_dims",
    "describe",
    "degree",
    "check_same_replicas",
    "join",
    "joined_sources",
    "whole_parameters",
]
