"""Eval metrics: bits per byte on a held text equals the hand computation (total loss in nats / ln 2 / the
text's UTF-8 bytes), token accuracy equals a direct count, the per-token byte table is exact for byte-level
tokenizers; and a real run's eval records carry both."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from tests.conftest import shared
from tests.train.conftest import tiny_config


def held_text() -> str:
    """A held-out article (WikiText-2 valid, with its non-ASCII characters) of a few thousand bytes."""
    docs = [json.loads(line)["text"] for line in shared("wikitext-2/valid.jsonl").read_text().splitlines()]
    text = next(d for d in docs if 3000 < len(d.encode()) < 12000 and len(d.encode()) > len(d))
    return text


class Windows:
    """Valid data as evaluation sees it: fixed windows of ``seq + 1`` tokens that overlap by one."""

    def __init__(self, stream: np.ndarray, seq: int) -> None:
        self.seq_length, self.tokenizer, self.vocab_size = seq, None, None
        count = (len(stream) - 1) // seq
        self.rows = np.stack([stream[k * seq : k * seq + seq + 1] for k in range(count)])

    def __len__(self) -> int:
        return len(self.rows)

    def batch(self, indices) -> np.ndarray:
        return self.rows[np.asarray(indices)]


class Engine:
    """What evaluate() needs of a DeepSpeed engine: call, eval/train, device."""

    def __init__(self, model) -> None:
        self.model, self.device = model, "cpu"

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def eval(self) -> None:
        self.model.eval()

    def train(self) -> None:
        self.model.train()


def test_bits_per_byte_and_accuracy_equal_the_hand_computation(byte_data):
    import torch
    import torch.nn.functional as F

    from llmtools.model import LlamaForCausalLM, load_model_config
    from llmtools.tokenize import load_tokenizer
    from llmtools.tokenize.token_bytes import token_byte_lengths
    from llmtools.train.evaluate import evaluate
    from llmtools.train.tasks.pretrain import PretrainTask

    tokenizer = load_tokenizer(shared("tokenizers/gpt2/tokenizer.json"))
    text = held_text()
    eod = tokenizer.eod_id
    # EOD first (an input only: its prediction is not scored), the text, then EODs (0 bytes) up to whole
    # windows: the scored tokens stand for exactly the text.
    seq, micro = 64, 2
    stream = [eod, *tokenizer.encode(text), eod]
    stream += [eod] * ((-(len(stream) - 1)) % (seq * micro))
    data = Windows(np.asarray(stream, dtype=np.int64), seq)
    iters = len(data) // micro
    torch.manual_seed(0)
    shape = {"vocab_size": tokenizer.vocab_size, "hidden_size": 32, "intermediate_size": 64}
    model = LlamaForCausalLM(load_model_config({**shape, "num_hidden_layers": 1, "num_attention_heads": 2}))
    cfg = tiny_config(byte_data["mix"], training__micro_batch_size=micro, eval__iters=iters, eval__every=1)
    table = token_byte_lengths(tokenizer)
    plan = SimpleNamespace(valid_data=data, task=PretrainTask(cfg), config=cfg, eval_byte_lengths=table)

    loss, record = evaluate(Engine(model), plan, rank=0, world=1)

    # By hand: every window's logits, summed cross-entropy, counted hits; the bytes of the text itself.
    nats, hits, tokens = 0.0, 0, 0
    with torch.no_grad():
        for row in torch.from_numpy(data.rows):
            logits = model(row[None, :-1])[0].float()
            nats += float(F.cross_entropy(logits, row[1:], reduction="sum"))
            hits += int((logits.argmax(-1) == row[1:]).sum())
            tokens += seq
    text_bytes = len(text.encode("utf-8"))
    assert record["eval_bytes"] == text_bytes and record["eval_tokens"] == tokens
    # fp32 logits from batches of 2 windows here, 1 there: equal to fp32 rounding.
    assert record["eval_bpb"] == pytest.approx(nats / math.log(2) / text_bytes, rel=1e-6)
    assert record["eval_accuracy"] == hits / tokens
    # an fp32 token mean vs a float64 sum: rel 1e-6 is ~8 fp32 ulps
    assert loss == pytest.approx(nats / tokens, rel=1e-6)


@pytest.mark.parametrize(
    "spec",
    [
        "byte",
        "tokenizers/gpt2/tokenizer.json",
        "tokenizers/gpt2/vocab.json",
        "tokenizers/gpt-neox-20b/tokenizer.json",
    ],
)
def test_byte_table_is_exact_for_byte_level_tokenizers(spec):
    from llmtools.tokenize import load_tokenizer
    from llmtools.tokenize.token_bytes import token_byte_lengths

    tokenizer = load_tokenizer(spec if spec == "byte" else shared(spec))
    table = token_byte_lengths(tokenizer)
    assert len(table) == tokenizer.vocab_size and table[tokenizer.eod_id] == 0
    texts = [held_text(), shared("misc-text/wagahaiwa_nekodearu.txt").read_text(encoding="utf-8")[:3000]]
    for text in texts:
        assert int(table[tokenizer.encode(text)].sum()) == len(text.encode("utf-8"))


def test_sentencepiece_counts_its_dummy_prefix():
    """SentencePiece prepends a space to each text: one byte more per document than the text (documented)."""
    from llmtools.tokenize import load_tokenizer
    from llmtools.tokenize.token_bytes import token_byte_lengths

    tokenizer = load_tokenizer(shared("tokenizers/mistral-v1/tokenizer.model"))
    table = token_byte_lengths(tokenizer)
    for text in (held_text(), "caf\u00e9 \u65e5\u672c\u8a9e\n\tend"):
        assert int(table[tokenizer.encode(text)].sum()) == len(text.encode("utf-8")) + 1


def test_byte_table_needs_the_recorded_tokenizer(tmp_path):
    from llmtools.tokenize import load_tokenizer
    from llmtools.tokenize.token_bytes import byte_lengths_for

    identity = load_tokenizer(shared("tokenizers/gpt2/tokenizer.json")).identity()
    table, why = byte_lengths_for(identity)
    assert why is None and len(table) == identity["vocab_size"]
    assert byte_lengths_for({**identity, "source": str(tmp_path / "gone.json")})[1].startswith(
        "its tokenizer could not be loaded"
    )
    assert "hash changed" in byte_lengths_for({**identity, "hash": "sha256:0"})[1]
    assert byte_lengths_for(None) == (None, "the data records no tokenizer")


def test_a_run_records_accuracy_and_bits_per_byte(byte_data, tmp_path):
    """Byte-tokenized text: each scored token but EOD is one byte, so bpb = loss / ln 2 x tokens / bytes."""
    from pathlib import Path

    from llmtools.train.deepspeed_config import load_ds_config
    from llmtools.train.loop import RunOptions, train

    root = Path(__file__).resolve().parents[2]
    cfg = tiny_config(byte_data["mix"], training__train_steps=4, eval__every=2, eval__iters=2)
    train(
        cfg, load_ds_config(root / "configs/deepspeed/zero1.json"), RunOptions(run_dir=tmp_path, quiet=True)
    )
    evals = [
        r
        for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())
        if r["kind"] == "eval"
    ]
    assert [r["step"] for r in evals] == [2, 4]
    for r in evals:
        assert r["eval_tokens"] == 2 * 4 * 64 and 0 < r["eval_bytes"] <= r["eval_tokens"]
        assert 0 <= r["eval_accuracy"] <= 1
        expected = r["eval_loss"] / math.log(2) * r["eval_tokens"] / r["eval_bytes"]
        # both float64 from the same logged values: rel 1e-9 is far above float64's ulps, below any real change
        assert r["eval_bpb"] == pytest.approx(expected, rel=1e-9)
    from tests.train.test_fp16 import validate_against_schema

    validate_against_schema(tmp_path / "metrics.jsonl")
