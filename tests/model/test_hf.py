"""Hugging Face folders both ways: transformers' save_pretrained -> ours, our save_hf_folder -> transformers."""

from __future__ import annotations

import json

import pytest
import torch

from llmtools.errors import InputError, OutputExistsError
from llmtools.model.config import ModelConfig
from llmtools.model.hf import (
    TensorSource,
    from_hf_config,
    load_hf_model,
    load_hf_state_dict,
    load_hf_weights,
    save_hf_folder,
    to_hf_config,
)
from llmtools.model.llama import LlamaForCausalLM
from llmtools.model.presets import list_presets, load_model_config
from tests.numerics import logits_atol, mean_loss_atol

transformers = pytest.importorskip("transformers")

GQA = ModelConfig(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)
QWEN = ModelConfig(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    qk_norm=True,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
    max_position_embeddings=128,
)


def ids(n: int = 40, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 300, (2, n), generator=torch.Generator().manual_seed(seed))


def ours(config: ModelConfig, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def hf_from_pretrained(folder, **kwargs):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, **kwargs).eval()


@pytest.mark.numerics
@pytest.mark.parametrize(
    ("config", "shard"),
    [(GQA, "5GB"), (QWEN, "5GB"), (GQA, "60KB")],
    ids=["llama-gqa", "qwen3-tied", "sharded"],
)
def test_transformers_folder_loads_into_ours(tmp_path, config, shard):
    hf_config = transformers.AutoConfig.for_model(**to_hf_config(config))
    torch.manual_seed(1)
    hf = transformers.AutoModelForCausalLM.from_config(hf_config).eval()
    hf.save_pretrained(tmp_path / "hf", max_shard_size=shard)
    assert (tmp_path / "hf" / "model.safetensors.index.json").exists() == (shard != "5GB")
    model = load_hf_model(tmp_path / "hf")
    assert model.config == config
    with torch.no_grad():
        # fp32 decoder twice, in another op order: logits_atol's rounding model (tests/numerics.py)
        expected = hf(input_ids=ids()).logits
        torch.testing.assert_close(model(ids()), expected, atol=logits_atol(expected, hf.config), rtol=0)
    if config.tie_word_embeddings:
        assert model.lm_head.weight is model.model.embed_tokens.weight


@pytest.mark.numerics
@pytest.mark.parametrize("config", [GQA, QWEN], ids=["llama-gqa", "qwen3-tied"])
@pytest.mark.parametrize("shard_size", ["5GB", 40_000], ids=["single", "sharded"])
def test_our_folder_loads_in_transformers(tmp_path, config, shard_size):
    model = ours(config)
    out = save_hf_folder(
        model, config, tmp_path / "out", max_shard_size=shard_size, bos_token_id=1, eos_token_id=2
    )
    files = sorted(p.name for p in out.iterdir())
    if shard_size == "5GB":
        assert files == ["config.json", "generation_config.json", "model.safetensors"]
    else:
        index = json.loads((out / "model.safetensors.index.json").read_text())
        shards = sorted(set(index["weight_map"].values()))
        assert len(shards) > 2 and shards[0].endswith(f"-of-{len(shards):05d}.safetensors")
        assert index["metadata"]["total_size"] == sum(
            t.numel() * 4
            for n, t in model.state_dict().items()
            if not (n == "lm_head.weight" and config.tie_word_embeddings)
        )
    hf = hf_from_pretrained(out)
    assert type(hf).__name__ == ("Qwen3ForCausalLM" if config.qk_norm else "LlamaForCausalLM")
    with torch.no_grad():
        # fp32 decoder twice, in another op order: logits_atol's rounding model (tests/numerics.py)
        expected = model(ids())
        torch.testing.assert_close(
            hf(input_ids=ids()).logits, expected, atol=logits_atol(expected, config), rtol=0
        )
    assert hf.generation_config.eos_token_id == 2
    generated = hf.generate(ids(5), max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert generated.shape == (2, 9)


def test_round_trip_is_bitwise(tmp_path):
    model = ours(QWEN, seed=5)
    save_hf_folder(model, QWEN, tmp_path / "a", max_shard_size=30_000)
    back = load_hf_model(tmp_path / "a")
    for (name, a), b in zip(model.state_dict().items(), back.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    save_hf_folder(back, QWEN, tmp_path / "b", max_shard_size=30_000)
    for path in (tmp_path / "a").iterdir():
        assert path.read_bytes() == (tmp_path / "b" / path.name).read_bytes(), path.name


def test_bf16_export_loads_as_bf16(tmp_path):
    model = ours(GQA)
    save_hf_folder(model, GQA, tmp_path / "bf16", dtype="bfloat16")
    config = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16"
    state = load_hf_state_dict(tmp_path / "bf16")
    assert all(t.dtype == torch.bfloat16 for t in state.values())
    assert torch.equal(state["model.norm.weight"], model.model.norm.weight.to(torch.bfloat16))
    hf = hf_from_pretrained(tmp_path / "bf16", dtype=torch.bfloat16)
    assert hf.model.embed_tokens.weight.dtype == torch.bfloat16


def test_streaming_sources_are_loaded_one_at_a_time(tmp_path):
    model = ours(GQA)
    state = model.state_dict()
    loaded = []

    def source(name):
        def load():
            loaded.append(name)
            return state[name].clone()

        return TensorSource(tuple(state[name].shape), state[name].dtype, load)

    save_hf_folder({name: source(name) for name in state}, GQA, tmp_path / "s", max_shard_size=50_000)
    assert sorted(loaded) == sorted(state)  # each exactly once
    back = load_hf_state_dict(tmp_path / "s")
    assert all(torch.equal(back[n], state[n]) for n in state)

    class Lazy:  # any object with shape, dtype and load() streams the same way
        def __init__(self, tensor):
            self.shape, self.dtype, self._tensor = tuple(tensor.shape), tensor.dtype, tensor

        def load(self):
            return self._tensor

    save_hf_folder({n: Lazy(t) for n, t in state.items()}, GQA, tmp_path / "d", dtype="bf16")
    back = load_hf_state_dict(tmp_path / "d")
    assert all(torch.equal(back[n], state[n].to(torch.bfloat16)) for n in state)


@pytest.mark.numerics
def test_init_from_continues_from_the_same_loss(tmp_path):
    """--init-from: a folder written by transformers gives our model the very same loss."""
    torch.manual_seed(3)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**to_hf_config(GQA))).eval()
    hf.save_pretrained(tmp_path / "hf")
    batch = ids(33)
    hf_loss = hf(input_ids=batch, labels=batch).loss
    model = ours(GQA, seed=99)
    load_hf_weights(model, tmp_path / "hf")
    our_loss = model.loss(batch[:, :-1], batch[:, 1:])
    # fp32 token-mean loss from two implementations: mean_loss_atol (tests/numerics.py)
    torch.testing.assert_close(our_loss, hf_loss, atol=mean_loss_atol(hf_loss, batch[:, 1:].numel()), rtol=0)


