"""The LLaMA-family decoder (dense, or with mixture-of-experts layers), its presets and Hugging Face interop.

``ModelConfig`` and ``load_model_config`` import without torch; ``LlamaForCausalLM`` and
``flops_per_token`` load torch on first use, so importing this package stays cheap for the CLI.
"""

from __future__ import annotations

from llmtools.model.config import ModelConfig
from llmtools.model.presets import list_presets, load_model_config

__all__ = ["ModelConfig", "load_model_config", "list_presets", "LlamaForCausalLM", "flops_per_token"]


def __getattr__(name: str):
    if name == "LlamaForCausalLM":
        from llmtools.model.llama import LlamaForCausalLM

        return LlamaForCausalLM
    if name == "flops_per_token":
        from llmtools.model.flops import flops_per_token

        return flops_per_token
    raise AttributeError(f"module 'llmtools.model' has no attribute {name!r}")
