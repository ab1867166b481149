"""The MoE families against transformers: same weights -> same fp32 logits, losses and gradients; HF
folders both ways in save_pretrained's per-expert layout; routing, capacity and the auxiliary losses."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from llmtools.errors import InputError
from llmtools.model.config import ModelConfig
from llmtools.model.hf import (
    from_hf_config,
    load_hf_model,
    load_hf_state_dict,
    load_hf_weights,
    save_hf_folder,
    to_hf_config,
)
from llmtools.model.hf_layout import saved_names
from llmtools.model.llama import LlamaForCausalLM
from llmtools.model.moe import route
from llmtools.model.presets import load_model_config, preset_metadata
from tests.numerics import logits_atol, mean_loss_atol

transformers = pytest.importorskip("transformers")

SMALL = dict(
    vocab_size=300, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128
)
# Qwen3-MoE: QK-norm, GQA, head_dim > hidden/heads, one dense layer (mlp_only_layers), untied (as the 30B).
QWEN3_MOE = ModelConfig(
    **SMALL,
    intermediate_size=96,
    num_hidden_layers=3,
    head_dim=32,
    qk_norm=True,
    rms_norm_eps=1e-6,
    num_experts=6,
    num_experts_per_tok=2,
    moe_intermediate_size=40,
    mlp_only_layers=[1],
)
# Qwen3-MoE as its smaller cards: tied embeddings, top-k not renormalised.
QWEN3_MOE_TIED = ModelConfig(
    **SMALL,
    intermediate_size=96,
    num_hidden_layers=2,
    qk_norm=True,
    tie_word_embeddings=True,
    num_experts=5,
    num_experts_per_tok=3,
    moe_intermediate_size=24,
    norm_topk_prob=False,
)
# Mixtral: no QK-norm, GQA, untied, experts as wide as intermediate_size.
MIXTRAL = ModelConfig(
    **SMALL, intermediate_size=48, num_hidden_layers=2, num_experts=4, num_experts_per_tok=2
)
# Qwen2-MoE: a gated shared expert beside the routed ones.
QWEN2_MOE = ModelConfig(
    **SMALL,
    intermediate_size=96,
    num_hidden_layers=2,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
    norm_topk_prob=False,
)
FAMILIES = {
    "qwen3_moe": QWEN3_MOE,
    "qwen3_moe-tied": QWEN3_MOE_TIED,
    "mixtral": MIXTRAL,
    "qwen2_moe": QWEN2_MOE,
}
HF_CLASS = {
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
}


def ids(n: int = 24, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 300, (2, n), generator=torch.Generator().manual_seed(seed))


def ours(config: ModelConfig, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def hf_twin(model: LlamaForCausalLM):
    """transformers' model of the same family, holding our weights (loaded by name, strictly)."""
    hf = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**to_hf_config(model.config))
    )
    hf.load_state_dict(model.state_dict(), strict=True)
    return hf