def test_config_json_round_trips_for_every_preset():
    for name in list_presets():
        config = load_model_config(name)
        assert from_hf_config(to_hf_config(config)) == config, name
        # transformers reads it as the same architecture
        hf = transformers.AutoConfig.for_model(**to_hf_config(config))
        assert hf.num_key_value_heads == config.num_key_value_heads and hf.head_dim == config.head_dim


def test_transformers_v5_rope_parameters_are_read():
    config = load_model_config("1b")
    hf = transformers.AutoConfig.for_model(**to_hf_config(config)).to_dict()
    assert "rope_parameters" in hf  # transformers 5 spelling
    assert from_hf_config(hf) == config


# ---- errors ----------------------------------------------------------------------------------------


def test_unsupported_configs_are_refused_with_the_key():
    base = to_hf_config(GQA)
    with pytest.raises(InputError, match=r"\[model_type\]: 'gpt2' is not supported"):
        from_hf_config({**base, "model_type": "gpt2"})
    with pytest.raises(InputError, match=r"\[attention_bias\]"):
        from_hf_config({**base, "attention_bias": True})
    with pytest.raises(InputError, match=r"\[hidden_act\]"):
        from_hf_config({**base, "hidden_act": "gelu"})
    with pytest.raises(InputError, match=r"\[hidden_size\]: missing"):
        from_hf_config({k: v for k, v in base.items() if k != "hidden_size"})


def test_folder_errors(tmp_path):
    with pytest.raises(InputError, match="no model.safetensors"):
        load_hf_state_dict(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not safetensors at all")
    with pytest.raises(InputError, match="model.safetensors: cannot read weights"):
        load_hf_state_dict(tmp_path)
    with pytest.raises(InputError, match="config.json: missing"):
        load_hf_model(tmp_path)


def test_missing_shard_is_named(tmp_path):
    save_hf_folder(ours(GQA), GQA, tmp_path / "m", max_shard_size=40_000)
    shard = sorted((tmp_path / "m").glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(InputError, match=f"names shard {shard.name}, which is missing"):
        load_hf_state_dict(tmp_path / "m")


def test_shape_and_name_mismatches(tmp_path):
    save_hf_folder(ours(GQA), GQA, tmp_path / "m")
    other = ModelConfig(**{**GQA.to_dict(), "intermediate_size": 128})
    with pytest.raises(
        InputError, match=r"config.json\[intermediate_size\]: 160 but the model config has 128"
    ):
        load_hf_weights(LlamaForCausalLM(other), tmp_path / "m")
    state = ours(GQA).state_dict()
    del state["model.norm.weight"]
    with pytest.raises(InputError, match="'model.norm.weight' missing"):
        save_hf_folder(state, GQA, tmp_path / "x")
    state = {**ours(GQA).state_dict(), "model.extra.weight": torch.zeros(1)}
    with pytest.raises(InputError, match="unexpected tensor 'model.extra.weight'"):
        save_hf_folder(state, GQA, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_existing_folder_needs_force(tmp_path):
    model = ours(GQA)
    save_hf_folder(model, GQA, tmp_path / "m")
    with pytest.raises(OutputExistsError):
        save_hf_folder(model, GQA, tmp_path / "m")
    save_hf_folder(model, GQA, tmp_path / "m", force=True, extra_files={"notes.txt": __file__})
    assert (tmp_path / "m" / "notes.txt").exists()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


# config.json files as published on the Hugging Face Hub (transformers 4.x spelling).
LLAMA_32_1B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}
QWEN3_06B = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
LLAMA_3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}


@pytest.mark.parametrize(
    ("published", "preset"), [(LLAMA_32_1B, "1b"), (QWEN3_06B, "qwen3-0.6b"), (LLAMA_3_8B, "llama3-8b")]
)
def test_published_config_json_equals_our_preset(published, preset):
    assert from_hf_config(published) == load_model_config(preset)
    ours = to_hf_config(
        load_model_config(preset),
        dtype="bfloat16",
        bos_token_id=published["bos_token_id"],
        eos_token_id=published["eos_token_id"],
    )
    shared = set(ours) & set(published) - {"transformers_version"}
    assert {k: ours[k] for k in shared} == {k: published[k] for k in shared}
