"""Tensor names and layouts of transformers' models: in memory (ours, equal to transformers 5's
``state_dict()``) and in a saved folder (what ``save_pretrained`` writes).

The two differ for the mixture-of-experts families only. transformers 5 holds each layer's experts fused
(``mlp.experts.gate_up_proj`` (E, 2I, H) and ``mlp.experts.down_proj`` (E, H, I)), but its
``save_pretrained`` reverts that on write (``save_original_format=True``, the default) to the layout
transformers 4, vLLM and the published checkpoints use, one tensor per expert::

    qwen3_moe / qwen2_moe   mlp.experts.{e}.gate_proj.weight (I, H)   up_proj (I, H)   down_proj (H, I)
    mixtral                 block_sparse_moe.experts.{e}.w1.weight (gate)   w3 (up)   w2 (down)
                            block_sparse_moe.gate.weight                     (the router)

:func:`to_saved_layout` splits, lazily (a checkpoint reader's tensors are sliced before they are read, so
a conversion still holds about one tensor at a time); :func:`to_memory_layout` fuses, and also accepts a
folder already in the fused layout (``save_pretrained(save_original_format=False)``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from llmtools.errors import InputError
from llmtools.model.config import ModelConfig


def parameter_names(config: ModelConfig, include_tied: bool = False) -> list[str]:
    """The model's parameter names (transformers 5's in-memory names), in state-dict order.

    ``lm_head.weight`` is left out when tied (HF does not save it) unless ``include_tied``.
    """
    names = ["model.embed_tokens.weight"]
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        names += [p + f"self_attn.{x}_proj.weight" for x in "qkvo"]
        if config.qk_norm:
            names += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
        if config.is_moe_layer(i):
            names += [p + "mlp.gate.weight", p + "mlp.experts.gate_up_proj", p + "mlp.experts.down_proj"]
            if config.shared_expert_intermediate_size:
                names += [p + f"mlp.shared_expert.{x}_proj.weight" for x in ("gate", "up", "down")]
                names.append(p + "mlp.shared_expert_gate.weight")
        else:
            names += [p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
    names.append("model.norm.weight")
    if include_tied or not config.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


def _expert_names(config: ModelConfig, layer: int, expert: int) -> tuple[str, str, str]:
    """Saved names of one expert's (gate, up, down) weights."""
    if config.model_type == "mixtral":
        p = f"model.layers.{layer}.block_sparse_moe.experts.{expert}."
        return p + "w1.weight", p + "w3.weight", p + "w2.weight"
    p = f"model.layers.{layer}.mlp.experts.{expert}."
    return p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight"


def _saved_router_name(config: ModelConfig, layer: int) -> str:
    block = "block_sparse_moe" if config.model_type == "mixtral" else "mlp"
    return f"model.layers.{layer}.{block}.gate.weight"


def saved_names(config: ModelConfig) -> list[str]:
    """The tensor names of a saved folder, in the order :func:`to_saved_layout` yields them."""
    names = []
    for name in parameter_names(config):
        names += [n for n, _ in _saved_parts(config, name)]
    return names


def _saved_parts(config: ModelConfig, name: str) -> list[tuple[str, Any]]:
    """(saved name, how to cut it out of the in-memory tensor) for one in-memory name.

    The cut is None (the whole tensor) or (expert, row start, rows) of a 3-D expert tensor."""
    match = _MOE_PARAM.match(name)
    if match is None:
        return [(name, None)]
    layer, what = int(match.group(1)), match.group(2)
    if what == "gate.weight":
        return [(_saved_router_name(config, layer), None)]
    inter, hidden = config.moe_intermediate_size, config.hidden_size
    parts = []
    for e in range(config.num_experts):
        gate, up, down = _expert_names(config, layer, e)
        if what == "experts.gate_up_proj":
            parts += [(gate, (e, 0, inter)), (up, (e, inter, inter))]
        else:
            parts.append((down, (e, 0, hidden)))
    return parts


_MOE_PARAM = re.compile(
    r"^model\.layers\.(\d+)\.mlp\.(gate\.weight|experts\.gate_up_proj|experts\.down_proj)$"
)


