"""Mixture-of-experts in training: the router's auxiliary loss, its metrics, and expert parallelism.

* **The auxiliary loss** is part of the model's output (``forward(..., output_router=True)``:
  ``router_aux_loss_coef * load balancing + router_z_loss_coef * z-loss``). :class:`RouterLoss` is the
  model as a task sees it — a callable that returns logits — while it keeps each forward's auxiliary loss
  for the trainer to add to that micro-batch's loss, and hands the router statistics to a meter.
* **The metrics** (:class:`RouterMeter`): per MoE layer, over a logging window and all ranks, the load
  (share of the layer's token-to-expert assignments each expert got), its coefficient of variation, the
  share of assignments dropped for capacity, and the layer's own load-balancing loss; plus summary
  scalars. The fields are in ``schemas/metrics.schema.json``.
* **Expert parallelism** (``model.expert_parallel: N``) is DeepSpeed's (AutoEP, ``deepspeed.module_inject``):
  each MoE block is replaced inside ``deepspeed.initialize`` by DeepSpeed's expert-parallel layer, which
  holds ``num_experts / N`` experts per rank and exchanges tokens all-to-all within groups of N ranks; the
  expert parameters are reduced and ZeRO-partitioned within their expert-data-parallel groups (ZeRO 1-3).
  :func:`tap_expert_parallel_routers` lets that layer report its router the way our block does, so the
  auxiliary loss and the metrics are the same with and without it.
"""

from __future__ import annotations

import math
from typing import Any

from llmtools.errors import InputError

# DeepSpeed AutoEP presets for our families (the parameter layout each expects is transformers 5's).
AUTOEP_PRESETS = {"qwen3_moe": "qwen3_moe", "qwen2_moe": "qwen3_moe", "mixtral": "mixtral"}


def check_expert_parallel(model_config, expert_parallel: int | None, world_size: int, where: str) -> None:
    """Before compute: the expert-parallel size must fit the model and the data-parallel world."""
    if expert_parallel is None:
        return
    if not model_config.is_moe:
        raise InputError(
            f"{where}: model.expert_parallel: {expert_parallel} needs a MoE model (num_experts > 0)"
        )
    if expert_parallel < 1:
        raise InputError(f"{where}: model.expert_parallel: must be >= 1, got {expert_parallel}")
    if world_size % expert_parallel:
        raise InputError(
            f"{where}: model.expert_parallel: {expert_parallel} does not divide the data-parallel size "
            f"{world_size} (the ranks form groups of {expert_parallel} that share the experts out)"
        )
    if model_config.num_experts % expert_parallel:
        raise InputError(
            f"{where}: model.expert_parallel: {expert_parallel} does not divide num_experts "
            f"{model_config.num_experts} (each rank holds the same number of experts)"
        )
    if model_config.moe_capacity_factor is not None:
        raise InputError(
            f"{where}: model.moe_capacity_factor: DeepSpeed's expert-parallel layer is dropless; "
            "unset it (null) or unset model.expert_parallel"
        )


def expert_parallel_ds_config(model_config, expert_parallel: int) -> dict[str, Any]:
    """The ``expert_parallel`` section of the DeepSpeed config for ``model.expert_parallel: N``."""
    return {
        "enabled": True,
        "autoep_size": expert_parallel,
        "preset_model": AUTOEP_PRESETS[model_config.model_type],
        # Our config decides, not the preset: Qwen3-MoE's flag (Mixtral always renormalises).
        "route_norm": bool(model_config.norm_topk_prob),
        "num_experts_attr": "num_experts",
        "top_k_attr": "num_experts_per_tok",
    }


def tap_expert_parallel_routers(module, config) -> int:
    """Make every MoE block DeepSpeed replaced report its router as ours does: the replaced layer's
    output becomes ``(output, RouterInfo)``, computed from its router's logits. Returns how many."""
    # torch: imported here, not at the top, because the plan (torch-free) imports this module
    from llmtools.model.moe import SparseMoeBlock, router_info_from_logits

    tapped = 0
    for index in config.moe_layers():
        layer = module.model.layers[index]
        block = layer.mlp
        if isinstance(block, SparseMoeBlock):
            continue
        gate = getattr(getattr(block, "router", None), "gate", None)
        if gate is None:
            raise InputError(f"model.layers.{index}.mlp: an expert-parallel layer without a router gate")
        seen: list = []

        def keep_logits(_module, _inputs, output, seen=seen):
            seen.append(output)

        def report(_module, _inputs, output, seen=seen):
            if not seen or isinstance(output, tuple):
                return output
            return output, router_info_from_logits(seen.pop(), config.num_experts_per_tok)

        gate.register_forward_hook(keep_logits)
        block.register_forward_hook(report)
        tapped += 1
    return tapped


