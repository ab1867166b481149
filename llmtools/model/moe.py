"""The sparse mixture-of-experts block: a top-k router over SwiGLU experts, parameter for parameter
transformers' (5.x) ``Qwen3MoeSparseMoeBlock`` / ``MixtralSparseMoeBlock`` / ``Qwen2MoeSparseMoeBlock``.

Parameters, as transformers 5 holds them in memory (``model.layers.N.mlp.`` + ...)::

    gate.weight                      (experts, hidden)               the router
    experts.gate_up_proj             (experts, 2 * moe_inter, hidden) gate rows first, then up rows
    experts.down_proj                (experts, hidden, moe_inter)
    shared_expert.{gate,up,down}_proj.weight, shared_expert_gate.weight   (Qwen2-MoE only)

(``save_pretrained`` writes the experts one by one under their original names; :mod:`llmtools.model.hf`
converts both ways.)

Routing is token-choice top-k: ``p = softmax(x W_gate^T)`` in fp32, the k largest ``p`` pick the experts,
renormalised to sum to 1 when ``norm_topk_prob``; token t's output is ``sum_k p_tk * expert_k(x_t)``.
Dropless by default: every assignment is computed. With ``moe_capacity_factor`` c, an expert takes at most
``ceil(c * T * k / E)`` of a micro-batch's T tokens' assignments, its most probable ones; a dropped
assignment contributes nothing (the residual connection still carries the token).

The computation sorts the (token, expert) assignments by expert (one permutation), runs each expert on its
contiguous slice, scales by the routing weight and scatter-adds back. Under expert parallelism
(:mod:`llmtools.model.expert_parallel`) the sorted slices travel to the rank that computes their expert
and back, in between.

Each block also returns a :class:`RouterInfo` (per-expert probability mass and assignment counts, z-loss,
drops) from which :func:`router_losses` builds the training's auxiliary losses and the metrics their load.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from llmtools.model.config import ModelConfig


class RouterInfo(NamedTuple):
    """What one MoE layer's router did on one micro-batch (token_mask applied throughout)."""

    prob_sum: torch.Tensor
    """(experts,) fp32: sum over tokens of the routing probabilities (differentiable)."""
    counts: torch.Tensor
    """(experts,) fp32: assignments chosen per expert, before any capacity drop (no gradient)."""
    tokens: torch.Tensor
    """() fp32: tokens routed (padding excluded)."""
    z_loss: torch.Tensor
    """() fp32: mean over tokens of logsumexp(router logits)^2 (differentiable)."""
    dropped: torch.Tensor
    """() fp32: assignments dropped for capacity (no gradient)."""


class RouterStats(NamedTuple):
    """All MoE layers of one forward, stacked (no gradients): what the metrics report."""

    counts: torch.Tensor  # (moe layers, experts) assignments chosen
    tokens: torch.Tensor  # (moe layers,)
    dropped: torch.Tensor  # (moe layers,) assignments dropped for capacity
    balance: torch.Tensor  # (moe layers,) each layer's own E * sum(f * P)
    z_loss: torch.Tensor  # (moe layers,)
    load_balancing: torch.Tensor  # () the pooled loss the training uses, without its coefficient


