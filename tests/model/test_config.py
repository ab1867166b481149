"""ModelConfig validates itself; load_model_config reads presets, files, HF config.json, mappings."""

from __future__ import annotations

import json

import pytest

from llmtools.errors import InputError
from llmtools.model.config import ModelConfig
from llmtools.model.presets import load_model_config


def test_defaults_resolve_head_dim_and_kv_heads():
    config = ModelConfig(hidden_size=256, num_attention_heads=8)
    assert config.head_dim == 32
    assert config.num_key_value_heads == 8
    assert config.num_key_value_groups == 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"hidden_size": 0}, "model.hidden_size: must be >= 1"),
        ({"hidden_size": "big"}, "model.hidden_size: expected an integer"),
        ({"num_layers": 2}, None),
        ({"num_attention_heads": 6, "num_key_value_heads": 4}, "does not divide"),
        ({"hidden_size": 100, "num_attention_heads": 6}, "not a multiple of num_attention_heads"),
        ({"rope_theta": -1.0}, "model.rope_theta: must be > 0"),
        ({"tie_word_embeddings": "yes"}, "model.tie_word_embeddings: expected true or false"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4}}, "'yarn' is not supported"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8}}, "rope_scaling.low_freq_factor"),
        ({"head_dim": 33}, "must be even"),
    ],
)
def test_bad_values_name_the_field(fields, message):
    with pytest.raises(InputError) as info:
        ModelConfig.from_dict(fields) if "num_layers" in fields else ModelConfig(**fields)
    if message is None:  # unknown key: a suggestion
        assert "unknown model key 'num_layers'" in str(info.value)
        assert "did you mean 'num_hidden_layers'" in str(info.value)
    else:
        assert message in str(info.value)


def test_preset_by_name_and_typo_suggestion():
    assert load_model_config("tiny").vocab_size == 4096
    with pytest.raises(InputError, match="did you mean 'tiny'"):
        load_model_config("tinyy")


def test_yaml_file_with_model_key_and_inline_mapping(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("model:\n  hidden_size: 64\n  num_attention_heads: 4\n  intermediate_size: 128\n")
    config = load_model_config(path)
    assert (config.hidden_size, config.head_dim) == (64, 16)
    assert load_model_config({"hidden_size": 64, "num_attention_heads": 2}).head_dim == 32
    bad = tmp_path / "bad.yaml"
    bad.write_text("hidden_size: 64\nnum_heads: 4\n")
    with pytest.raises(InputError, match=r"bad.yaml: unknown model key 'num_heads'"):
        load_model_config(bad)
    broken = tmp_path / "broken.yaml"
    broken.write_text("hidden_size: [64\n")
    with pytest.raises(InputError, match=r"broken.yaml:\d+: not valid YAML"):
        load_model_config(broken)


def test_hf_folder_is_read_through_its_config_json(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen3",
                "vocab_size": 1000,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 32,
                "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
                "tie_word_embeddings": True,
            }
        )
    )
    config = load_model_config(tmp_path)
    assert (
        config.qk_norm and config.head_dim == 32 and config.rope_theta == 1e6 and config.rope_scaling is None
    )


def test_to_dict_round_trips():
    config = load_model_config("1b")
    assert ModelConfig.from_dict(config.to_dict()) == config
    assert config.to_dict()["rope_scaling"]["rope_type"] == "llama3"


def test_overrides_merged_into_to_dict_rederive_head_dim():
    base = load_model_config("125m").to_dict()
    assert "head_dim" not in base and "num_key_value_heads" not in base  # derived, so left out
    wider = ModelConfig.from_dict({**base, "hidden_size": 1024, "num_attention_heads": 8})
    assert (wider.head_dim, wider.num_key_value_heads) == (128, 8)
    qwen = load_model_config("qwen3-0.6b")
    assert qwen.to_dict()["head_dim"] == 128  # explicit (not hidden/heads): kept
    assert qwen.to_dict(full=True)["num_key_value_heads"] == 8
    assert ModelConfig.from_dict(load_model_config("tiny").to_dict(full=True)) == load_model_config("tiny")