class RouterLoss:
    """The engine, called as a task calls its model (``model(inputs, **kwargs) -> logits``), that asks for
    the router's output on the way: ``take_aux()`` then gives the auxiliary loss of the forwards since the
    last call (to add to that micro-batch's loss), and the statistics go to ``meter``."""

    def __init__(self, engine, meter: RouterMeter) -> None:
        self.engine = engine
        self.meter = meter
        self._aux = None

    def __call__(self, *args, **kwargs):
        out = self.engine(*args, output_router=True, **kwargs)
        if out.aux_loss is not None:
            self._aux = out.aux_loss if self._aux is None else self._aux + out.aux_loss
            self.meter.add(out.router)
        return out.logits

    def take_aux(self):
        aux, self._aux = self._aux, None
        return aux

    def __getattr__(self, name: str):
        return getattr(self.engine, name)


class RouterMeter:
    """Router statistics of a logging window, summed on the device (no host sync per micro-batch)."""

    def __init__(self, config) -> None:
        self.layers = config.moe_layers()
        self.num_experts = config.num_experts
        self.top_k = config.num_experts_per_tok
        self.reset()

    def reset(self) -> None:
        self.counts = self.dropped = self.balance = self.z_loss = self.load_balancing = None
        self.forwards = 0

    def add(self, stats) -> None:
        parts = (stats.counts, stats.dropped, stats.balance, stats.z_loss, stats.load_balancing)
        if self.counts is None:
            self.counts, self.dropped, self.balance, self.z_loss, self.load_balancing = (
                p.clone() for p in parts
            )
        else:
            for mine, new in zip(
                (self.counts, self.dropped, self.balance, self.z_loss, self.load_balancing),
                parts,
                strict=True,
            ):
                mine += new
        self.forwards += 1

    def record(self, device) -> dict[str, Any]:
        """The window's fields for the train record (every rank must call it: one all-reduce); resets."""
        import torch
        import torch.distributed as dist

        layers, experts = len(self.layers), self.num_experts
        if self.counts is None:  # no forward this window on this rank: contribute zeros
            flat = torch.zeros(layers * experts + 3 * layers + 2, dtype=torch.float64, device=device)
        else:
            flat = torch.cat(
                [
                    self.counts.reshape(-1),
                    self.dropped,
                    self.balance,
                    self.z_loss,
                    self.load_balancing.reshape(1),
                    torch.tensor([float(self.forwards)], device=self.counts.device),
                ]
            ).to(device=device, dtype=torch.float64)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flat)
        self.reset()
        values = flat.tolist()
        counts = [values[i * experts : (i + 1) * experts] for i in range(layers)]
        at = layers * experts
        dropped, balance, z_loss = (values[at + i * layers : at + (i + 1) * layers] for i in range(3))
        load_balancing, forwards = values[-2], max(values[-1], 1.0)
        per_layer = []
        for i, layer in enumerate(self.layers):
            total = sum(counts[i]) or 1.0
            load = [c / total for c in counts[i]]
            mean = 1.0 / experts
            cv = math.sqrt(sum((x - mean) ** 2 for x in load) / experts) / mean
            per_layer.append(
                {
                    "layer": layer,
                    "load": [round(x, 6) for x in load],
                    "cv": cv,
                    "max_load": max(load) * experts,
                    "dropped": dropped[i] / total,
                    "aux_loss": balance[i] / forwards,
                    "z_loss": z_loss[i] / forwards,
                }
            )
        all_assignments = sum(sum(c) for c in counts) or 1.0
        return {
            "moe_aux_loss": load_balancing / forwards,
            "moe_z_loss": sum(z_loss) / layers / forwards,
            "moe_load_cv": sum(p["cv"] for p in per_layer) / layers,
            "moe_load_cv_max": max(p["cv"] for p in per_layer),
            "moe_dropped": sum(dropped) / all_assignments,
            "moe_layers": per_layer,
        }


__all__ = [
    "RouterLoss",
    "RouterMeter",
    "check_expert_parallel",
    "expert_parallel_ds_config",
    "tap_expert_parallel_routers",
]