class TopKRouter(nn.Module):
    """The router (transformers: ``Qwen3MoeTopKRouter``/``MixtralTopKRouter``, module name ``gate``)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class Experts(nn.Module):
    """SwiGLU experts stored fused, as transformers 5 stores them (``Qwen3MoeExperts``/``MixtralExperts``).

    ``num_local`` < ``config.num_experts`` holds only a contiguous block of experts (expert parallelism).
    """

    def __init__(self, config: ModelConfig, num_local: int | None = None) -> None:
        super().__init__()
        experts = config.num_experts if num_local is None else num_local
        inter, hidden = config.moe_intermediate_size, config.hidden_size
        self.gate_up_proj = nn.Parameter(torch.empty(experts, 2 * inter, hidden))
        self.down_proj = nn.Parameter(torch.empty(experts, hidden, inter))

    def forward(self, xs: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """``xs`` sorted by expert, ``counts[e]`` rows for local expert e. Every expert runs, even on zero
        rows, so each one is in the graph and its gradient is defined (zeros when it got no token)."""
        # unbind, not gate_up_proj[e]: indexing would make every expert's backward write a zero-filled
        # gradient of the whole 3-D tensor (E times the memory traffic; 1.7x slower on CPU).
        gate_up, down = self.gate_up_proj.unbind(0), self.down_proj.unbind(0)
        outs = []
        for e, chunk in enumerate(xs.split(counts)):
            gate, up = F.linear(chunk, gate_up[e]).chunk(2, dim=-1)
            outs.append(F.linear(F.silu(gate) * up, down[e]))
        return torch.cat(outs)


class SharedExpertMLP(nn.Module):
    """Qwen2-MoE's ``shared_expert``: a SwiGLU every token goes through."""

    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Routing(NamedTuple):
    """The assignments of a micro-batch, sorted by expert (dropped ones removed)."""

    token: torch.Tensor  # (n,) source token of each kept assignment, grouped by expert
    weight: torch.Tensor  # (n,) its routing weight (fp32, differentiable)
    counts: torch.Tensor  # (experts,) kept assignments per expert (int64)
    chosen: torch.Tensor  # (experts,) chosen assignments per expert before drops (int64)
    expert: torch.Tensor  # (tokens, k) the chosen experts


