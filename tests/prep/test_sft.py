"""llm-prep sft, the library: formats, masks, truncation, packing, HF input, sidecars."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llmtools.errors import InputError, UsageError
from llmtools.formats.indexed import IndexedDatasetReader
from llmtools.formats.sft_layout import position_ids_from_segments, segment_attention_mask
from llmtools.prep.sft import SftConfig, build_sft, mask_from_offsets
from llmtools.tokenize import load_tokenizer
from tests.conftest import REPO, shared

CHATS = [
    {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"},
        ]
    },
    {
        "messages": [
            {"role": "user", "content": "Name a color"},
            {"role": "assistant", "content": "Blue, café ☕."},
        ]
    },
    {
        "system": "Be kind.",
        "messages": [{"role": "user", "content": "ok?"}, {"role": "assistant", "content": "Yes."}],
    },
]


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def _read(prefix, key):
    return IndexedDatasetReader(f"{prefix}_{key}_document")


def _assistant_texts(records):
    out = []
    for r in records:
        out.append("".join(m["content"] + "<|im_end|>\n" for m in r["messages"] if m["role"] == "assistant"))
    return out


@pytest.fixture
def gpt2():
    return str(shared("tokenizers/gpt2/tokenizer.json"))


def _build(tmp_path, records, tokenizer, **kw):
    src = _write_jsonl(tmp_path / "in.jsonl", records)
    kw.setdefault("chat_template", "chatml")
    config = SftConfig(
        inputs=[str(src)], tokenizer=tokenizer, output_prefix=str(tmp_path / "out" / "sft"), **kw
    )
    return config, build_sft(config)


def test_messages_to_aligned_ids_and_mask(tmp_path, gpt2):
    config, result = _build(tmp_path, CHATS, gpt2)
    tok = load_tokenizer(gpt2)
    ids, mask = _read(config.output_prefix, "input_ids"), _read(config.output_prefix, "loss_mask")
    assert ids.num_documents == mask.num_documents == 3 == result.samples == result.sequences
    assert mask.dtype == np.uint8 and ids.dtype == np.uint16
    assert (ids.document_lengths() == mask.document_lengths()).all()
    for j, want in enumerate(_assistant_texts(CHATS)):
        a, m = ids.document(j), mask.document(j)
        assert set(np.unique(m).tolist()) <= {0, 1}
        assert tok.decode(a[m == 1]) == want
    # a system key outside the messages becomes the first turn
    assert tok.decode(ids.document(2)).startswith("<|im_start|>system\nBe kind.<|im_end|>\n")
    assert result.target_tokens == int(mask.tokens().sum())
    assert len(result.paths) == 6 and not (tmp_path / "out" / "sft_segment_ids_document.bin").exists()


def test_sidecars_follow_the_schema(tmp_path, gpt2):
    jsonschema = pytest.importorskip("jsonschema")
    referencing = pytest.importorskip("referencing")
    config, result = _build(tmp_path, CHATS, gpt2, max_length=64, pack=True)
    base = json.loads((REPO / "schemas" / "sidecar.schema.json").read_text())
    sft = json.loads((REPO / "schemas" / "sft-sidecar.schema.json").read_text())
    registry = referencing.Registry().with_resources(
        [(s["$id"], referencing.Resource.from_contents(s)) for s in (base, sft)]
    )
    validator = jsonschema.Draft202012Validator(sft, registry=registry)
    for key in ("input_ids", "loss_mask", "segment_ids"):
        sidecar = json.loads((tmp_path / "out" / f"sft_{key}_document.json").read_text())
        validator.validate(sidecar)
        assert sidecar["sft"]["role"] == key and sidecar["json_key"] == key
        assert sidecar["sft"]["counts"]["samples"] == 3
        assert sidecar["inputs"][0]["path"].endswith("in.jsonl")
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({**sidecar, "sft": {**sidecar["sft"], "overflow": "wrap"}})


def test_prompt_response_with_custom_keys_and_alpaca(tmp_path, gpt2):
    tok = load_tokenizer(gpt2)
    records = [{"q": "Capital of France?", "a": "Paris.", "sys": "Geography quiz."}, {"q": "2*3?", "a": "6"}]
    config, _ = _build(
        tmp_path, records, gpt2, format="prompt-response", prompt_key="q", response_key="a", system_key="sys"
    )
    ids, mask = _read(config.output_prefix, "input_ids"), _read(config.output_prefix, "loss_mask")
    assert tok.decode(ids.document(0)) == (
        "<|im_start|>system\nGeography quiz.<|im_end|>\n<|im_start|>user\nCapital of France?<|im_end|>\n"
        "<|im_start|>assistant\nParis.<|im_end|>\n"
    )
    assert tok.decode(ids.document(1)[mask.document(1) == 1]) == "6<|im_end|>\n"

    alpaca = [
        {"instruction": "Translate to French.", "input": "cat", "output": "chat"},
        {"instruction": "Say hi.", "input": "", "output": "hi"},
    ]
    (tmp_path / "out").mkdir(exist_ok=True)
    config, _ = _build(
        tmp_path, alpaca, gpt2, format="alpaca", system_prompt="Follow the instruction.", force=True
    )
    ids = _read(config.output_prefix, "input_ids")
    assert tok.decode(ids.document(0)) == (
        "<|im_start|>system\nFollow the instruction.<|im_end|>\n<|im_start|>user\nTranslate to French.\n\ncat"
        "<|im_end|>\n<|im_start|>assistant\nchat<|im_end|>\n"
    )
    assert "user\nSay hi.<|im_end|>" in tok.decode(ids.document(1))


def test_max_length_truncate_and_drop_are_counted(tmp_path, gpt2):
    lengths = [len(load_tokenizer(gpt2).encode(_render(r))) for r in CHATS]
    limit = sorted(lengths)[1]  # one sample over the limit
    _, truncated = _build(tmp_path, CHATS, gpt2, max_length=limit)
    assert truncated.truncated == 1 and truncated.dropped_too_long == 0 and truncated.samples == 3
    ids = _read(tmp_path / "out" / "sft", "input_ids")
    assert int(ids.document_lengths().max()) == limit
    _, dropped = _build(tmp_path, CHATS, gpt2, max_length=limit, overflow="drop", force=True)
    assert dropped.dropped_too_long == 1 and dropped.truncated == 0 and dropped.samples == 2
    # truncation that would leave no target token drops the sample instead
    long_prompt = {
        "messages": [{"role": "user", "content": "x " * 60}, {"role": "assistant", "content": "y"}]
    }
    _, none_left = _build(tmp_path, [long_prompt, CHATS[1]], gpt2, max_length=40, force=True)
    assert none_left.dropped_too_long == 1 and none_left.truncated == 1 and none_left.samples == 1
    # nothing usable at all is an input error, not an empty dataset
    with pytest.raises(InputError, match="no usable samples"):
        _build(tmp_path, CHATS, gpt2, max_length=5, force=True)


def _render(record):
    from llmtools.prep.chat_template import load_chat_template

    messages = ([{"role": "system", "content": record["system"]}] if "system" in record else []) + record[
        "messages"
    ]
    return load_chat_template("chatml", None).render(messages)


def test_pack_keeps_samples_whole_and_numbers_segments(tmp_path, gpt2):
    records = CHATS * 5
    _, plain = _build(tmp_path, records, gpt2)
    prefix = tmp_path / "out" / "sft"
    flat_ids = _read(prefix, "input_ids").tokens().copy()
    flat_mask = _read(prefix, "loss_mask").tokens().copy()
    sample_lengths = _read(prefix, "input_ids").document_lengths()

    _, packed = _build(tmp_path, records, gpt2, max_length=128, pack=True, force=True)
    ids, mask, seg = (_read(prefix, k) for k in ("input_ids", "loss_mask", "segment_ids"))
    assert packed.samples == 15 and packed.sequences == ids.num_documents < 15
    assert (ids.document_lengths() <= 128).all()
    assert (ids.document_lengths() == mask.document_lengths()).all()
    assert (ids.document_lengths() == seg.document_lengths()).all()
    assert (ids.tokens() == flat_ids).all() and (mask.tokens() == flat_mask).all()  # same samples, in order
    got_lengths = []
    for j in range(seg.num_documents):
        s = seg.document(j).astype(np.int64)
        assert s[0] == 1 and (np.diff(s) >= 0).all() and (np.diff(s) <= 1).all()
        got_lengths += np.bincount(s)[1:].tolist()
        pos = position_ids_from_segments(s)
        starts = np.flatnonzero(np.diff(s, prepend=0))
        assert (pos[starts] == 0).all()
    assert got_lengths == sample_lengths.tolist()  # every segment is one whole sample


def test_position_ids_and_attention_mask_from_segments():
    seg = np.array([1, 1, 1, 2, 2, 3])
    assert position_ids_from_segments(seg).tolist() == [0, 1, 2, 0, 1, 0]
    allowed = segment_attention_mask(seg)
    assert allowed.shape == (6, 6) and allowed.dtype == bool
    assert allowed[4].tolist() == [False, False, False, True, True, False]  # own segment, causal
    assert allowed[2].tolist() == [True, True, True, False, False, False]
    assert not allowed[np.triu_indices(6, 1)].any()


def test_mask_from_offsets_handles_trimmed_and_empty_offsets():
    # text "ab cd e": tokens "ab" [0,2), " " reported empty at 3, "cd" [3,5), " e" trimmed to [6,7)
    offsets = np.array([[0, 2], [3, 3], [3, 5], [6, 7]])
    assert mask_from_offsets(offsets, [(2, 3)]).tolist() == [0, 1, 0, 0]
    assert mask_from_offsets(offsets, [(5, 7)]).tolist() == [0, 0, 0, 1]  # the trimmed space counts
    assert mask_from_offsets(offsets, []).tolist() == [0, 0, 0, 0]


def test_hf_dataset_input_equals_jsonl(tmp_path, gpt2):
    datasets = pytest.importorskip("datasets")
    records = [{"messages": r["messages"]} for r in CHATS]
    config, _ = _build(tmp_path, records, gpt2)
    want = _read(config.output_prefix, "input_ids").tokens().copy()
    want_mask = _read(config.output_prefix, "loss_mask").tokens().copy()
    folder = tmp_path / "hf"
    datasets.Dataset.from_list(records).save_to_disk(str(folder))
    out = tmp_path / "hfout" / "sft"
    result = build_sft(
        SftConfig(inputs=[str(folder)], tokenizer=gpt2, output_prefix=str(out), chat_template="chatml")
    )
    assert result.samples == 3
    assert (_read(out, "input_ids").tokens() == want).all()
    assert (_read(out, "loss_mask").tokens() == want_mask).all()


def test_byte_tokenizer_and_append_eod(tmp_path):
    _, result = _build(tmp_path, CHATS[:1], "byte", append_eod=True)
    ids = _read(tmp_path / "out" / "sft", "input_ids").document(0)
    mask = _read(tmp_path / "out" / "sft", "loss_mask").document(0)
    tok = load_tokenizer("byte")
    assert ids[-1] == tok.eod_id and mask[-1] == 1
    assert tok.decode(ids[:-1][mask[:-1] == 1]) == "Hello!<|im_end|>\n4<|im_end|>\n"


def test_bad_record_stops_with_place_and_leaves_no_output(tmp_path, gpt2):
    records = CHATS + [
        {"messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]}
    ]
    with pytest.raises(InputError, match=r"in\.jsonl:4: messages\[0\]: unknown role 'robot'"):
        _build(tmp_path, records, gpt2)
    assert not list((tmp_path / "out").glob("*")) if (tmp_path / "out").exists() else True
    _, result = _build(tmp_path, records, gpt2, skip_bad=True)
    assert result.samples == 3 and result.skipped == {"unknown_role": 1}


def test_config_validates_flags():
    with pytest.raises(UsageError, match="--pack"):
        SftConfig(inputs=["x"], tokenizer="byte", output_prefix="o", pack=True)
    with pytest.raises(UsageError, match="--format"):
        SftConfig(inputs=["x"], tokenizer="byte", output_prefix="o", format="sharegpt")
    with pytest.raises(UsageError, match="--overflow"):
        SftConfig(inputs=["x"], tokenizer="byte", output_prefix="o", overflow="wrap")
    with pytest.raises(UsageError, match="--max-length"):
        SftConfig(inputs=["x"], tokenizer="byte", output_prefix="o", max_length=0)


def test_loss_moves_only_with_assistant_targets(tmp_path):
    """The mask as a trainer uses it (labels = ids[1:], mask[1:]): prompt targets do not move the loss."""
    torch = pytest.importorskip("torch")
    from llmtools.model import LlamaForCausalLM
    from llmtools.model.presets import load_model_config

    _, _ = _build(tmp_path, CHATS[:1], "byte")
    ids = torch.from_numpy(_read(tmp_path / "out" / "sft", "input_ids").document(0).astype(np.int64))[None]
    mask = torch.from_numpy(_read(tmp_path / "out" / "sft", "loss_mask").document(0).astype(np.int64))[None]
    config = load_model_config(
        {**load_model_config("tiny").to_dict(), "vocab_size": 320, "num_hidden_layers": 1}
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    tokens, labels, loss_mask = ids[:, :-1], ids[:, 1:].clone(), mask[:, 1:]
    base = model.loss(tokens, labels, loss_mask)
    prompt_at = int(torch.nonzero(loss_mask[0] == 0)[5])
    answer_at = int(torch.nonzero(loss_mask[0] == 1)[0])
    changed = labels.clone()
    changed[0, prompt_at] = (changed[0, prompt_at] + 1) % 256
    assert torch.equal(model.loss(tokens, changed, loss_mask), base)
    changed = labels.clone()
    changed[0, answer_at] = (changed[0, answer_at] + 1) % 256
    assert not torch.equal(model.loss(tokens, changed, loss_mask), base)
    # the gradient is the same whatever the prompt targets are
    model.zero_grad()
    base.backward()
    want = model.lm_head.weight.grad.clone()
    model.zero_grad()
    noisy = labels.clone()
    noisy[loss_mask == 0] = torch.randint(
        0, 256, (int((loss_mask == 0).sum()),), generator=torch.Generator().manual_seed(1)
    )
    model.loss(tokens, noisy, loss_mask).backward()
    assert torch.equal(model.lm_head.weight.grad, want) and want.abs().sum() > 0
