"""``config.json`` of Hugging Face Llama / Qwen3 / Mixtral / Qwen3-MoE / Qwen2-MoE models, both ways —
no torch needed.

:mod:`llmtools.model.hf` re-exports these beside the weight loading and saving.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llmtools.errors import InputError
from llmtools.formats.jsonfile import read_json_object
from llmtools.model.config import ModelConfig

SUPPORTED_MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
}
MOE_MODEL_TYPES = ("mixtral", "qwen3_moe", "qwen2_moe")
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def dtype_name(dtype: Any) -> str:
    """``"bfloat16"`` for torch.bfloat16, "bf16" or "bfloat16" (config.json's spelling)."""
    text = str(dtype).removeprefix("torch.")
    text = DTYPE_ALIASES.get(text, text)
    if text not in ("float32", "bfloat16", "float16", "float64"):
        raise InputError(f"--dtype: {dtype!r} is not one of float32, bfloat16, float16 (fp32, bf16, fp16)")
    return text


# ---- config.json -------------------------------------------------------------------------------------


def to_hf_config(
    config: ModelConfig,
    *,
    dtype: Any = "float32",
    bos_token_id: int | None = None,
    eos_token_id: int | list[int] | None = None,
) -> dict[str, Any]:
    """The ``config.json`` of this shape's family (:attr:`ModelConfig.model_type`: Llama, Qwen3,
    Mixtral, Qwen3-MoE or Qwen2-MoE).

    Written in the ``rope_theta`` / ``rope_scaling`` / ``torch_dtype`` spelling, which transformers
    4.x and 5.x and the usual converters (vLLM, llama.cpp) all read.
    """
    model_type = config.model_type
    data: dict[str, Any] = {
        "architectures": [SUPPORTED_MODEL_TYPES[model_type]],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "initializer_range": config.initializer_range,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": dict(config.rope_scaling) if config.rope_scaling else None,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "torch_dtype": dtype_name(dtype),
        "use_cache": True,
    }
    if model_type == "llama":
        data.update({"mlp_bias": False, "pretraining_tp": 1})
    elif model_type == "mixtral":
        data.update({"sliding_window": None, "router_jitter_noise": 0.0})
    else:
        data.update(
            {
                "use_sliding_window": False,
                "sliding_window": None,
                "max_window_layers": config.num_hidden_layers,
            }
        )
    if config.is_moe:
        data.update(_moe_fields(config))
    return data


def _moe_fields(config: ModelConfig) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "num_experts_per_tok": config.num_experts_per_tok,
        "router_aux_loss_coef": config.router_aux_loss_coef,
        "output_router_logits": False,
    }
    if config.model_type == "mixtral":
        fields["num_local_experts"] = config.num_experts  # experts sized by intermediate_size
    else:
        fields.update(
            {
                "num_experts": config.num_experts,
                "moe_intermediate_size": config.moe_intermediate_size,
                "norm_topk_prob": config.norm_topk_prob,
                "decoder_sparse_step": config.decoder_sparse_step,
                "mlp_only_layers": list(config.mlp_only_layers),
            }
        )
    if config.model_type == "qwen2_moe":
        # Qwen2-MoE's attention has q/k/v biases unless told otherwise; ours has none.
        fields.update(
            {"shared_expert_intermediate_size": config.shared_expert_intermediate_size, "qkv_bias": False}
        )
    # Training-only knobs transformers does not know: kept so that a round trip gives the same config.
    if config.router_z_loss_coef:
        fields["router_z_loss_coef"] = config.router_z_loss_coef
    if config.moe_capacity_factor is not None:
        fields["moe_capacity_factor"] = config.moe_capacity_factor
    return fields