def route(
    probs: torch.Tensor,
    top_k: int,
    normalize: bool,
    capacity_factor: float | None,
    valid: torch.Tensor | None,
) -> Routing:
    """Top-k of ``probs`` (tokens, experts); the kept assignments grouped by expert.

    Padding tokens (``valid`` False) are routed and computed like the others (they cost the same work)
    but are never dropped in favour of real tokens: under a capacity they rank last.
    """
    tokens, experts = probs.shape
    weight, expert = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weight = weight / weight.sum(dim=-1, keepdim=True)
    flat_expert = expert.reshape(-1)
    flat_weight = weight.reshape(-1)
    chosen = torch.bincount(flat_expert, minlength=experts)
    if capacity_factor is None:
        order = torch.argsort(flat_expert, stable=True)
        return Routing(order // top_k, flat_weight[order], chosen, chosen, expert)
    # Within each expert, the most probable assignments first (padding after every real token).
    priority = probs.detach().gather(1, expert).reshape(-1)
    if valid is not None:
        priority = priority + valid.reshape(-1, 1).expand(-1, top_k).reshape(-1).to(priority.dtype)
    order = torch.argsort(priority, descending=True, stable=True)
    order = order[torch.argsort(flat_expert[order], stable=True)]
    capacity = math.ceil(capacity_factor * tokens * top_k / experts)
    starts = torch.cumsum(chosen, 0) - chosen
    position = torch.arange(order.numel(), device=order.device) - starts[flat_expert[order]]
    keep = position < capacity
    order = order[keep]
    return Routing(order // top_k, flat_weight[order], chosen.clamp(max=capacity), chosen, expert)


class SparseMoeBlock(nn.Module):
    """Router + experts (+ the gated shared expert of Qwen2-MoE): ``(b, t, h) -> (b, t, h), RouterInfo``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_experts = config.num_experts
        self.top_k = config.num_experts_per_tok
        self.normalize = config.norm_topk_prob
        self.capacity_factor = config.moe_capacity_factor
        self.gate = TopKRouter(config)
        self.experts = Experts(config)
        if config.shared_expert_intermediate_size:
            self.shared_expert = SharedExpertMLP(config.hidden_size, config.shared_expert_intermediate_size)
            self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)
        else:
            self.shared_expert = self.shared_expert_gate = None
        self.expert_parallel = None
        """An :class:`~llmtools.model.expert_parallel.ExpertParallel` when the experts are spread over ranks."""

    def forward(
        self, hidden: torch.Tensor, token_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, RouterInfo]:
        shape = hidden.shape
        x = hidden.reshape(-1, shape[-1])
        valid = token_mask.reshape(-1) if token_mask is not None else None
        logits = self.gate(x)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        routing = route(probs, self.top_k, self.normalize, self.capacity_factor, valid)
        xs = x[routing.token]
        if self.expert_parallel is None:
            ys = self.experts(xs, routing.counts.tolist())
        else:
            ys = self.expert_parallel.run(self.experts, xs, routing.counts)
        ys = (ys * routing.weight.unsqueeze(-1)).to(x.dtype)
        out = torch.zeros_like(x).index_add_(0, routing.token, ys)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        dropped = (routing.chosen - routing.counts).sum().float()
        return out.reshape(shape), router_info(logits, probs, routing.expert, dropped, valid)


def router_info(
    logits: torch.Tensor,
    probs: torch.Tensor,
    expert: torch.Tensor,
    dropped: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
) -> RouterInfo:
    """A layer's :class:`RouterInfo` from its router logits (tokens, E), their softmax and the chosen
    experts (tokens, k); ``valid`` (tokens,) False for padding."""
    experts, top_k = probs.shape[-1], expert.shape[-1]
    z = torch.logsumexp(logits.float(), dim=-1).square()
    if valid is None:
        tokens = torch.tensor(float(probs.shape[0]), device=probs.device)
        prob_sum, z_sum = probs.sum(0), z.sum()
        counts = torch.bincount(expert.reshape(-1), minlength=experts).float()
    else:
        mask = valid.to(probs.dtype)
        tokens = mask.sum()
        prob_sum, z_sum = (probs * mask.unsqueeze(-1)).sum(0), (z * mask).sum()
        counts = torch.zeros(experts, device=probs.device).index_add_(
            0, expert.reshape(-1), mask.repeat_interleave(top_k)
        )
    if dropped is None:
        dropped = torch.zeros((), device=probs.device)
    return RouterInfo(prob_sum, counts, tokens, z_sum / tokens.clamp(min=1.0), dropped)


def router_info_from_logits(logits: torch.Tensor, top_k: int) -> RouterInfo:
    """The :class:`RouterInfo` of a dropless top-k router seen only through its logits (another
    implementation of the block, e.g. DeepSpeed's expert-parallel layer, routing as this one does)."""
    logits = logits.reshape(-1, logits.shape[-1])
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    return router_info(logits, probs, torch.topk(probs.detach(), top_k, dim=-1).indices)


class RouterLosses(NamedTuple):
    aux_loss: torch.Tensor
    """The term the training adds to its loss: coef * load_balancing + z_coef * z_loss (differentiable)."""
    load_balancing: torch.Tensor
    z_loss: torch.Tensor
    stats: RouterStats


def router_losses(infos: list[RouterInfo], config: ModelConfig) -> RouterLosses:
    """The auxiliary losses of one forward from every MoE layer's :class:`RouterInfo`.

    Load balancing is transformers' ``load_balancing_loss_func`` (Switch Transformer eq. 4-6 over all
    MoE layers pooled): with f_e the fraction of assignments and P_e the mean routing probability of
    expert e, both averaged over layers and tokens, ``E * sum_e f_e P_e`` — k for perfectly even routing.
    z-loss is the mean over layers of each layer's mean ``logsumexp(logits)^2``.
    """
    experts = config.num_experts
    tokens = torch.stack([i.tokens for i in infos]).clamp(min=1.0)
    counts = torch.stack([i.counts for i in infos])
    prob_sum = torch.stack([i.prob_sum for i in infos])
    total = tokens.sum()
    balance = experts * (counts.sum(0) / total * (prob_sum.sum(0) / total)).sum()
    z_loss = torch.stack([i.z_loss for i in infos]).mean()
    aux = config.router_aux_loss_coef * balance
    if config.router_z_loss_coef:
        aux = aux + config.router_z_loss_coef * z_loss
    with torch.no_grad():
        per_layer = experts * (counts / tokens[:, None] * prob_sum / tokens[:, None]).sum(-1)
        stats = RouterStats(
            counts=counts,
            tokens=tokens,
            dropped=torch.stack([i.dropped for i in infos]),
            balance=per_layer,
            z_loss=torch.stack([i.z_loss.detach() for i in infos]),
            load_balancing=balance.detach(),
        )
    return RouterLosses(aux, balance, z_loss, stats)


__all__ = [
    "Experts",
    "RouterInfo",
    "RouterLosses",
    "RouterStats",
    "SharedExpertMLP",
    "SparseMoeBlock",
    "TopKRouter",
    "route",
    "router_info",
    "router_info_from_logits",
    "router_losses",
]
