"""A LLaMA-family decoder in plain PyTorch, parameter for parameter Hugging Face's.

Module and parameter names are those of ``transformers``' ``LlamaForCausalLM`` (and
``Qwen3ForCausalLM`` when ``qk_norm`` is on: ``self_attn.q_norm`` / ``k_norm``; the MoE families'
``mlp.gate`` / ``mlp.experts`` when ``num_experts`` is set, see :mod:`llmtools.model.moe`), so a Hugging
Face ``state_dict`` loads with ``load_state_dict`` as is and export is no more than dropping a tied
``lm_head.weight``. The numerics follow Hugging Face's too (RMSNorm in fp32, RoPE tables in fp32,
logits upcast to fp32 for the loss), which is what the comparison tests pin down.

Attention goes through ``torch.nn.functional.scaled_dot_product_attention`` with ``is_causal``:
flash / memory-efficient kernels on GPU, the fused CPU kernel otherwise. Packed rows (``segment_ids``)
attend within their documents through :mod:`llmtools.model.doc_attention`, never a dense t x t mask.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from llmtools.model.config import ModelConfig
from llmtools.model.doc_attention import DocumentSpans, document_attention
from llmtools.model.moe import Experts, RouterInfo, RouterStats, SparseMoeBlock, TopKRouter, router_losses

IGNORE_INDEX = -100


class RMSNorm(nn.Module):
    """``weight * x / rms(x)``, normalised in fp32 and cast back before the weight (as HF does)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