@pytest.mark.numerics
@pytest.mark.parametrize("config", FAMILIES.values(), ids=FAMILIES.keys())
def test_logits_loss_and_gradients_equal_transformers(config):
    model = ours(config)
    hf = hf_twin(model)
    assert type(hf).__name__ == HF_CLASS[config.model_type]
    assert dict(model.named_parameters()).keys() == dict(hf.named_parameters()).keys()
    batch = ids()
    # transformers' loss with output_router_logits: cross-entropy (labels shifted inside) +
    # router_aux_loss_coef * load balancing over every position.
    theirs = hf(input_ids=batch, labels=batch, output_router_logits=True)
    out = model(batch, output_router=True)
    # fp32 decoder twice, in another op order: logits_atol's rounding model (tests/numerics.py)
    torch.testing.assert_close(out.logits, theirs.logits, atol=logits_atol(theirs.logits, hf.config), rtol=0)
    # fp32 router softmax means: aux loss ~1, coefficient 1e-2; rtol 1e-6 is ~8 fp32 ulps
    torch.testing.assert_close(
        out.aux_loss, config.router_aux_loss_coef * theirs.aux_loss, atol=1e-8, rtol=1e-6
    )
    ce = F.cross_entropy(out.logits[:, :-1].float().flatten(0, 1), batch[:, 1:].flatten())
    loss = ce + out.aux_loss
    # fp32 token-mean loss from two implementations: mean_loss_atol (tests/numerics.py)
    torch.testing.assert_close(
        loss, theirs.loss, atol=mean_loss_atol(theirs.loss, batch[:, 1:].numel()), rtol=0
    )
    loss.backward()
    theirs.loss.backward()
    hf_params = dict(hf.named_parameters())
    for name, param in model.named_parameters():
        # fp32 gradients through the same decoder: the forward's ~4e-6 relative per layer, back again: rtol 1e-4 covers it, atol for entries near 0
        torch.testing.assert_close(param.grad, hf_params[name].grad, atol=1e-5, rtol=1e-4, msg=name)
    # Without the router output the model returns plain logits.
    with torch.no_grad():
        # fp32 decoder twice, in another op order: logits_atol's rounding model (tests/numerics.py)
        torch.testing.assert_close(
            model(batch), theirs.logits, atol=logits_atol(theirs.logits, hf.config), rtol=0
        )


@pytest.mark.numerics
@pytest.mark.parametrize("config", [QWEN3_MOE, MIXTRAL, QWEN2_MOE], ids=["qwen3_moe", "mixtral", "qwen2_moe"])
def test_save_pretrained_folder_loads_into_ours_and_ours_loads_in_transformers(tmp_path, config):
    model = ours(config, seed=1).eval()
    hf = hf_twin(model).eval()
    hf.save_pretrained(tmp_path / "theirs", max_shard_size="100KB")
    saved = set(load_hf_state_dict(tmp_path / "theirs"))
    assert saved == set(saved_names(config))  # the per-expert layout, as transformers writes it
    back = load_hf_model(tmp_path / "theirs")
    assert back.config == config
    for (name, a), b in zip(model.state_dict().items(), back.state_dict().values(), strict=True):
        assert torch.equal(a, b), name

    save_hf_folder(model, config, tmp_path / "ours", max_shard_size=60_000, bos_token_id=1, eos_token_id=2)
    assert set(load_hf_state_dict(tmp_path / "ours")) == saved
    index = json.loads((tmp_path / "ours" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours").eval()
    assert type(loaded).__name__ == HF_CLASS[config.model_type]
    with torch.no_grad():
        # fp32 decoder twice, in another op order: logits_atol's rounding model (tests/numerics.py)
        expected = model(ids())
        torch.testing.assert_close(
            loaded(input_ids=ids()).logits, expected, atol=logits_atol(expected, config), rtol=0
        )
    generated = loaded.generate(ids(5), max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert generated.shape == (2, 9)


def test_fused_layout_folder_and_bitwise_round_trip(tmp_path):
    model = ours(QWEN3_MOE_TIED, seed=2)
    hf_twin(model).save_pretrained(tmp_path / "fused", save_original_format=False)
    assert "model.layers.0.mlp.experts.gate_up_proj" in load_hf_state_dict(tmp_path / "fused")
    back = load_hf_model(tmp_path / "fused")
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), back.state_dict().values(), strict=True)
    )
    assert back.lm_head.weight is back.model.embed_tokens.weight
    save_hf_folder(back, back.config, tmp_path / "a", max_shard_size=30_000)
    save_hf_folder(load_hf_model(tmp_path / "a"), back.config, tmp_path / "b", max_shard_size=30_000)
    for path in (tmp_path / "a").iterdir():
        assert path.read_bytes() == (tmp_path / "b" / path.name).read_bytes(), path.name


