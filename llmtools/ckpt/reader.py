"""Read the fp32 weights out of a DeepSpeed checkpoint folder, one tensor at a time.

Where the weights are, by ZeRO stage (what ``zero_to_fp32`` reconstructs, without loading whole files):

* stage 0 (fp32): ``mp_rank_00_model_states.pt`` holds the full module state dict;
* stages 1-2 (and bf16 without ZeRO): each ``*zero_pp_rank_R_mp_rank_00_optim_states.pt`` holds rank R's
  slice of every parameter group's flat fp32 vector (``single_partition_of_fp32_groups``); a group's
  vector is the ranks' slices end to end, and parameters lie in it one after another in
  ``param_shapes`` order (plus ``param_alignment_paddings`` when recorded);
* stage 3: each rank holds ``ceil(numel / world)`` elements of *every* parameter
  (``fp32_flat_groups``, parameters in ``param_shapes`` order); a parameter is the ranks' pieces end to
  end, cut to its size.

Tensors are :class:`~llmtools.model.hf.TensorSource`-compatible: shape, dtype, and ``load()`` that reads
just the bytes of that parameter (see :mod:`llmtools.ckpt.torchfile`).
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmtools.ckpt import layout
from llmtools.ckpt.torchfile import LazyTensor, load_lazy
from llmtools.errors import InputError

_OPTIM_RE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d\d)_optim_states\.pt$")


@dataclass(frozen=True)
class Source:
    """A tensor known by name, shape and dtype; ``load()`` reads it (duck-types hf.TensorSource)."""

    shape: tuple[int, ...]
    dtype: Any
    reader: CheckpointReader
    pieces: tuple[tuple[int, int, int, int], ...]  # (file index, tensor index, start, count)

    def load(self):
        import torch

        parts = [self.reader._read(f, t, s, c) for f, t, s, c in self.pieces]
        flat = parts[0] if len(parts) == 1 else torch.cat(parts)
        numel = math.prod(self.shape)
        return flat[:numel].view(self.shape) if flat.numel() != numel else flat.view(self.shape)

    def slice(self, offset: int, count: int, shape: tuple[int, ...]) -> Source:
        """Elements ``[offset, offset + count)`` of the flattened tensor as a source of ``shape``: one
        expert of a fused expert tensor is read without reading the others."""
        if offset < 0 or count != math.prod(shape) or offset + count > math.prod(self.shape):
            raise ValueError(f"slice [{offset}, {offset + count}) of {self.shape} as {shape}")
        pieces, at = [], 0
        for f, t, start, length in self.pieces:
            lo, hi = max(offset, at), min(offset + count, at + length)
            if lo < hi:
                pieces.append((f, t, start + lo - at, hi - lo))
            at += length
        return Source(tuple(shape), self.dtype, self.reader, tuple(pieces))


class CheckpointReader:
    """Open a checkpoint folder; ``sources()`` maps parameter names to lazily loaded fp32 tensors.

    A tensor-parallel checkpoint is read one shard at a time (``mp_rank``; its shards are put together by
    :mod:`llmtools.ckpt.tensor_shards`); without ``mp_rank`` such a checkpoint is refused."""

    def __init__(self, path: str | Path, mp_rank: int | None = None) -> None:
        self.path = Path(path)
        model_states = layout.model_states_file(self.path, mp_rank or 0)
        if not model_states.is_file():
            if (self.path / layout.CHECKPOINTS).is_dir() or layout.read_latest(self.path):
                raise InputError(f"{self.path}: a run or checkpoints folder; name one checkpoint (step_...)")
            raise InputError(f"{model_states}: missing (not a DeepSpeed checkpoint folder)")
        if mp_rank is None and any(self.path.glob("*mp_rank_01_model_states.pt")):
            raise InputError(
                f"{self.path}: a tensor-parallel checkpoint (mp_rank_01): read its shards together "
                "(llm-ckpt convert does)"
            )
        self.model_states_path = model_states
        self.model_states = load_lazy(model_states)
        optim = []
        for child in self.path.iterdir():
            match = _OPTIM_RE.match(child.name)
            if match and int(match.group(2)) == (mp_rank or 0):
                optim.append((int(match.group(1)), child))
        optim.sort()
        self.optim_files = [p for _, p in optim]
        self.optim_states = [load_lazy(p)["optimizer_state_dict"] for p in self.optim_files]
        self._files: list[Path] = [model_states, *self.optim_files]
        self._tensors: list[list[LazyTensor]] = []  # per file: flat tensors referenced by Source.pieces
        self._handles: dict[int, Any] = {}
        self.kind = self._detect()

    # --------------------------------------------------------------- what is inside
    def _detect(self) -> str:
        if self.optim_states:
            first = self.optim_states[0]
            if "fp32_flat_groups" in first:
                return "zero3"
            if "single_partition_of_fp32_groups" in first:
                return "partitioned"
            raise InputError(f"{self.optim_files[0]}: no fp32 master weights found in the optimizer state")
        if isinstance(self.model_states.get("module"), dict):
            return "module"
        raise InputError(f"{self.model_states_path}: no module weights and no ZeRO optimizer files")

    @property
    def world_size(self) -> int:
        return max(1, len(self.optim_files))

    @property
    def zero_stage(self) -> int:
        if self.optim_states:
            stage = self.optim_states[0].get("zero_stage")
            if isinstance(stage, int):
                return int(stage)
            return 3 if self.kind == "zero3" else 1
        return 0

    def param_shapes(self) -> OrderedDict[str, tuple[int, ...]]:
        shapes: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        for group in self.model_states.get("param_shapes") or []:
            for name, shape in group.items():
                shapes[name] = tuple(int(s) for s in shape)
        if not shapes:  # stage 0: the module state dict is the truth
            for name, tensor in (self.model_states.get("module") or {}).items():
                if isinstance(tensor, LazyTensor):
                    shapes[name] = tensor.shape
        return shapes

    def buffer_names(self) -> list[str]:
        return list(self.model_states.get("buffer_names") or [])

    def shared_params(self) -> dict[str, str]:
        return dict(self.model_states.get("shared_params") or {})

    # --------------------------------------------------------------- tensors
    def _register(self, tensors: list[LazyTensor]) -> int:
        self._tensors.append(tensors)
        return len(self._tensors) - 1

    def _read(self, group: int, index: int, start: int, count: int):
        tensor = self._tensors[group][index]
        path = tensor.storage.path
        key = str(path)
        handle = self._handles.get(key)
        if handle is None:
            handle = self._handles[key] = open(path, "rb")  # noqa: SIM115 - closed in close()
        return tensor.read_flat(start, count, handle=handle)

    def sources(self, include_buffers: bool = True) -> OrderedDict[str, Source]:
        """Every parameter (and buffer), shared parameters included under both names, as fp32 sources."""
        import torch

        shapes = self.param_shapes()
        out: OrderedDict[str, Source] = OrderedDict()
        if self.kind == "module":
            module = self.model_states["module"]
            names = [n for n in module if isinstance(module[n], LazyTensor)]
            group = self._register([module[n] for n in names])
            for i, name in enumerate(names):
                if name in self.buffer_names() and not include_buffers:
                    continue
                t = module[name]
                out[name] = Source(t.shape, t.dtype, self, ((group, i, 0, t.numel()),))
            return out
        frozen = self.model_states.get("frozen_param_shapes") or {}
        if frozen:
            raise InputError(
                f"{self.model_states_path}: frozen parameters are not supported by conversion yet"
            )
        if self.kind == "partitioned":
            self._partitioned(out, torch.float32)
        else:
            self._zero3(shapes, out, torch.float32)
        for name, target in self.shared_params().items():
            if target in out:
                out[name] = out[target]
        if include_buffers:
            module = self.model_states.get("module") or {}
            names = [n for n in self.buffer_names() if isinstance(module.get(n), LazyTensor)]
            if names:
                group = self._register([module[n] for n in names])
                for i, name in enumerate(names):
                    t = module[name]
                    out[name] = Source(t.shape, t.dtype, self, ((group, i, 0, t.numel()),))
        return out

    def _partitioned(self, out: OrderedDict, dtype) -> None:
        per_rank = [
            self._register(list(state["single_partition_of_fp32_groups"])) for state in self.optim_states
        ]
        paddings = self.optim_states[0].get("param_alignment_paddings")
        groups = self.model_states.get("param_shapes") or []
        for g, shapes in enumerate(groups):
            part = self._tensors[per_rank[0]][g].numel()
            offset = 0
            for i, (name, shape) in enumerate(shapes.items()):
                shape = tuple(int(s) for s in shape)
                numel = math.prod(shape)
                pieces, at, left = [], offset, numel
                while left > 0:
                    rank, local = divmod(at, part)
                    if rank >= len(per_rank):
                        raise InputError(
                            f"{self.optim_files[-1]}: parameter {name} runs past the last partition"
                        )
                    take = min(left, part - local)
                    pieces.append((per_rank[rank], g, local, take))
                    at += take
                    left -= take
                if not pieces:
                    pieces.append((per_rank[0], g, 0, 0))
                out[name] = Source(shape, dtype, self, tuple(pieces))
                offset += numel + (paddings[g][i] if paddings else 0)

    def _zero3(self, shapes: OrderedDict, out: OrderedDict, dtype) -> None:
        world = len(self.optim_states)
        per_rank = [self._register(list(state["fp32_flat_groups"])) for state in self.optim_states]
        sizes = [t.numel() for t in self._tensors[per_rank[0]]]
        starts = [sum(sizes[:g]) for g in range(len(sizes))]
        offset = 0
        for name, shape in shapes.items():
            numel = math.prod(shape)
            chunk = math.ceil(numel / world)
            pieces = []
            for rank in range(world):
                at, left = offset, chunk
                while left > 0:
                    g = max(i for i, s in enumerate(starts) if s <= at)
                    local = at - starts[g]
                    take = min(left, sizes[g] - local)
                    if take <= 0:
                        raise InputError(
                            f"{self.optim_files[rank]}: parameter {name} runs past the flat groups"
                        )
                    pieces.append((per_rank[rank], g, local, take))
                    at += take
                    left -= take
            out[name] = Source(shape, dtype, self, tuple(pieces))
            offset += chunk

    # --------------------------------------------------------------- summary (llm-ckpt inspect)
    def optimizer_summary(self) -> dict[str, Any]:
        """Names and sizes of the optimizer state kept per parameter (no tensor data is read)."""
        summary: dict[str, Any] = {"files": len(self.optim_files), "kind": self.kind}
        if self.optim_states:
            base = self.optim_states[0].get("base_optimizer_state") or self.optim_states[0].get(
                "optimizer_state_dict"
            )
        else:
            base = self.model_states.get("optimizer")
        states: dict[str, int] = {}
        if isinstance(base, dict):
            items = base.get("state", {})
            values = items.values() if isinstance(items, dict) else items
            for entry in values:
                if isinstance(entry, dict):
                    for key, value in entry.items():
                        if isinstance(value, LazyTensor):
                            states[key] = states.get(key, 0) + value.numel()
            groups = base.get("param_groups") or []
            if groups:
                summary["param_groups"] = [
                    {k: v for k, v in g.items() if k in ("lr", "betas", "eps", "weight_decay")}
                    for g in groups
                ]
        summary["state_numel_rank0"] = states
        return summary

    def close(self) -> None:
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()