class ExpertSlice:
    """Rows ``[start, start + rows)`` of expert ``e`` of a 3-D tensor or lazy tensor source, loaded on demand.

    A source with ``slice(offset, count, shape)`` (the checkpoint reader's) reads only those bytes; any
    other is loaded whole once and shared by the slices cut from it (:class:`_Cached`)."""

    def __init__(self, parent: Any, expert: int, start: int, rows: int) -> None:
        self.parent, self.expert, self.start, self.rows = parent, expert, start, rows
        self.shape = (rows, *tuple(parent.shape)[2:])
        self.dtype = parent.dtype

    def load(self):
        import torch

        if isinstance(self.parent, torch.Tensor):
            return self.parent[self.expert, self.start : self.start + self.rows]
        if hasattr(self.parent, "slice"):
            width = math.prod(self.shape[1:])
            offset = (self.expert * self.parent.shape[1] + self.start) * width
            return self.parent.slice(offset, self.rows * width, self.shape).load()
        return self.parent.load()[self.expert, self.start : self.start + self.rows]


class _Cached:
    """A lazy source loaded at most once while its slices are being written (then dropped)."""

    def __init__(self, source: Any, uses: int) -> None:
        self.source, self.uses, self.tensor = source, uses, None
        self.shape, self.dtype = tuple(source.shape), source.dtype

    def load(self):
        if self.tensor is None:
            self.tensor = self.source.load()
        tensor = self.tensor
        self.uses -= 1
        if self.uses <= 0:
            self.tensor = None
        return tensor


def to_saved_layout(state: Mapping[str, Any], config: ModelConfig) -> dict[str, Any]:
    """In-memory names (tensors or lazy sources) -> the names and layout ``save_pretrained`` writes.

    Values stay lazy: expert pieces are :class:`ExpertSlice` objects (shape, dtype, load())."""
    out: dict[str, Any] = {}
    for name, value in state.items():
        parts = _saved_parts(config, name) if config.is_moe else [(name, None)]
        if len(parts) > 1 and not hasattr(value, "slice") and not _is_tensor(value):
            value = _Cached(value, len(parts))
        for saved, cut in parts:
            out[saved] = value if cut is None else ExpertSlice(value, *cut)
    return out


def to_memory_layout(state: Mapping[str, Any], config: ModelConfig, source: str) -> dict[str, Any]:
    """A saved folder's tensors -> the model's names (experts fused). Accepts both layouts."""
    if not config.is_moe:
        return dict(state)
    import torch

    out = dict(state)
    for layer in config.moe_layers():
        p = f"model.layers.{layer}."
        router = _saved_router_name(config, layer)
        if router in out and router != p + "mlp.gate.weight":
            out[p + "mlp.gate.weight"] = out.pop(router)
        if p + "mlp.experts.gate_up_proj" in out:  # already fused (transformers 5, original format off)
            continue
        gate_up, down = [], []
        for e in range(config.num_experts):
            names = _expert_names(config, layer, e)
            missing = [n for n in names if n not in out]
            if missing:
                raise InputError(f"{source}[{missing[0]}]: missing")
            g, u, d = (out.pop(n) for n in names)
            if g.shape != u.shape:
                raise InputError(
                    f"{source}[{names[1]}]: shape {tuple(u.shape)}, its gate has {tuple(g.shape)}"
                )
            gate_up.append(torch.cat([g, u], dim=0))
            down.append(d)
        shapes = {tuple(t.shape) for t in gate_up}, {tuple(t.shape) for t in down}
        if len(shapes[0]) > 1 or len(shapes[1]) > 1:
            raise InputError(f"{source}[{p}experts]: the experts do not all have the same shape")
        out[p + "mlp.experts.gate_up_proj"] = torch.stack(gate_up)
        out[p + "mlp.experts.down_proj"] = torch.stack(down)
    return out


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


__all__ = ["parameter_names", "saved_names", "to_saved_layout", "to_memory_layout", "ExpertSlice"]
