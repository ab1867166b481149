"""Real presets have the published parameter counts (counted on the meta device: nothing allocated)."""

from __future__ import annotations

import pytest
import torch

from llmtools.model.llama import LlamaForCausalLM
from llmtools.model.presets import list_presets, load_model_config, preset_metadata

# Exact counts of the reference checkpoints (sum of tensor sizes in their safetensors files,
# a tied lm_head counted once); the cards round these to 8.03B, 1.23B, 0.6B (0.44B non-embedding).
EXACT = {"llama3-8b": 8_030_261_248, "1b": 1_235_814_400, "qwen3-0.6b": 596_049_920}


def test_presets_are_listed():
    assert {"tiny", "125m", "1b", "llama3-8b", "qwen3-0.6b"} <= set(list_presets())


@pytest.mark.parametrize("name", ["125m", "1b", "llama3-8b", "qwen3-0.6b"])
def test_parameter_count_matches_published(name):
    config = load_model_config(name)
    published = preset_metadata(name)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    counted = model.num_parameters()
    assert counted == config.num_parameters()
    # published parameter counts are rounded figures: the preset's own stated tolerance
    assert counted == pytest.approx(published["parameters"], rel=published["tolerance"])
    if name in EXACT:
        assert counted == EXACT[name]
    if "non_embedding_parameters" in published:
        # published parameter counts are rounded figures: the preset's own stated tolerance
        assert model.num_parameters(exclude_embeddings=True) == pytest.approx(
            published["non_embedding_parameters"], rel=published["tolerance"]
        )


def test_qwen3_06b_non_embedding_is_044b():
    config = load_model_config("qwen3-0.6b")
    assert config.num_parameters(exclude_embeddings=True) == 440_467_456
    assert config.qk_norm and config.tie_word_embeddings and config.head_dim == 128


def test_tiny_is_a_few_million_and_fits_a_4096_vocabulary():
    config = load_model_config("tiny")
    assert 1_000_000 < config.num_parameters() < 10_000_000
    assert config.vocab_size == 4096
    assert config.num_key_value_heads < config.num_attention_heads  # exercises GQA


def test_tiny_trains_a_few_steps_and_the_loss_falls():
    torch.manual_seed(0)
    model = LlamaForCausalLM(load_model_config("tiny"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    # A repeating pattern is learnable within a few steps.
    ids = torch.arange(33).repeat(4, 1) % 17
    losses = []
    for _ in range(15):
        loss = model.loss(ids[:, :-1], ids[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(8.3, abs=0.3)  # ln(4096) at init
    assert losses[-1] < 0.5 * losses[0]