def test_streamed_expert_slices_load_each_fused_tensor_once(tmp_path):
    model = ours(MIXTRAL)
    loads = []

    class Lazy:  # a checkpoint reader's tensor without slice(): loaded once, cut into experts
        def __init__(self, name, tensor):
            self.name, self.shape, self.dtype, self.tensor = name, tuple(tensor.shape), tensor.dtype, tensor

        def load(self):
            loads.append(self.name)
            return self.tensor

    state = {n: Lazy(n, t) for n, t in model.state_dict().items()}
    save_hf_folder(state, MIXTRAL, tmp_path / "m", dtype="bf16")
    assert sorted(loads) == sorted(state)
    saved = load_hf_state_dict(tmp_path / "m")
    w1 = saved["model.layers.1.block_sparse_moe.experts.3.w1.weight"]
    assert torch.equal(w1, model.model.layers[1].mlp.experts.gate_up_proj[3, :48].to(torch.bfloat16))


@pytest.mark.numerics
def test_init_from_a_mixtral_folder_gives_transformers_loss(tmp_path):
    torch.manual_seed(3)
    hf = transformers.MixtralForCausalLM(transformers.MixtralConfig(**to_hf_config(MIXTRAL))).eval()
    hf.save_pretrained(tmp_path / "hf")
    batch = ids(17)
    model = ours(MIXTRAL, seed=99)
    load_hf_weights(model, tmp_path / "hf")
    hf_loss = hf(input_ids=batch, labels=batch).loss
    tol = mean_loss_atol(hf_loss, batch[:, 1:].numel())
    # fp32 token-mean loss from two implementations: mean_loss_atol (tests/numerics.py)
    torch.testing.assert_close(model.loss(batch[:, :-1], batch[:, 1:]), hf_loss, atol=tol, rtol=0)


def test_dense_folder_into_a_moe_model_is_refused(tmp_path):
    dense = ModelConfig(**SMALL, intermediate_size=48, num_hidden_layers=2)
    save_hf_folder(ours(dense), dense, tmp_path / "dense")
    with pytest.raises(InputError, match=r"config.json\[num_experts\]: 0 but the model config has 4"):
        load_hf_weights(ours(MIXTRAL), tmp_path / "dense")


# ---- routing ------------------------------------------------------------------------------------------


def test_capacity_drops_the_least_probable_assignments():
    probs = torch.tensor(
        [[0.7, 0.2, 0.1], [0.6, 0.3, 0.1], [0.5, 0.1, 0.4], [0.1, 0.2, 0.7]], dtype=torch.float32
    )
    dropless = route(probs, 1, False, None, None)
    assert dropless.counts.tolist() == [3, 0, 1]
    # capacity ceil(0.75 * 4 * 1 / 3) = 1: expert 0 keeps only its most probable token (token 0)
    capped = route(probs, 1, False, 0.75, None)
    assert capped.counts.tolist() == [1, 0, 1] and capped.chosen.tolist() == [3, 0, 1]
    assert sorted(capped.token.tolist()) == [0, 3]
    # padding (token 0) yields its place to real tokens
    padded = route(probs, 1, False, 0.75, torch.tensor([False, True, True, True]))
    assert sorted(padded.token.tolist()) == [1, 3]


@pytest.mark.numerics
def test_dropped_tokens_keep_only_the_residual_and_are_counted():
    config = ModelConfig(**{**MIXTRAL.to_dict(), "moe_capacity_factor": 0.25})
    model = ours(config)
    block = model.model.layers[0].mlp
    x = torch.randn(2, 16, 64)
    out, info = block(x)
    capacity = 4  # ceil(0.25 x 32 tokens x top-2 / 4 experts)
    assert (
        info.counts.sum() == 64 and info.dropped == (info.counts - info.counts.clamp(max=capacity)).sum() > 0
    )
    # a token none of whose assignments survived gets exactly zero from the block
    routing = route(torch.softmax(block.gate(x.reshape(-1, 64)), -1), 2, True, 0.25, None)
    lost = sorted(set(range(32)) - set(routing.token.tolist()))
    assert lost and torch.all(out.reshape(-1, 64)[lost] == 0)
    dropless = ModelConfig(**{**MIXTRAL.to_dict(), "moe_capacity_factor": 100.0})
    big = ours(dropless).model.layers[0].mlp
    big.load_state_dict(ours(MIXTRAL).model.layers[0].mlp.state_dict())
    reference = ours(MIXTRAL).model.layers[0].mlp
    # bitwise: a capacity no expert reaches drops nothing, so the same rows meet the same weights in the same kernels
    torch.testing.assert_close(big(x)[0], reference(x)[0], atol=0, rtol=0)