def rope_inv_freq(config: ModelConfig, device: torch.device | None = None) -> torch.Tensor:
    """Inverse frequencies (fp32, head_dim/2), with Llama-3 or linear position scaling applied.

    Llama 3.1's scaling keeps high frequencies (wavelength below original_context/high_freq_factor),
    divides low ones (wavelength above original_context/low_freq_factor) by ``factor``, and blends
    linearly in between.
    """
    dim = config.head_dim
    inv_freq = 1.0 / (
        config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim)
    )
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    factor = float(scaling["factor"])
    if scaling["rope_type"] == "linear":
        return inv_freq / factor
    original = float(scaling["original_max_position_embeddings"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(medium, blended, scaled)


class RotaryEmbedding(nn.Module):
    """cos/sin tables, computed in fp32 and cached per device.

    The tables are a plain attribute rather than a buffer on purpose: ``model.to(bfloat16)`` (which
    DeepSpeed does for bf16) would otherwise round the frequencies, and a buffer would also show up
    in checkpoints that Hugging Face does not have.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self._cache: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def _tables(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        cached = self._cache.get(device)
        if cached is None or cached[0].shape[0] < length:
            size = max(length, min(self.config.max_position_embeddings, 4096))
            inv_freq = rope_inv_freq(self.config, device=device)
            freqs = torch.outer(torch.arange(size, device=device, dtype=torch.float32), inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            cached = (emb.cos(), emb.sin())
            self._cache[device] = cached
        return cached

    def forward(
        self, position_ids: torch.Tensor | None, length: int, device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if position_ids is None:
            cos, sin = self._tables(length, device)
            cos, sin = cos[:length], sin[:length]
        else:
            cos, sin = self._tables(int(position_ids.max()) + 1, device)
            cos, sin = cos[position_ids].unsqueeze(1), sin[position_ids].unsqueeze(1)  # (b, 1, t, d)
        return cos.to(dtype), sin.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=False)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, spans: DocumentSpans | None = None
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:  # Qwen3 normalises each head before rotating it
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # enable_gqa lets the kernel share each key/value head across its query group (HF's repeat_kv).
        gqa = self.num_kv_heads != self.num_heads
        if spans is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:  # packed documents: causal within each, no document sees another
            out = document_attention(q, k, v, spans, enable_gqa=gqa)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, index: int = 0) -> None:
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = SparseMoeBlock(config) if config.is_moe_layer(index) else MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        spans: DocumentSpans | None = None,
        token_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, RouterInfo | None]:
        """The new hidden states, and what the router did when this is a MoE layer."""
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, spans)
        if isinstance(self.mlp, SparseMoeBlock):
            out, info = self.mlp(self.post_attention_layernorm(x), token_mask)
            return x + out, info
        out = self.mlp(self.post_attention_layernorm(x))
        if isinstance(out, tuple):  # a block put in our MoE block's place reports its router the same way
            out, info = out
            return x + out, info
        return x + out, None


def segment_causal_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """(b, 1, t, t) bool for SDPA: causal and within one segment (packed samples never see each other).

    The dense reference of document attention, for tests and benchmarks only (t x t memory). Padding (segment 0) attends to padding only; its diagonal is always True, so no row is all-masked
    (which would give NaNs).
    """
    t = segment_ids.shape[-1]
    causal = torch.ones(t, t, dtype=torch.bool, device=segment_ids.device).tril()
    same = segment_ids.unsqueeze(-1) == segment_ids.unsqueeze(-2)
    return (same & causal).unsqueeze(1)


class LlamaModel(nn.Module):
    """The decoder stack without the output head (HF's ``model.`` prefix)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)
        self.gradient_checkpointing = False

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[RouterInfo]]:
        """The final hidden states, and each MoE layer's :class:`RouterInfo` (none for a dense model)."""
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(position_ids, input_ids.shape[1], x.device, x.dtype)
        spans = DocumentSpans(segment_ids) if segment_ids is not None else None
        token_mask = segment_ids != 0 if segment_ids is not None else None  # segment 0 = padding
        routers = []
        for layer in self.layers:
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                from torch.utils.checkpoint import checkpoint

                x, info = checkpoint(layer, x, cos, sin, spans, token_mask, use_reentrant=False)
            else:
                x, info = layer(x, cos, sin, spans, token_mask)
            if info is not None:
                routers.append(info)
        return self.norm(x), routers


class ModelOutput(NamedTuple):
    """What ``forward(..., output_router=True)`` returns (a tuple, so DeepSpeed's hooks walk it)."""

    logits: torch.Tensor
    aux_loss: torch.Tensor | None
    """MoE: the router's auxiliary loss, coefficients applied — add it to the training loss. None if dense."""
    router: RouterStats | None
    """MoE: per-layer load, drops and losses of this forward (no gradient), for the metrics."""


class LlamaForCausalLM(nn.Module):
    """``model(input_ids) -> logits``; ``model.loss(input_ids, labels, loss_mask) -> scalar``.

    Works for Llama 2/3 and Qwen3 shapes (``config.qk_norm``). Build a real-size model on the meta
    device (``with torch.device("meta"): ...``) to inspect it without allocating memory.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.init_weights()
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def init_weights(self) -> None:
        """Reference initialisation (HF / Meta recipes): every linear and embedding weight
        ~ N(0, initializer_range), norm weights 1. Deterministic under ``torch.manual_seed``."""
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding, TopKRouter)):
                if module is self.lm_head and self.config.tie_word_embeddings:
                    continue  # shares the embedding's weight, initialised once
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, Experts):
                nn.init.normal_(module.gate_up_proj, mean=0.0, std=std)
                nn.init.normal_(module.down_proj, mean=0.0, std=std)
            elif isinstance(module, RMSNorm):
                module.reset_parameters()

    @property
    def gradient_checkpointing(self) -> bool:
        return self.model.gradient_checkpointing

    @gradient_checkpointing.setter
    def gradient_checkpointing(self, value: bool) -> None:
        """Recompute each layer's activations in the backward pass (memory for ~30% more compute)."""
        self.model.gradient_checkpointing = bool(value)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
        output_router: bool = False,
    ) -> torch.Tensor | ModelOutput:
        """Logits. ``segment_ids`` (b, t) marks packed samples (1, 2, ...; 0 = padding): attention then
        stays inside a sample (pass ``position_ids`` restarting per sample too); padding is left out of
        the router's losses and load.

        ``output_router``: a :class:`ModelOutput` instead, with the MoE auxiliary loss to add to the
        training loss and the router's statistics (``aux_loss`` and ``router`` are None for a dense model).
        """
        hidden, routers = self.model(input_ids, position_ids, segment_ids)
        logits = self.lm_head(hidden)
        if not output_router:
            return logits
        if not routers:
            return ModelOutput(logits, None, None)
        losses = router_losses(routers, self.config)
        return ModelOutput(logits, losses.aux_loss, losses.stats)

    def loss(
        self, input_ids: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Mean next-token cross-entropy (fp32).

        ``labels`` are already shifted (Megatron's convention: ``tokens = sample[:-1]``,
        ``labels = sample[1:]``); ids equal to -100 are ignored. With ``loss_mask`` (1 = counts)
        the loss is ``sum(ce * mask) / sum(mask)``. The language-model loss only: a MoE model's
        auxiliary loss comes from ``forward(..., output_router=True)``.
        """
        logits = self(input_ids).float().flatten(0, 1)
        labels = labels.flatten()
        if loss_mask is None:  # the fused mean over the non-ignored positions
            return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX)
        ce = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="none")
        valid = loss_mask.flatten().to(ce.dtype) * (labels != IGNORE_INDEX).to(ce.dtype)
        return (ce * valid).sum() / valid.sum().clamp(min=1.0)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Counted from the tensors (shared weights once); equals ``config.num_parameters()``."""
        seen: set[int] = set()
        total = 0
        embeddings = {id(self.model.embed_tokens.weight), id(self.lm_head.weight)}
        for param in self.parameters():  # parameters() already yields a tied weight once
            if id(param) in seen or (exclude_embeddings and id(param) in embeddings):
                continue
            seen.add(id(param))
            total += param.numel()
        return total


__all__ = [
    "LlamaForCausalLM",
    "LlamaModel",
    "ModelOutput",
    "segment_causal_mask",
    "RMSNorm",
    "RotaryEmbedding",
    "rope_inv_freq",
    "IGNORE_INDEX",
]
