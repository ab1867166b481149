"""Train a byte-level BPE tokenizer (Hugging Face ``tokenizers``) with an EOD special token.

The result is a plain ``tokenizer.json`` (GPT-2 style: byte-level pre-tokenizer without prefix
space, byte-level decoder) that :func:`llmtools.tokenize.load_tokenizer` and Megatron-LM's
``HuggingFaceTokenizer`` load. Special tokens take the first ids, EOD first (id 0).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmtools.errors import InputError, UsageError
from llmtools.formats.output_marks import marker_path, write_marker
from llmtools.fsutil import check_writable, write_text_atomic
from llmtools.locks import lock_output
from llmtools.prep.jsonl import JsonlSource
from llmtools.progress import Progress, on_terminal

DEFAULT_EOD = "<|endoftext|>"


MAX_VOCAB = 1 << 24
"""Largest vocabulary trained here: far above any real one (the largest are ~256k), far below what
breaks the tokenizers library."""


@dataclass
class TrainConfig:
    vocab_size: int
    """Final vocabulary size, special tokens and the 256 byte tokens included (--vocab-size)."""
    eod_token: str = DEFAULT_EOD
    special_tokens: Sequence[str] = field(default_factory=tuple)
    min_frequency: int = 2
    json_keys: Sequence[str] = ("text",)

    def __post_init__(self) -> None:
        self.special_tokens = tuple(dict.fromkeys([self.eod_token, *self.special_tokens]))
        floor = 256 + len(self.special_tokens)
        if self.vocab_size < floor:
            raise UsageError(
                f"--vocab-size: must be at least {floor} (256 bytes + {len(self.special_tokens)} special tokens), got {self.vocab_size}"
            )
        if self.vocab_size > MAX_VOCAB:  # tokenizers aborts the process (SIGABRT) on such sizes
            raise UsageError(f"--vocab-size: at most {MAX_VOCAB:,}, got {self.vocab_size:,}")
        if not self.eod_token:
            raise UsageError("--eod-token: must not be empty")
        if self.min_frequency < 1:
            raise UsageError(f"--min-frequency: must be at least 1, got {self.min_frequency}")


def build_tokenizer(texts: Iterable[str], config: TrainConfig):
    """Train on ``texts`` and return the ``tokenizers.Tokenizer``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=list(config.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        # On a terminal the trainer's own bars (reading, counting pairs, merges); elsewhere it draws
        # nothing, so the reading is reported by the caller's plain lines (iter_jsonl_texts).
        show_progress=on_terminal(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def iter_jsonl_texts(inputs: Sequence[str], keys: Sequence[str], skip_bad: bool = False) -> Iterator[str]:
    """Every text of every key in JSONL inputs (same reader and errors as json2bin)."""
    source = JsonlSource(inputs, skip_bad=skip_bad)
    # Plain lines while the input is read; on a terminal the trainer draws its own bars instead.
    with Progress(source.total_bytes, "tokenizer: read", unit="B", enabled=not on_terminal()) as bar:
        for chunk in source.batches():
            batch = chunk.parse(keys, skip_bad)
            if batch.bad and not skip_bad:
                raise InputError(batch.bad[0].message)
            for key in keys:
                yield from batch.texts[key]
            bar.update(batch.nbytes)


def outputs(output: str | os.PathLike) -> list[Path]:
    """What :func:`train_tokenizer` writes: the tokenizer and its marker."""
    return [Path(output), marker_path(output)]


def train_tokenizer(
    inputs: Sequence[str],
    output: str | os.PathLike,
    config: TrainConfig,
    force: bool = False,
    skip_bad: bool = False,
) -> dict:
    """Train from JSONL ``inputs`` and write ``output`` (tokenizer.json) atomically, with the marker that
    says llmtools wrote it (``tokenizer.json.llmtools.json``). Returns a summary."""
    with lock_output(output):  # one writer per output, from the existence check on
        check_writable(outputs(output), force)
        tok = build_tokenizer(iter_jsonl_texts(inputs, config.json_keys, skip_bad), config)
        write_text_atomic(output, tok.to_str(pretty=False))
        write_marker(output, "tokenizer", vocab_size=tok.get_vocab_size(with_added_tokens=True))
    return {
        "path": str(output),
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "eod_token": config.eod_token,
        "eod_id": tok.token_to_id(config.eod_token),
        "special_tokens": {t: tok.token_to_id(t) for t in config.special_tokens},
    }
