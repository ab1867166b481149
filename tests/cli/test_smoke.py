"""One real process of every command, chained on generated data (the fast tier's end-to-end check):
sample corpus -> tokenizer -> json2bin -> mix -> export -> 2 training steps -> verify -> convert -> summary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.contract.conftest import contract_env

BIN = Path(sys.executable).parent


def test_one_process_of_every_command(tmp_path):
    def run(*args: str) -> str:
        proc = subprocess.run(
            [str(BIN / args[0]), *args[1:]], cwd=tmp_path, env=contract_env(), capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, f"{' '.join(args)}\n{proc.stderr[-3000:]}"
        return proc.stdout

    run("llm-prep", "sample-corpus", "-o", "raw", "--docs", "200", "--seed", "1")
    run("llm-prep", "tokenizer", "train", "raw/stories.jsonl", "--vocab-size", "300", "-o", "tok.json")
    run("llm-prep", "json2bin", "raw/stories.jsonl", "-t", "tok.json", "-o", "data/stories", "--append-eod")
    run(
        "llm-mix", "data/stories_text_document", "--seq-length", "32", "--num-samples", "16", "-o", "mix.json"
    )
    run("llm-export", "hf", "data/stories_text_document", "-o", "hf-data")
    (tmp_path / "train.yaml").write_text(
        "model: {preset: tiny, vocab_size: 320, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1,\n"
        "        num_attention_heads: 2, num_key_value_heads: 1}\n"
        "data: {mix: mix.json}\n"
        "training: {micro_batch_size: 2, global_batch_size: 2, train_steps: 2, precision: fp32}\n"
        "optimizer: {lr: 1.0e-3}\nschedule: {kind: constant}\neval: {every: 0}\n"
        "logging: {log_every: 1}\ncheckpoint: {save_every: 2}\n"
    )
    result = json.loads(run("llm-train", "train.yaml", "--deepspeed", "zero1", "-o", "run", "--json"))
    assert result["steps"] == 2
    run("llm-ckpt", "verify", "run")
    run("llm-ckpt", "convert", "run", "--to", "hf", "-o", "hf", "--tokenizer", "tok.json")
    summary = json.loads(run("llm-log", "summary", "run/metrics.jsonl", "--json"))
    assert summary