@pytest.mark.numerics
def test_padding_is_left_out_of_the_router_losses():
    model = ours(QWEN3_MOE_TIED)
    batch = ids(12)
    segments = torch.ones_like(batch)
    segments[:, 8:] = 0  # the last 4 positions are padding
    masked = model(batch, segment_ids=segments, output_router=True)
    assert masked.router.tokens.tolist() == [16.0, 16.0]
    assert masked.router.counts.sum(-1).tolist() == [48.0, 48.0]  # 16 tokens x top-3
    # the same tokens alone (without the padding) give the same load-balancing loss
    alone = model(batch[:, :8], output_router=True)
    # fp32 means over the same tokens, padding excluded by a mask: a few ulps of an O(1) loss
    torch.testing.assert_close(masked.aux_loss, alone.aux_loss, atol=1e-7, rtol=1e-6)


@pytest.mark.numerics
def test_z_loss_and_per_layer_statistics():
    config = ModelConfig(**{**QWEN3_MOE.to_dict(), "router_z_loss_coef": 0.5, "router_aux_loss_coef": 0.0})
    model = ours(config)
    out = model(ids(), output_router=True)
    stats = out.router
    assert stats.counts.shape == (2, 6)  # two MoE layers (layer 1 is dense), six experts
    assert torch.equal(stats.counts.sum(-1), torch.tensor([96.0, 96.0]))  # 48 tokens x top-2
    assert stats.dropped.tolist() == [0.0, 0.0]
    # the same fp32 z-loss mean computed twice: default fp32 tolerance (~11 ulps)
    torch.testing.assert_close(out.aux_loss, 0.5 * stats.z_loss.mean())
    assert torch.all(stats.balance >= 1.0)  # E * sum(f * P) >= 1 for top-2 (k at perfect balance)


def test_dense_model_has_no_router_output():
    out = ours(ModelConfig(**SMALL, intermediate_size=48, num_hidden_layers=1))(ids(), output_router=True)
    assert out.aux_loss is None and out.router is None and out.logits.shape == (2, 24, 300)


@pytest.mark.numerics
def test_activation_checkpointing_gives_the_same_gradients():
    model = ours(QWEN3_MOE)
    batch = ids()

    def grads():
        model.zero_grad()
        out = model(batch[:, :-1], output_router=True)
        (F.cross_entropy(out.logits.flatten(0, 1), batch[:, 1:].flatten()) + out.aux_loss).backward()
        return [p.grad.clone() for p in model.parameters()]

    plain = grads()
    model.gradient_checkpointing = True
    for a, b in zip(plain, grads(), strict=True):
        # fp32: recomputed activations are the same kernels on the same inputs; gradients accumulate in another order: 1e-7 on entries ~1e-2
        torch.testing.assert_close(a, b, atol=1e-7, rtol=0)


# ---- configs and presets -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_experts": 4, "num_experts_per_tok": 5}, "num_experts_per_tok: 5 is more than num_experts 4"),
        ({"num_experts": 4, "num_experts_per_tok": 0}, "num_experts_per_tok: must be >= 1"),
        ({"num_experts": -1}, "num_experts: must be >= 0"),
        ({"num_experts_per_tok": 4}, "num_experts_per_tok: only for mixture-of-experts models"),
        ({"moe_capacity_factor": 1.25}, "moe_capacity_factor: only for mixture-of-experts models"),
        ({"num_experts": 4, "moe_capacity_factor": 0}, "moe_capacity_factor: must be > 0"),
        ({"num_experts": 4, "router_aux_loss_coef": -1}, "router_aux_loss_coef: must be >= 0"),
        ({"num_experts": 4, "mlp_only_layers": [7]}, "mlp_only_layers[0]: layer 7 does not exist"),
        ({"num_experts": 4, "qk_norm": True, "mlp_only_layers": [0, 1]}, "no layer is left a MoE layer"),
        ({"num_experts": 4, "norm_topk_prob": False}, "Mixtral-family models"),
        ({"num_experts": 4, "moe_intermediate_size": 32}, "moe_intermediate_size: Mixtral-family"),
        (
            {"num_experts": 4, "qk_norm": True, "shared_expert_intermediate_size": 8},
            "a shared expert with qk_norm matches no transformers family",
        ),
    ],
)
def test_bad_moe_configs_name_the_field(fields, message):
    with pytest.raises(InputError) as info:
        ModelConfig(**{**SMALL, "intermediate_size": 48, "num_hidden_layers": 2, **fields})
    assert message in str(info.value)


