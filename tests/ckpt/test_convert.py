"""Conversion: the streaming reader equals DeepSpeed's zero_to_fp32; HF folders load in transformers."""

from __future__ import annotations

import json

import pytest

from llmtools.ckpt.convert import import_hf, to_hf, to_safetensors
from llmtools.ckpt.manager import CheckpointManager
from llmtools.ckpt.reader import CheckpointReader
from llmtools.errors import InputError, UsageError
from tests.ckpt import worker
from tests.numerics import logits_atol

QWEN_LIKE = dict(worker.TINY_LLAMA, qk_norm=True, tie_word_embeddings=True, head_dim=12)
MIXTRAL_LIKE = dict(worker.TINY_LLAMA, num_experts=4, num_experts_per_tok=2)
QWEN3_MOE_LIKE = dict(QWEN_LIKE, num_experts=5, num_experts_per_tok=3, moe_intermediate_size=20)


def _save_llama(run, zero, model=None, steps=2):
    engine = worker.build_llama_engine(zero, model)
    for step in range(1, steps + 1):
        worker.llama_step(engine, step)
    manager = CheckpointManager(run)
    client = worker.client_state(steps)
    client["model"] = engine.module.config.to_dict()
    path = manager.save(engine, steps, client)
    return engine, path


def _zero_to_fp32(path):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(str(path.parent), tag=path.name)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_reader_equals_live_weights_and_zero_to_fp32(tmp_path, ds_world, zero):
    import torch

    engine, path = _save_llama(tmp_path / "run", zero)
    live = worker.full_weights(engine)
    with CheckpointReader(path) as reader:
        ours = {name: source.load() for name, source in reader.sources().items()}
        assert reader.zero_stage == zero and reader.world_size == 1
    assert set(live) <= set(ours)
    for name, tensor in live.items():
        assert torch.equal(ours[name], tensor), name
    if zero > 0:
        reference = _zero_to_fp32(path)
        assert set(reference) == set(ours)
        assert all(torch.equal(reference[k].contiguous(), ours[k]) for k in reference)


@pytest.fixture(scope="module")
def llama_ckpt(tmp_path_factory, ds_world):
    run = tmp_path_factory.mktemp("llama") / "run"
    engine, path = _save_llama(run, 3)
    return path, worker.full_weights(engine)


@pytest.fixture(scope="module")
def qwen_ckpt(tmp_path_factory, ds_world):
    run = tmp_path_factory.mktemp("qwen") / "run"
    engine, path = _save_llama(run, 2, QWEN_LIKE)
    return path, worker.full_weights(engine)


@pytest.fixture(scope="module")
def mixtral_ckpt(tmp_path_factory, ds_world):
    run = tmp_path_factory.mktemp("mixtral") / "run"
    engine, path = _save_llama(run, 3, MIXTRAL_LIKE)
    return path, worker.full_weights(engine)


@pytest.fixture(scope="module")
def qwen3_moe_ckpt(tmp_path_factory, ds_world):
    run = tmp_path_factory.mktemp("qwen3moe") / "run"
    engine, path = _save_llama(run, 2, QWEN3_MOE_LIKE)
    return path, worker.full_weights(engine)


def _our_model(weights, model):
    import torch

    from llmtools.model import LlamaForCausalLM, load_model_config

    config = load_model_config(dict(model))
    net = LlamaForCausalLM(config)
    state = {k: v for k, v in weights.items()}
    net.load_state_dict(state, strict=False)
    if config.tie_word_embeddings:
        net.lm_head.weight = net.model.embed_tokens.weight
    net.eval()
    with torch.no_grad():
        for name, param in net.named_parameters():
            assert torch.equal(param, weights[name]), name
    return net


