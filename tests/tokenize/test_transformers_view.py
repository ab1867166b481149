"""A tokenizer folder is read through transformers once, then from the cache: the same ids as transformers
gives, and as fast as the folder's tokenizer.json (no transformers import) from the second command on;
``llm-prep sft`` with the folder writes the same bytes as with its tokenizer.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import shared

transformers = pytest.importorskip("transformers")

CONFIGS = {
    "plain": {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"},
    "template": {
        "eos_token": "<|im_end|>",
        "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}",
    },
    "added": {"eos_token": "<|endoftext|>", "added_tokens_decoder": {"50257": {"content": "<|new|>", "special": True}}},
    "bos": {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "add_bos_token": True},
}  # fmt: skip
TEXTS = [
    "",
    "Hello world",
    " café 中文 😀",
    "<|im_start|>user\nhi<|im_end|>\n",
    "a<|new|>b <|endoftext|>",
    "  \n\t x",
]


def folder(root: Path, name: str) -> Path:
    path = root / name
    path.mkdir()
    tok = json.loads(shared("tokenizers/gpt2/tokenizer.json").read_text(encoding="utf-8"))
    tok["added_tokens"] += [
        {"id": 50257 + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, t in enumerate(["<|im_start|>", "<|im_end|>"] if name == "template" else [])
    ]  # fmt: skip
    (path / "tokenizer.json").write_text(json.dumps(tok), encoding="utf-8")
    (path / "tokenizer_config.json").write_text(json.dumps(CONFIGS[name]), encoding="utf-8")
    return path


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_cached_folder_is_what_transformers_makes_of_it(tmp_path, monkeypatch, name):
    from llmtools.tokenize.loader import load_tokenizer

    monkeypatch.setenv("LLMTOOLS_CACHE", str(tmp_path / "cache"))
    path = folder(tmp_path, name)
    hf = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    first = load_tokenizer(str(path), backend="tokenizers", special_tokens="split")
    assert list((tmp_path / "cache" / "tokenizers").glob("*.json"))  # kept
    again = load_tokenizer(str(path), backend="tokenizers", special_tokens="split")
    for tok in (first, again):
        assert [tok.encode(t) for t in TEXTS] == [hf.encode(t) for t in TEXTS]
        assert (tok.vocab_size, tok.eod_id, tok.bos_id) == (len(hf), hf.eos_token_id, hf.bos_token_id)
    # a changed file is a different entry: the cache never answers for an edited folder
    (path / "tokenizer_config.json").write_text(json.dumps({**CONFIGS[name], "eos_token": "<|endoftext|>"}))
    assert load_tokenizer(str(path)).eod_id == 50256


def test_a_second_command_with_the_folder_does_not_import_transformers_and_writes_the_same_bytes(
    tmp_path, cli_env
):
    path = folder(tmp_path, "template")
    chats = tmp_path / "chats.jsonl"
    chat = {
        "messages": [{"role": "user", "content": "Hi café"}, {"role": "assistant", "content": "Hello 😀"}]
    }
    chats.write_text(json.dumps(chat) + "\n" * 1)
    env = {**cli_env, "LLMTOOLS_CACHE": str(tmp_path / "cache")}
    probe = "import sys; from llmtools.tokenize import load_tokenizer; load_tokenizer(sys.argv[1]); print('transformers' in sys.modules)"  # noqa: E501
    imported = []
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-c", probe, str(path)], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        imported.append(out.stdout.strip())
    assert imported == ["True", "False"]  # transformers once, for the first load only

    written = {}
    for tokenizer in (path, path / "tokenizer.json"):
        prefix = tmp_path / ("folder" if tokenizer == path else "file")
        out = subprocess.run(
            [str(Path(sys.executable).parent / "llm-prep"), "sft", str(chats), "-t", str(tokenizer), "-o", str(prefix)],
            env=env, capture_output=True, text=True,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert "through transformers" not in out.stderr  # the cache made by the probe above
        written[prefix.name] = [
            Path(f"{prefix}_{key}_document.{ext}").read_bytes() for key in ("input_ids", "loss_mask") for ext in ("bin", "idx")
        ]  # fmt: skip
    assert written["folder"] == written["file"]


def test_a_view_whose_two_files_disagree_is_made_again(tmp_path, monkeypatch, capsys):
    from llmtools.tokenize.loader import load_tokenizer

    monkeypatch.setenv("LLMTOOLS_CACHE", str(tmp_path / "cache"))
    path = folder(tmp_path, "added")  # no tokenizer_class: read through transformers, kept in the cache
    want = load_tokenizer(str(path)).encode_batch(TEXTS)
    backend = next((tmp_path / "cache" / "tokenizers").glob("*.tokenizer.json"))
    backend.write_text(shared("tokenizers/gpt-neox-20b/tokenizer.json").read_text(encoding="utf-8"))
    capsys.readouterr()
    assert load_tokenizer(str(path)).encode_batch(TEXTS) == want
    assert "through transformers" in capsys.readouterr().err
    backend.unlink()  # a record without its file
    assert load_tokenizer(str(path)).encode_batch(TEXTS) == want
    assert "through transformers" in capsys.readouterr().err
