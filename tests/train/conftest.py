"""Train fixtures: two real byte-tokenized corpora (tinyshakespeare, wikitext-2 valid) and a mix of both.

Byte-level ids (vocabulary 257) keep the fixture independent of any trained tokenizer and fast to build,
while the text is real, so a tiny model's loss falls clearly within a few dozen steps.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import shared

SEQ = 64


def write_byte_prefix(source: Path, prefix: Path, limit_docs: int | None = None) -> Path:
    from llmtools.formats.indexed import IndexedDatasetWriter
    from llmtools.formats.sidecar import write_sidecar
    from llmtools.tokenize import load_tokenizer

    tok = load_tokenizer("byte")
    docs = [
        json.loads(line)["text"] for line in source.read_text(encoding="utf-8").splitlines() if line.strip()
    ]
    docs = docs[:limit_docs] if limit_docs else docs
    tokens = 0
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for ids in tok.encode_batch(docs):
            ids = list(ids) + [tok.eod_id]
            writer.add_document(np.asarray(ids, dtype=np.uint16))
            tokens += len(ids)
    write_sidecar(
        prefix,
        {
            "format": "llmtools.indexed-sidecar",
            "version": 1,
            "tool": "llmtools 0.1.0",
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "tokenizer": tok.identity(),
            "json_key": "text",
            "append_eod": True,
            "dtype": "uint16",
            "special_tokens": "none",
            "inputs": [{"path": str(source), "size": source.stat().st_size, "sha256": ""}],
            "counts": {
                "documents": len(docs),
                "sequences": len(docs),
                "tokens": tokens,
                "empty_documents": 0,
                "skipped": {},
            },
        },
    )
    return prefix


@pytest.fixture(scope="session")
def byte_data(tmp_path_factory):
    """{"prefixes": [shakespeare, wiki], "mix": mix.json (seq 64, 6000 train / 256 valid samples)}."""
    from llmtools.data import mix as mixlib

    folder = tmp_path_factory.mktemp("bytedata")
    shakespeare = write_byte_prefix(
        shared("tinyshakespeare/input.jsonl"), folder / "shakespeare_text_document"
    )
    wiki = write_byte_prefix(shared("wikitext-2/valid.jsonl"), folder / "wiki_text_document")
    config = mixlib.MixConfig(
        blend=mixlib.Blend([str(shakespeare), str(wiki)], [0.7, 0.3]),
        seq_length=SEQ,
        num_samples=6000,
        valid_samples=256,
        test_samples=0,
        split="98,2,0",
    )
    mix_path = folder / "mix.json"
    mixlib.save_plan(mixlib.build_plan(config), mix_path)
    return {"prefixes": [str(shakespeare), str(wiki)], "mix": str(mix_path), "folder": folder}


# The tiny preset shrunk for tests: a 320-id byte vocabulary, 2 narrow layers.
TINY = {"vocab_size": 320, "num_hidden_layers": 2, "hidden_size": 96, "intermediate_size": 256}


def tiny_config(mix: str, **overrides):
    """A small, fast train config over the byte mix (the tiny preset with a 257-id vocabulary)."""
    from llmtools.train.config import from_dict

    raw = {
        "model": {"preset": "tiny", **TINY},
        "data": {"mix": mix},
        "training": {"micro_batch_size": 4, "global_batch_size": 8, "train_steps": 50, "seed": 1234},
        "optimizer": {"lr": 3e-3, "weight_decay": 0.1},
        "schedule": {"kind": "cosine", "warmup_steps": 5},
        "logging": {"log_every": 1},
        "checkpoint": {"save_every": 0, "save_final": False},
    }
    for dotted, value in overrides.items():
        section, key = dotted.split("__")
        raw.setdefault(section, {})[key] = value
    steps, schedule = raw["training"].get("train_steps"), raw["schedule"]
    if steps is not None and "total_steps" not in schedule and steps <= schedule.get("warmup_steps", 0):
        # A run shorter than its warmup is refused (all warmup is a trap for users); these few-step
        # tests stop inside the warmup on purpose, so they name the schedule's length, which keeps
        # every step's learning rate what it was (linear warmup does not depend on the total).
        schedule["total_steps"] = 50
    return from_dict(raw, "test.yaml")
