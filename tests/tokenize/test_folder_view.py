"""A plain tokenizer folder is read without transformers, and the reading is what transformers'
AutoTokenizer makes of it: the same backend JSON, the same ids for chats rendered with the folder's template
(special, added and BOS/EOS tokens included), the same length, EOS and BOS. Folders it does not cover are
declined (then transformers is asked), never read differently."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from llmtools.prep.chat_template import load_chat_template
from llmtools.prep.sft import SampleEncoder
from llmtools.tokenize.folder_view import folder_view
from tests.conftest import shared

transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip("the folder reading follows transformers 5", allow_module_level=True)

GPT2 = "tokenizers/gpt2/tokenizer.json"
NEOX = "tokenizers/gpt-neox-20b/tokenizer.json"
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHATS = [
    [{"role": "user", "content": "Hi café 中文 😀"}, {"role": "assistant", "content": "Hello <|endoftext|> there"}],
    [{"role": "system", "content": "  be terse\n\n"}, {"role": "user", "content": "x<|im_start|>y <|tool|>"},
     {"role": "assistant", "content": "<|im_end|> ok\t 1234567"}],
]  # fmt: skip
TEXTS = [
    "",
    "Hello world",
    " café 中文 😀",
    "<|im_start|>user\nhi<|im_end|>\n",
    "a<|tool|>b <|endoftext|>",
    "  \n\t x",
]


def _saved(root: Path, name: str, base: str = GPT2, **options) -> Path:
    """A folder written by transformers' own save_pretrained, as a user makes one."""
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(shared(base)), **options.pop("init", {}))
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.add_tokens(options.pop("plain", []))
    tok.chat_template = TEMPLATE
    path = root / name
    tok.save_pretrained(path)
    return path


