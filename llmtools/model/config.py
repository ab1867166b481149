"""The shape of a LLaMA-family decoder, dense or mixture-of-experts (the presets in ``configs/models/`` are
read by :mod:`.presets`).

Field names are Hugging Face's (``LlamaConfig`` / ``Qwen3Config`` / ``Qwen3MoeConfig`` /
``Qwen2MoeConfig``; Mixtral's ``num_local_experts`` is ``num_experts`` here), so a ``config.json`` maps
onto this class by name and a preset reads like the model card it came from. The class checks itself:
a bad value raises :class:`~llmtools.errors.InputError` naming the field.

Which transformers family a config is (:attr:`ModelConfig.model_type`) follows from its fields:

==============  ===========  ===================================  ==============================
family          ``qk_norm``  experts                              ``transformers`` class
==============  ===========  ===================================  ==============================
``llama``       false        none                                 ``LlamaForCausalLM``
``qwen3``       true         none                                 ``Qwen3ForCausalLM``
``mixtral``     false        routed (top-k renormalised)          ``MixtralForCausalLM``
``qwen3_moe``   true         routed                               ``Qwen3MoeForCausalLM``
``qwen2_moe``   false        routed + a gated shared expert       ``Qwen2MoeForCausalLM``
==============  ===========  ===================================  ==============================
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llmtools.errors import InputError

ROPE_TYPES = ("default", "linear", "llama3")
ROPE_KEYS = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}
"""The keys of ``rope_scaling`` each ``rope_type`` uses, besides ``rope_type`` (or ``type``) itself."""

# What a config may ask for, checked before anything is built from it (a model config is untrusted
# input: 10**5 layers would make import-hf, init_from or convert run for minutes while memory grows).
# The largest open models have ~130 layers, widths of ~30k, vocabularies of ~260k and ~1T parameters.
LIMITS = {
    "num_hidden_layers": 1024,
    "hidden_size": 1 << 17,
    "intermediate_size": 1 << 19,
    "moe_intermediate_size": 1 << 19,
    "shared_expert_intermediate_size": 1 << 19,
    "vocab_size": 1 << 24,
    "num_attention_heads": 1 << 12,
    "num_key_value_heads": 1 << 12,
    "head_dim": 1 << 12,
    "num_experts": 1 << 12,
    "num_experts_per_tok": 1 << 12,
    "decoder_sparse_step": 1024,
    "max_position_embeddings": 1 << 24,
}
MAX_PARAMETERS = 2 * 10**12
"""At most 2e12 parameters (8 TB in fp32): beyond that a config is a typo or an attack."""


# The fields that decide the shape of every weight: two configs that agree on them can share weights.
SHAPE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "qk_norm",
    "tie_word_embeddings",
    "num_experts",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "decoder_sparse_step",
    "mlp_only_layers",
)

# Mixture-of-experts fields with their defaults; a dense config (num_experts 0) leaves them all at these.
MOE_DEFAULTS: dict[str, Any] = {
    "num_experts": 0,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": None,
    "norm_topk_prob": True,
    "shared_expert_intermediate_size": 0,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "router_aux_loss_coef": 0.001,
    "router_z_loss_coef": 0.0,
    "moe_capacity_factor": None,
}


SANE_RANGES = {
    # (lowest, highest, usual): outside, a model diverges or learns nothing from its first step
    "rope_theta": (1.0, 1e12, "usually 1e4 .. 1e7"),
    "rms_norm_eps": (1e-12, 1e-1, "usually 1e-6 .. 1e-5"),
    "initializer_range": (1e-5, 1.0, "usually 0.006 .. 0.05"),
}


@dataclass
class ModelConfig:
    """A LLaMA-family decoder: RMSNorm, RoPE, SwiGLU, grouped-query attention, optional QK-norm (Qwen3)."""

    vocab_size: int = 4096
    """Rows of the embedding and of ``lm_head``; must be at least the tokenizer's vocabulary size."""
    hidden_size: int = 192
    intermediate_size: int = 512
    """Width of the SwiGLU MLP (gate/up projections)."""
    num_hidden_layers: int = 4
    num_attention_heads: int = 6
    num_key_value_heads: int | None = None
    """Grouped-query attention: key/value heads, dividing ``num_attention_heads``. None = multi-head."""
    head_dim: int | None = None
    """Per-head width; None = hidden_size // num_attention_heads (Qwen3 sets it explicitly)."""
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    """None, {"rope_type": "linear", "factor": f} or Llama-3's {"rope_type": "llama3", "factor",
    "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}."""
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    qk_norm: bool = False
    """RMSNorm on each query and key head before RoPE (Qwen3)."""
    max_position_embeddings: int = 2048
    initializer_range: float = 0.02
    """Standard deviation of the normal initialisation of every linear and embedding weight."""

    # ---- mixture of experts (all ignored while num_experts is 0) ----
    num_experts: int = 0
    """Routed experts per MoE layer (Mixtral's ``num_local_experts``); 0 = a dense model."""
    num_experts_per_tok: int = 2
    """Top-k: experts each token is sent to."""
    moe_intermediate_size: int | None = None
    """Width of each expert's SwiGLU; None = intermediate_size (Mixtral's experts use intermediate_size)."""
    norm_topk_prob: bool = True
    """Renormalise the k chosen routing probabilities to sum to 1 (Mixtral always; Qwen3-MoE's flag)."""
    shared_expert_intermediate_size: int = 0
    """Width of a shared expert every token goes through, gated by sigmoid(x . w) (Qwen2-MoE); 0 = none."""
    decoder_sparse_step: int = 1
    """Layer i is a MoE layer when (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers."""
    mlp_only_layers: list[int] = field(default_factory=list)
    """Layers that keep a dense MLP of width intermediate_size (Qwen3-MoE's field)."""
    router_aux_loss_coef: float = 0.001
    """Weight of the load-balancing loss added to the training loss (transformers' definition)."""
    router_z_loss_coef: float = 0.0
    """Weight of the router z-loss, mean(logsumexp(router logits)^2) (ST-MoE); neither family uses it: 0."""
    moe_capacity_factor: float | None = None
    """None: dropless token-choice routing. A number c: each expert takes at most ceil(c * tokens * k /
    experts) of a micro-batch's assignments (the most probable ones); the rest are dropped."""

    # ---- validation ---------------------------------------------------------------------------------

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "max_position_embeddings",
        ):
            _check_int(name, getattr(self, name), minimum=1)
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        _check_int("num_key_value_heads", self.num_key_value_heads, minimum=1)
        if self.num_attention_heads % self.num_key_value_heads:
            raise InputError(
                f"model.num_key_value_heads: {self.num_key_value_heads} does not divide "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise InputError(
                    f"model.hidden_size: {self.hidden_size} is not a multiple of num_attention_heads "
                    f"{self.num_attention_heads} (set head_dim explicitly)"
                )
            self.head_dim = self.hidden_size // self.num_attention_heads
        _check_int("head_dim", self.head_dim, minimum=2)
        if self.head_dim % 2:
            raise InputError(f"model.head_dim: {self.head_dim} must be even (rotary embeddings rotate pairs)")
        for name in ("rope_theta", "rms_norm_eps", "initializer_range"):
            value = _yaml_number(getattr(self, name))
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InputError(f"model.{name}: expected a number, got {value!r}")
            if value <= 0:
                raise InputError(f"model.{name}: must be > 0, got {value}")
            low, high, usual = SANE_RANGES[name]
            if not low <= value <= high:
                raise InputError(f"model.{name}: {value:g} is out of range: {low:g} .. {high:g} ({usual})")
            setattr(self, name, float(value))
        for name in ("tie_word_embeddings", "qk_norm"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"model.{name}: expected true or false, got {getattr(self, name)!r}")
        self.rope_scaling = _check_rope_scaling(self.rope_scaling, self.rope_theta)
        self._check_moe()
        total = self.num_parameters()
        if total > MAX_PARAMETERS:
            raise InputError(
                f"model: {total:.3g} parameters ({total * 4 / 2**40:.3g} TiB in fp32) is beyond the "
                f"{MAX_PARAMETERS:.0e} a config may ask for"
            )

    def _check_moe(self) -> None:
        _check_int("num_experts", self.num_experts, minimum=0)
        if not self.num_experts:
            for name, default in MOE_DEFAULTS.items():
                value = getattr(self, name)
                if name != "num_experts" and value != default and not _same_number(value, default):
                    raise InputError(f"model.{name}: only for mixture-of-experts models (set num_experts)")
            self.mlp_only_layers = []
            return
        _check_int("num_experts_per_tok", self.num_experts_per_tok, minimum=1)
        if self.num_experts_per_tok > self.num_experts:
            raise InputError(
                f"model.num_experts_per_tok: {self.num_experts_per_tok} is more than num_experts "
                f"{self.num_experts} (top-k chooses among the experts)"
            )
        if self.moe_intermediate_size is None:
            self.moe_intermediate_size = self.intermediate_size
        _check_int("moe_intermediate_size", self.moe_intermediate_size, minimum=1)
        _check_int("shared_expert_intermediate_size", self.shared_expert_intermediate_size, minimum=0)
        _check_int("decoder_sparse_step", self.decoder_sparse_step, minimum=1)
        if not isinstance(self.mlp_only_layers, (list, tuple)):
            raise InputError(
                f"model.mlp_only_layers: expected a list of layer indices, got {self.mlp_only_layers!r}"
            )
        layers = []
        for i, layer in enumerate(self.mlp_only_layers):
            _check_int(f"mlp_only_layers[{i}]", layer, minimum=0)
            if layer >= self.num_hidden_layers:
                raise InputError(
                    f"model.mlp_only_layers[{i}]: layer {layer} does not exist "
                    f"(num_hidden_layers {self.num_hidden_layers})"
                )
            layers.append(layer)
        self.mlp_only_layers = sorted(set(layers))
        if not self.moe_layers():
            raise InputError(
                "model.mlp_only_layers / decoder_sparse_step: no layer is left a MoE layer (set num_experts 0 "
                "for a dense model)"
            )
        if not isinstance(self.norm_topk_prob, bool):
            raise InputError(f"model.norm_topk_prob: expected true or false, got {self.norm_topk_prob!r}")
        for name in ("router_aux_loss_coef", "router_z_loss_coef"):
            value = _yaml_number(getattr(self, name))
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InputError(f"model.{name}: expected a number, got {value!r}")
            if value < 0:
                raise InputError(f"model.{name}: must be >= 0, got {value}")
            setattr(self, name, float(value))
        if self.moe_capacity_factor is not None:
            value = _yaml_number(self.moe_capacity_factor)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InputError(f"model.moe_capacity_factor: expected a number or null, got {value!r}")
            if value <= 0:
                raise InputError(f"model.moe_capacity_factor: must be > 0 (null = dropless), got {value}")
            self.moe_capacity_factor = float(value)
        # The families transformers has: the fields must name one of them, or export could not load.
        if self.shared_expert_intermediate_size and self.qk_norm:
            raise InputError(
                "model.shared_expert_intermediate_size: a shared expert with qk_norm matches no transformers "
                "family (Qwen2-MoE has the shared expert, Qwen3-MoE the QK-norm)"
            )
        if self.model_type == "mixtral":
            if not self.norm_topk_prob:
                raise InputError(
                    "model.norm_topk_prob: Mixtral-family models (no qk_norm, no shared expert) always "
                    "renormalise the top-k weights"
                )
            if self.moe_intermediate_size != self.intermediate_size:
                raise InputError(
                    f"model.moe_intermediate_size: Mixtral-family models (no qk_norm, no shared expert) size "
                    f"their experts by intermediate_size ({self.intermediate_size}); leave it unset"
                )
            if self.decoder_sparse_step != 1 or self.mlp_only_layers:
                raise InputError(
                    "model.decoder_sparse_step / mlp_only_layers: every layer of a Mixtral-family model "
                    "(no qk_norm, no shared expert) is a MoE layer"
                )

    # ---- derived quantities ------------------------------------------------------------------------

    @property
    def num_key_value_groups(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def model_type(self) -> str:
        """The transformers family of this shape (see the module docstring)."""
        if not self.num_experts:
            return "qwen3" if self.qk_norm else "llama"
        if self.shared_expert_intermediate_size:
            return "qwen2_moe"
        return "qwen3_moe" if self.qk_norm else "mixtral"

    def is_moe_layer(self, index: int) -> bool:
        """transformers' rule (Qwen3-MoE's ``decoder_sparse_step`` / ``mlp_only_layers``; Mixtral: all)."""
        return (
            self.num_experts > 0
            and index not in self.mlp_only_layers
            and (index + 1) % self.decoder_sparse_step == 0
        )

    def moe_layers(self) -> list[int]:
        return [i for i in range(self.num_hidden_layers) if self.is_moe_layer(i)]

    def _mlp_parameters(self, index: int, active: bool = False) -> int:
        h = self.hidden_size
        if not self.is_moe_layer(index):
            return 3 * h * self.intermediate_size
        experts = self.num_experts_per_tok if active else self.num_experts
        shared = 3 * h * self.shared_expert_intermediate_size + (
            h if self.shared_expert_intermediate_size else 0
        )
        return experts * 3 * h * self.moe_intermediate_size + self.num_experts * h + shared

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Exact parameter count (tied embeddings counted once).

        ``exclude_embeddings`` leaves out the input embedding and, when untied, ``lm_head`` too — the
        "non-embedding" figure model cards quote (Qwen3-0.6B: 0.44B).
        """
        return self._count(exclude_embeddings, active=False)

    def num_active_parameters(self, exclude_embeddings: bool = False) -> int:
        """Parameters one token goes through: every dense weight, the routers, the shared experts and
        ``num_experts_per_tok`` routed experts per MoE layer (the "activated" figure MoE cards quote:
        Qwen3-30B-A3B 3.3B, Mixtral-8x7B 12.9B). Equals ``num_parameters`` for a dense model."""
        return self._count(exclude_embeddings, active=True)

    def _count(self, exclude_embeddings: bool, active: bool) -> int:
        h, q, kv, d = self.hidden_size, self.num_attention_heads, self.num_key_value_heads, self.head_dim
        attention = h * q * d + 2 * h * kv * d + q * d * h + (2 * d if self.qk_norm else 0)
        total = h  # final norm
        for index in range(self.num_hidden_layers):
            total += attention + self._mlp_parameters(index, active) + 2 * h  # two RMSNorm weights
        if not exclude_embeddings:
            total += self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return total

    def to_dict(self, full: bool = False) -> dict[str, Any]:
        """The fields as a plain dict; ``from_dict(to_dict())`` gives an equal config.

        Unless ``full``, ``head_dim`` and ``num_key_value_heads`` are left out where they hold their
        derived defaults (hidden/heads, heads), so that merging overrides into this dict
        (``{**preset.to_dict(), "hidden_size": 512}``) re-derives them instead of keeping stale ones.
        """
        data = dataclasses.asdict(self)
        if data["rope_scaling"] is not None:
            data["rope_scaling"] = dict(data["rope_scaling"])
        if not full:
            if self.head_dim * self.num_attention_heads == self.hidden_size:
                del data["head_dim"]
            if self.num_key_value_heads == self.num_attention_heads:
                del data["num_key_value_heads"]
            if not self.num_experts:  # a dense config reads (and hashes) as it did before MoE existed
                for name in MOE_DEFAULTS:
                    del data[name]
            elif self.moe_intermediate_size == self.intermediate_size:
                del data["moe_intermediate_size"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "model") -> ModelConfig:
        """Build from a mapping of field names; an unknown key is an error with a suggestion."""
        if not isinstance(data, Mapping):
            raise InputError(f"{source}: expected a mapping of model fields, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        for key in data:
            if key not in known:
                hint = difflib.get_close_matches(str(key), sorted(known), n=1)
                suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
                raise InputError(f"{source}: unknown model key {key!r}{suggestion}")
        try:
            return cls(**dict(data))
        except InputError as error:
            if source == "model":  # the message already reads "model.FIELD: ..."
                raise
            raise InputError(f"{source}: {error}") from None


def shape_mismatch(ours: ModelConfig, theirs: ModelConfig) -> tuple[str, Any, Any] | None:
    """The first shape field (:data:`SHAPE_FIELDS`) two configs disagree on, as (name, ours, theirs)."""
    for name in SHAPE_FIELDS:
        if getattr(ours, name) != getattr(theirs, name):
            return name, getattr(ours, name), getattr(theirs, name)
    return None


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"model.{name}: expected an integer, got {value!r}")
    if value < minimum:
        raise InputError(f"model.{name}: must be >= {minimum}, got {value}")
    limit = LIMITS.get(name)
    if limit is not None and value > limit:
        raise InputError(f"model.{name}: {value} is beyond the {limit} a config may ask for")


def _same_number(a: Any, b: Any) -> bool:
    a = _yaml_number(a)
    return isinstance(a, (int, float)) and isinstance(b, (int, float)) and float(a) == float(b)


def _yaml_number(value: Any) -> Any:
    """YAML 1.1 reads ``1e-5`` (no dot) as a string; accept such numeric strings for float fields."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _check_rope_scaling(scaling: Any, rope_theta: float) -> dict | None:
    if scaling is None:
        return None
    if not isinstance(scaling, Mapping):
        raise InputError(f"model.rope_scaling: expected a mapping or null, got {scaling!r}")
    scaling = dict(scaling)
    # transformers 5 keeps the base in the same mapping (rope_parameters): the model's rope_theta, once
    if "rope_theta" in scaling and not _same_number(scaling.pop("rope_theta"), rope_theta):
        raise InputError(f"model.rope_scaling.rope_theta: differs from model.rope_theta ({rope_theta:g})")
    # HF spells the kind "rope_type" (older configs: "type").
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise InputError(
            f"model.rope_scaling.rope_type: {kind!r} is not supported (one of {', '.join(ROPE_TYPES)})"
        )
    if "type" in scaling and "rope_type" in scaling and scaling["type"] != scaling["rope_type"]:
        raise InputError(
            f"model.rope_scaling: type {scaling['type']!r} and rope_type {kind!r} disagree (give one)"
        )
    scaling.pop("type", None)
    scaling["rope_type"] = kind
    needed = list(ROPE_KEYS[kind])
    # Only the keys the kind uses (transformers' validation lists the same): anything else would be
    # silently ignored, and a mapping of unchecked keys is unbounded input.
    extra = sorted(set(map(str, scaling)) - {"rope_type", *needed})
    if extra:
        hint = difflib.get_close_matches(extra[0], needed, n=1)
        uses = ", ".join(needed) if needed else "no other key"
        raise InputError(
            f"model.rope_scaling: unknown key {extra[0]!r} for rope_type {kind!r}"
            + (f" (did you mean {hint[0]!r}?)" if hint else "") + f"; it uses {uses}"
        )
    if kind == "default":
        return None
    for key in needed:
        value = scaling[key] = _yaml_number(scaling.get(key))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise InputError(f"model.rope_scaling.{key}: expected a positive number, got {value!r}")
    if kind == "llama3" and scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        raise InputError("model.rope_scaling: high_freq_factor must be greater than low_freq_factor")
    return scaling


__all__ = ["ModelConfig", "SHAPE_FIELDS", "MOE_DEFAULTS", "shape_mismatch"]