def from_hf_config(data: Mapping[str, Any], source: str = "config.json") -> ModelConfig:
    """A ModelConfig from a Llama / Qwen3 ``config.json`` (transformers 4.x or 5.x spelling).

    Features this model does not have (biases, sliding windows, other activations or RoPE kinds)
    are refused with the key that asks for them, rather than silently giving a different model.
    """
    model_type = data.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise InputError(
            f"{source}[model_type]: {model_type!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    act = data.get("hidden_act", "silu")
    if act != "silu":
        raise InputError(f"{source}[hidden_act]: {act!r} is not supported (only silu / SwiGLU)")
    for key in ("attention_bias", "mlp_bias", "use_sliding_window"):
        if data.get(key):
            raise InputError(f"{source}[{key}]: true is not supported by this model")
    if model_type == "qwen2_moe" and data.get("qkv_bias", True):  # transformers' default is true
        raise InputError(f"{source}[qkv_bias]: q/k/v biases are not supported by this model (need false)")
    if model_type == "mixtral":
        if data.get("sliding_window") is not None:
            raise InputError(
                f"{source}[sliding_window]: {data['sliding_window']!r} is not supported (need null)"
            )
        if data.get("router_jitter_noise"):
            raise InputError(
                f"{source}[router_jitter_noise]: {data['router_jitter_noise']!r} is not supported (need 0)"
            )
    # transformers 5 nests theta and the scaling in rope_parameters; 4.x has rope_theta + rope_scaling.
    rope = data.get("rope_parameters")
    if isinstance(rope, Mapping):
        rope = dict(rope)
        theta = rope.pop("rope_theta", data.get("rope_theta", 10000.0))
        scaling = rope if rope.get("rope_type", rope.get("type", "default")) != "default" else None
    else:
        theta = data.get("rope_theta", 10000.0)
        scaling = data.get("rope_scaling")
    fields = {
        "vocab_size": data.get("vocab_size"),
        "hidden_size": data.get("hidden_size"),
        "intermediate_size": data.get("intermediate_size"),
        "num_hidden_layers": data.get("num_hidden_layers"),
        "num_attention_heads": data.get("num_attention_heads"),
        "num_key_value_heads": data.get("num_key_value_heads"),
        "head_dim": data.get("head_dim"),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "rms_norm_eps": data.get("rms_norm_eps", 1e-5 if model_type == "mixtral" else 1e-6),
        "tie_word_embeddings": bool(data.get("tie_word_embeddings", False)),
        "qk_norm": model_type in ("qwen3", "qwen3_moe"),
        "max_position_embeddings": data.get("max_position_embeddings", 2048),
        "initializer_range": data.get("initializer_range", 0.02),
    }
    if model_type in MOE_MODEL_TYPES:
        fields.update(_moe_from_hf(data, model_type, source))
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        if fields[key] is None:
            raise InputError(f"{source}[{key}]: missing")
    try:
        return ModelConfig(**fields)
    except InputError as error:
        raise InputError(f"{source}: {error}") from None


def _moe_from_hf(data: Mapping[str, Any], model_type: str, source: str) -> dict[str, Any]:
    """The MoE fields of a Mixtral / Qwen3-MoE / Qwen2-MoE config.json (transformers' defaults when absent)."""
    # transformers 5 writes Qwen3-MoE's num_experts as num_local_experts (Mixtral's name): read either.
    if model_type == "mixtral":
        fields: dict[str, Any] = {
            "num_experts": data.get("num_local_experts", data.get("num_experts", 8)),
            "num_experts_per_tok": data.get("num_experts_per_tok", 2),
            "norm_topk_prob": True,
        }
    else:
        defaults = {"qwen3_moe": (128, 8, 768), "qwen2_moe": (60, 4, 1408)}[model_type]
        fields = {
            "num_experts": data.get("num_experts", data.get("num_local_experts", defaults[0])),
            "num_experts_per_tok": data.get("num_experts_per_tok", defaults[1]),
            "moe_intermediate_size": data.get("moe_intermediate_size", defaults[2]),
            "norm_topk_prob": bool(data.get("norm_topk_prob", False)),
            "decoder_sparse_step": data.get("decoder_sparse_step", 1),
            "mlp_only_layers": list(data.get("mlp_only_layers") or []),
        }
    if model_type == "qwen2_moe":
        fields["shared_expert_intermediate_size"] = data.get("shared_expert_intermediate_size", 5632)
        if not fields["shared_expert_intermediate_size"]:
            raise InputError(f"{source}[shared_expert_intermediate_size]: Qwen2-MoE needs a shared expert")
    fields["router_aux_loss_coef"] = data.get("router_aux_loss_coef", 0.001)
    fields["router_z_loss_coef"] = data.get("router_z_loss_coef", 0.0)
    fields["moe_capacity_factor"] = data.get("moe_capacity_factor")
    if not fields["num_experts"]:
        raise InputError(f"{source}[num_experts]: a {model_type} model needs experts")
    return fields


def read_hf_config(folder: str | os.PathLike) -> dict[str, Any]:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise InputError(f"{path}: missing (not a Hugging Face model folder)")
    return read_json_object(path, "config.json")


__all__ = [
    "to_hf_config",
    "from_hf_config",
    "read_hf_config",
    "dtype_name",
    "SUPPORTED_MODEL_TYPES",
    "MOE_MODEL_TYPES",
]