def test_dense_config_dict_is_unchanged_by_moe():
    dense = load_model_config("tiny").to_dict()
    assert not any(key.startswith(("num_experts", "moe_", "router_")) for key in dense)
    assert "num_experts" in load_model_config("tiny").to_dict(full=True)


# Exact counts (sum of the published safetensors' tensor sizes); the cards round to 30.5B / 3.3B active
# and 46.7B / 12.9B active.
EXACT = {
    "qwen3-30b-a3b": (30_532_122_624, 3_353_032_704),
    "mixtral-8x7b": (46_702_792_704, 12_879_925_248),
}


@pytest.mark.parametrize("name", EXACT)
def test_moe_presets_match_published_totals_and_active_counts(name):
    config = load_model_config(name)
    published = preset_metadata(name)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    assert model.num_parameters() == config.num_parameters() == EXACT[name][0]
    assert config.num_active_parameters() == EXACT[name][1]
    # published parameter counts are rounded figures: the preset's own stated tolerance
    assert config.num_parameters() == pytest.approx(published["parameters"], rel=published["tolerance"])
    # published parameter counts are rounded figures: the preset's own stated tolerance
    assert config.num_active_parameters() == pytest.approx(
        published["active_parameters"], rel=published.get("active_tolerance", published["tolerance"])
    )


def test_tiny_moe_preset():
    config = load_model_config("tiny-moe")
    assert config.model_type == "qwen3_moe" and config.moe_layers() == [0, 1, 2, 3]
    assert 5_000_000 < config.num_parameters() < 10_000_000
    assert config.num_active_parameters() < config.num_parameters() / 2


QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "output_router_logits": False,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.36.0.dev0",
    "use_cache": True,
    "vocab_size": 32000,
}


@pytest.mark.parametrize(
    ("published", "preset"), [(QWEN3_30B_A3B, "qwen3-30b-a3b"), (MIXTRAL_8X7B, "mixtral-8x7b")]
)
def test_published_moe_config_json_equals_our_preset(published, preset):
    config = load_model_config(preset)
    assert from_hf_config(published) == config
    ours_json = to_hf_config(config, dtype="bfloat16", bos_token_id=published["bos_token_id"], eos_token_id=2)
    shared = set(ours_json) & set(published) - {"transformers_version", "eos_token_id"}
    assert {k: ours_json[k] for k in shared} == {k: published[k] for k in shared}
    hf = transformers.AutoConfig.for_model(**ours_json)
    assert type(hf).__name__ == {"qwen3_moe": "Qwen3MoeConfig", "mixtral": "MixtralConfig"}[config.model_type]


def test_unsupported_moe_config_json_is_refused():
    with pytest.raises(InputError, match=r"\[qkv_bias\]: q/k/v biases are not supported"):
        from_hf_config({**to_hf_config(QWEN2_MOE), "qkv_bias": True})
    with pytest.raises(InputError, match=r"\[sliding_window\]: 4096 is not supported"):
        from_hf_config({**MIXTRAL_8X7B, "sliding_window": 4096})
    with pytest.raises(InputError, match=r"\[router_jitter_noise\]"):
        from_hf_config({**MIXTRAL_8X7B, "router_jitter_noise": 0.01})