@pytest.mark.numerics
@pytest.mark.parametrize(
    "which, model",
    [
        ("llama_ckpt", worker.TINY_LLAMA),
        ("qwen_ckpt", QWEN_LIKE),
        ("mixtral_ckpt", MIXTRAL_LIKE),
        ("qwen3_moe_ckpt", QWEN3_MOE_LIKE),
    ],
)
def test_hf_export_loads_in_transformers_with_equal_logits(request, tmp_path, which, model):
    import torch
    import transformers

    path, weights = request.getfixturevalue(which)
    out = to_hf(path, tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    family = ("qwen3" if model.get("qk_norm") else "llama") if not model.get("num_experts") else None
    family = family or ("qwen3_moe" if model.get("qk_norm") else "mixtral")
    assert config["model_type"] == family
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32)
    hf.eval()
    ours = _our_model(weights, model)
    ids = torch.randint(0, model["vocab_size"], (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs = hf(ids).logits
        mine = ours(ids)
    # fp32 decoder twice, in another op order: logits_atol's rounding model (tests/numerics.py)
    torch.testing.assert_close(theirs, mine, atol=logits_atol(theirs, hf.config), rtol=0)
    generated = hf.generate(ids[:1, :4], max_new_tokens=5, do_sample=False)
    assert generated.shape == (1, 9)


def test_hf_export_bf16_and_shards(llama_ckpt, tmp_path):
    import torch
    import transformers

    path, weights = llama_ckpt
    out = to_hf(path, tmp_path / "hf16", dtype="bf16", shard_size="20KB")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1 and all((out / s).is_file() for s in shards)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert next(hf.parameters()).dtype == torch.bfloat16
    got = dict(hf.named_parameters())["model.embed_tokens.weight"]
    assert torch.equal(got, weights["model.embed_tokens.weight"].bfloat16())


def test_hf_export_copies_the_tokenizer(llama_ckpt, tmp_path, shared_data):
    tok = shared_data("tokenizers/gpt2/tokenizer.json")
    out = to_hf(llama_ckpt[0], tmp_path / "hf", tokenizer=tok)
    assert (out / "tokenizer.json").read_bytes() == tok.read_bytes()


def test_safetensors_export_equals_zero_to_fp32(llama_ckpt, tmp_path):
    import torch
    from safetensors.torch import load_file

    path, _ = llama_ckpt
    out = to_safetensors(path, tmp_path / "model.safetensors")
    ours = load_file(out)
    reference = _zero_to_fp32(path)
    assert set(ours) == set(reference)
    assert all(torch.equal(ours[k], reference[k].contiguous()) for k in reference)


def test_moe_experts_are_read_one_by_one(mixtral_ckpt):
    """Splitting a fused expert tensor reads only each expert's bytes from the ZeRO-3 partitions."""
    import torch

    path, weights = mixtral_ckpt
    with CheckpointReader(path) as reader:
        fused = reader.sources()["model.layers.1.mlp.experts.gate_up_proj"]
        rows, width = fused.shape[1], fused.shape[2]
        for expert in range(fused.shape[0]):
            up = fused.slice((expert * rows + rows // 2) * width, rows // 2 * width, (rows // 2, width))
            assert sum(count for *_, count in up.pieces) == rows // 2 * width
            assert torch.equal(
                up.load(), weights["model.layers.1.mlp.experts.gate_up_proj"][expert, rows // 2 :]
            )


@pytest.mark.parametrize("which", ["llama_ckpt", "qwen_ckpt", "mixtral_ckpt", "qwen3_moe_ckpt"])
def test_round_trip_hf_ours_hf_is_identical(request, tmp_path, which):
    from safetensors.torch import load_file

    path, _ = request.getfixturevalue(which)
    first = to_hf(path, tmp_path / "a")
    imported = import_hf(first, tmp_path / "ckpt")
    second = to_hf(imported, tmp_path / "b")
    assert json.loads((first / "config.json").read_text()) == json.loads((second / "config.json").read_text())
    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(a[k].equal(b[k]) for k in a)
    assert (first / "model.safetensors").read_bytes() == (second / "model.safetensors").read_bytes()


def test_imported_weights_start_a_training_engine(llama_ckpt, tmp_path, ds_world):
    import torch

    path, weights = llama_ckpt
    imported = import_hf(to_hf(path, tmp_path / "hf"), tmp_path / "ckpt")
    for zero in (0, 2, 3):
        engine = worker.build_llama_engine(zero, seed=77)
        state = CheckpointManager(tmp_path / "run").load(engine, imported)
        assert state["step"] == 0
        got = worker.full_weights(engine)
        assert all(torch.equal(got[k], weights[k]) for k in got), zero
        worker.llama_step(engine, 1)  # and it trains


def test_hf_export_refuses_existing_output_and_wrong_model(llama_ckpt, tmp_path):
    path, _ = llama_ckpt
    (tmp_path / "exists").mkdir()
    (tmp_path / "exists" / "notes.txt").write_text("mine")  # an empty folder would be written into
    with pytest.raises(UsageError, match="already exists"):
        to_hf(path, tmp_path / "exists")
    with pytest.raises(InputError, match="the model config implies"):
        to_hf(path, tmp_path / "x", model="tiny")
    assert not (tmp_path / "x").exists()