def _handmade(root: Path, name: str, config: dict, added=(), post_processor=True, base: str = GPT2) -> Path:
    """A folder whose files are written directly (as on a hub repository)."""
    path = root / name
    path.mkdir()
    data = json.loads(shared(base).read_text(encoding="utf-8"))
    size = max(t["id"] for t in data["added_tokens"]) + 1
    for i, (content, special) in enumerate(added):
        data["added_tokens"].append({"id": size + i, "content": content, "single_word": False, "lstrip": False,
                                     "rstrip": False, "normalized": not special, "special": special})  # fmt: skip
    if not post_processor:
        data["post_processor"] = None
    (path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    (path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": TEMPLATE, **config}), encoding="utf-8"
    )
    return path


CHATML = [("<|im_start|>", True), ("<|im_end|>", True)]
READ = {  # folders read without transformers
    "saved": lambda r: _saved(r, "saved", init={"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}),
    "saved-plain-added": lambda r: _saved(r, "spa", init={"eos_token": "<|endoftext|>"}, plain=["<|tool|>"]),
    "saved-neox": lambda r: _saved(r, "neox", NEOX, init={"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}),
    "saved-pad-unk": lambda r: _saved(
        r, "padunk", init={"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
    ),
    "hub-generic": lambda r: _handmade(r, "hub", {"tokenizer_class": "PreTrainedTokenizerFast",
                                                  "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}, CHATML),
    "hub-no-post-processor": lambda r: _handmade(
        r, "nopp", {"tokenizer_class": "TokenizersBackend", "eos_token": "<|im_end|>", "add_bos_token": True},
        CHATML, post_processor=False,
    ),
    "hub-special-map": lambda r: (
        _handmade(r, "map", {"tokenizer_class": "PreTrainedTokenizerFast"}, CHATML + [("<|tool|>", False)]),
        (r / "map" / "special_tokens_map.json").write_text(
            json.dumps({"eos_token": {"content": "<|im_end|>"}, "bos_token": "<|endoftext|>"})
        ),
    )[0],
}  # fmt: skip
DECLINED = {  # folders only transformers can read exactly
    "model-class": lambda r: _handmade(r, "gpt2cls", {"tokenizer_class": "GPT2Tokenizer", "eos_token": "<|im_end|>"}, CHATML),
    "no-class": lambda r: _handmade(r, "nocls", {"eos_token": "<|im_end|>"}, CHATML),
    "token-not-added": lambda r: _handmade(r, "notadded", {"tokenizer_class": "PreTrainedTokenizerFast",
                                                           "eos_token": "<|im_end|>", "bos_token": "hello"}, CHATML),
    "new-in-config": lambda r: _handmade(r, "newcfg", {
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
        "added_tokens_decoder": {"50259": {"content": "<|tool|>", "special": True}}}, CHATML),
    "config-json": lambda r: (
        _handmade(r, "cfgjson", {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>"}, CHATML),
        (r / "cfgjson" / "config.json").write_text(json.dumps({"model_type": "gpt2"})),
    )[0],
}  # fmt: skip


def _ids(hf, messages) -> list[int]:
    out = hf.apply_chat_template(messages, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.mark.parametrize("name", sorted(READ))
def test_the_folder_read_without_transformers_is_what_transformers_makes_of_it(tmp_path, name):
    path = READ[name](tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    view = folder_view(path)
    assert view is not None, "a plain folder is read without transformers"
    tok, length, eos, bos = view
    assert tok.to_str() == hf.backend_tokenizer.to_str()
    assert (length, eos, bos) == (len(hf), hf.eos_token_id, hf.bos_token_id)
    assert [tok.encode(t).ids for t in TEXTS] == [hf.encode(t) for t in TEXTS]  # post-processor's BOS/EOS too
    encoder = SampleEncoder(_loaded(path), load_chat_template(None, path))
    for messages in CHATS:
        assert encoder.encode(messages)[0].tolist() == _ids(hf, messages)


@pytest.mark.parametrize("name", sorted(DECLINED))
def test_folders_it_does_not_cover_are_left_to_transformers(tmp_path, monkeypatch, name):
    monkeypatch.setenv("LLMTOOLS_CACHE", str(tmp_path / "cache"))
    path = DECLINED[name](tmp_path)
    assert folder_view(path) is None
    hf = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    tok = _loaded(path)
    assert [tok.encode(t) for t in TEXTS] == [hf.encode(t) for t in TEXTS]
    assert (tok.vocab_size, tok.eod_id, tok.bos_id) == (len(hf), hf.eos_token_id, hf.bos_token_id)


def test_split_special_tokens_is_left_to_transformers(tmp_path):
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "split_special_tokens": True,
    }
    assert folder_view(_handmade(tmp_path, "split", config, CHATML)) is None


def _loaded(path: Path):
    from llmtools.tokenize import load_tokenizer

    return load_tokenizer(str(path), backend="tokenizers", special_tokens="split")


def test_loading_a_plain_folder_imports_no_transformers(tmp_path, cli_env):
    import subprocess

    path = READ["saved"](tmp_path)
    probe = "import sys; from llmtools.tokenize import load_tokenizer; load_tokenizer(sys.argv[1]); print('transformers' in sys.modules)"  # noqa: E501
    env = {**cli_env, "LLMTOOLS_CACHE": str(tmp_path / "empty-cache")}
    out = subprocess.run([sys.executable, "-c", probe, str(path)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False" and "through transformers" not in out.stderr
    assert not (tmp_path / "empty-cache" / "tokenizers").exists()  # nothing to keep: read as its file is

    chats = tmp_path / "chats.jsonl"
    chats.write_text(
        "".join(json.dumps({"messages": m}, ensure_ascii=False) + "\n" for m in CHATS), encoding="utf-8"
    )
    written = {}
    for tokenizer in (path, path / "tokenizer.json"):
        prefix = tmp_path / "out" / tokenizer.name / "sft"
        command = [
            str(Path(sys.executable).parent / "llm-prep"),
            "sft",
            str(chats),
            "-t",
            str(tokenizer),
            "-o",
            str(prefix),
        ]
        out = subprocess.run(command, env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert "through transformers" not in out.stderr
        written[tokenizer.name] = [
            Path(f"{prefix}_{k}_document.{e}").read_bytes()
            for k in ("input_ids", "loss_mask")
            for e in ("bin", "idx")
        ]
    assert written[path.name] == written["tokenizer.json"]
