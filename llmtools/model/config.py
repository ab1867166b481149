"""The shape of a LLaMA-family decoder (the presets in ``configs/models/`` are read by :mod:`.presets`).

Field names are Hugging Face's (``LlamaConfig`` / ``Qwen3Config``), so a ``config.json`` maps onto
this class by name and a preset reads like the model card it came from. The class checks itself:
a bad value raises :class:`~llmtools.errors.InputError` naming the field.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmtools.errors import InputError

ROPE_TYPES = ("default", "linear", "llama3")


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
)


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
            setattr(self, name, float(value))
        for name in ("tie_word_embeddings", "qk_norm"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"model.{name}: expected true or false, got {getattr(self, name)!r}")
        self.rope_scaling = _check_rope_scaling(self.rope_scaling)

    # ---- derived quantities ------------------------------------------------------------------------

    @property
    def num_key_value_groups(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Exact parameter count (tied embeddings counted once).

        ``exclude_embeddings`` leaves out the input embedding and, when untied, ``lm_head`` too — the
        "non-embedding" figure model cards quote (Qwen3-0.6B: 0.44B).
        """
        h, q, kv, d = self.hidden_size, self.num_attention_heads, self.num_key_value_heads, self.head_dim
        attention = h * q * d + 2 * h * kv * d + q * d * h + (2 * d if self.qk_norm else 0)
        mlp = 3 * h * self.intermediate_size
        per_layer = attention + mlp + 2 * h  # two RMSNorm weights
        total = self.num_hidden_layers * per_layer + h  # final norm
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
            raise InputError(f"{source}: {error}") from None


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"model.{name}: expected an integer, got {value!r}")
    if value < minimum:
        raise InputError(f"model.{name}: must be >= {minimum}, got {value}")


def _yaml_number(value: Any) -> Any:
    """YAML 1.1 reads ``1e-5`` (no dot) as a string; accept such numeric strings for float fields."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _check_rope_scaling(scaling: Any) -> dict | None:
    if scaling is None:
        return None
    if not isinstance(scaling, Mapping):
        raise InputError(f"model.rope_scaling: expected a mapping or null, got {scaling!r}")
    scaling = dict(scaling)
    # HF spells the kind "rope_type" (older configs: "type").
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise InputError(
            f"model.rope_scaling.rope_type: {kind!r} is not supported (one of {', '.join(ROPE_TYPES)})"
        )
    scaling.pop("type", None)
    scaling["rope_type"] = kind
    if kind == "default":
        return None
    needed = ["factor"]
    if kind == "llama3":
        needed += ["low_freq_factor", "high_freq_factor", "original_max_position_embeddings"]
    for key in needed:
        value = scaling[key] = _yaml_number(scaling.get(key))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise InputError(f"model.rope_scaling.{key}: expected a positive number, got {value!r}")
    if kind == "llama3" and scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        raise InputError("model.rope_scaling: high_freq_factor must be greater than low_freq_factor")
    return scaling


__all__ = ["ModelConfig", "SHAPE_FIELDS"]
