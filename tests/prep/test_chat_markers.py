"""A chat template's ``<|...|>`` markers that the tokenizer lacks become several ordinary tokens each; the
summary says so, once (a tokenizer holding them as special tokens gets no such line)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.contract.conftest import contract_env

BIN = Path(sys.executable).parent


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(BIN / args[0]), *args[1:]], cwd=tmp_path, env=contract_env(), capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc


def test_markers_split_into_pieces_are_named_once(tmp_path):
    chats = [{"messages": [{"role": "user", "content": f"What is {i} + 1?"}, {"role": "assistant", "content": f"{i + 1}"}]}
             for i in range(40)]  # fmt: skip
    (tmp_path / "chats.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))
    _run(tmp_path, "llm-prep", "sample-corpus", "-o", "raw", "--docs", "100", "--seed", "1")
    _run(
        tmp_path,
        "llm-prep",
        "tokenizer",
        "train",
        "raw/stories.jsonl",
        "--vocab-size",
        "300",
        "-o",
        "plain.json",
    )
    _run(tmp_path, "llm-prep", "tokenizer", "train", "raw/stories.jsonl", "--vocab-size", "300", "-o", "chat.json",
         "--special-token", "<|im_start|>", "--special-token", "<|im_end|>")  # fmt: skip
    plain = _run(
        tmp_path, "llm-prep", "sft", "chats.jsonl", "-t", "plain.json", "--chat-template", "chatml", "-o", "a"
    )
    lines = [line for line in plain.stderr.splitlines() if "not special tokens" in line]
    assert len(lines) == 1 and "<|im_end|>, <|im_start|> not special tokens of this tokenizer" in lines[0]
    chat = _run(
        tmp_path, "llm-prep", "sft", "chats.jsonl", "-t", "chat.json", "--chat-template", "chatml", "-o", "b"
    )
    assert "not special tokens" not in chat.stderr
