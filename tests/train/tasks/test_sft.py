"""`task: sft`: a tiny model learns a generated instruction set (masked loss), packed samples stay apart.

The data is written by `llm-prep sft` (library entry point, byte tokenizer, ChatML) over a JSONL made here:
"repeat"/"reverse"/"upper" instructions over random words, whose answers are a function of the prompt.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from tests.numerics import logits_atol
from tests.train.conftest import TINY

ROOT = Path(__file__).resolve().parents[3]
SEQ = 96
PACK = 256  # packed sequences hold several samples


def write_instructions(path: Path, n: int = 160, seed: int = 0) -> Path:
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        word = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(3, 6)))
        op = rng.choice(["repeat", "reverse", "upper"])
        answer = {"repeat": f"{word} {word}", "reverse": word[::-1], "upper": word.upper()}[op]
        messages = [{"role": "user", "content": f"{op}: {word}"}, {"role": "assistant", "content": answer}]
        if rng.random() < 0.3:
            messages.insert(0, {"role": "system", "content": "Be brief."})
        lines.append(json.dumps({"messages": messages}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def make_sft_prefix(folder: Path, name: str, pack: bool, n: int = 160) -> str:
    from llmtools.prep.sft import SftConfig, build_sft

    src = write_instructions(folder / f"{name}.jsonl", n=n)
    prefix = str(folder / name)
    build_sft(
        SftConfig(
            inputs=[str(src)],
            tokenizer="byte",
            output_prefix=prefix,
            chat_template="chatml",
            max_length=PACK + 1,
            pack=pack,
        ),
        progress=False,
    )
    return prefix


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sftdata")
    return {
        "plain": make_sft_prefix(folder, "plain", False),
        "packed": make_sft_prefix(folder, "packed", True),
    }


def sft_config(prefix: str, **overrides):
    """A small `task: sft` train config over an llm-prep sft prefix (overrides: section__key=value)."""
    from llmtools.train.config import from_dict

    raw = {
        "task": "sft",
        "model": {"preset": "tiny", **TINY},
        "data": {"prefixes": [prefix], "seq_length": SEQ},
        "training": {"micro_batch_size": 8, "global_batch_size": 8, "train_steps": 40, "seed": 1234},
        "optimizer": {"lr": 3e-3, "weight_decay": 0.0},
        "schedule": {"kind": "cosine", "warmup_steps": 3},
        "logging": {"log_every": 1},
        "checkpoint": {"save_every": 0, "save_final": False},
    }
    for dotted, value in overrides.items():
        section, key = dotted.split("__")
        if section == "top":
            raw[key] = value
        else:
            raw.setdefault(section, {})[key] = value
    return from_dict(raw, "test-sft.yaml")


def ds(name: str = "zero0") -> dict:
    from llmtools.train.deepspeed_config import load_ds_config

    return load_ds_config(ROOT / f"configs/deepspeed/{name}.json")


def test_sft_training_lowers_the_masked_loss(sft_data, tmp_path):
    pytest.importorskip("deepspeed")
    from llmtools.train.loop import RunOptions, train

    result = train(sft_config(sft_data["plain"]), ds(), RunOptions(run_dir=tmp_path / "run", quiet=True))
    assert result.steps == 40
    first, last = np.mean(result.losses[:3]), np.mean(result.losses[-5:])
    # ln(320) = 5.77 at the start; the answers and the chat markup are learnable within 40 steps.
    assert first > 4.5 and last < 0.5 * first, result.losses
    records = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert sum(r["kind"] == "train" for r in records) == 40


def test_packed_sft_trains_on_zero2(sft_data, tmp_path):
    pytest.importorskip("deepspeed")
    from llmtools.train.loop import RunOptions, train

    cfg = sft_config(sft_data["packed"], training__train_steps=6, data__seq_length=PACK)
    result = train(cfg, ds("zero2"), RunOptions(run_dir=tmp_path / "run", quiet=True))
    assert result.steps == 6 and all(np.isfinite(result.losses)) and result.losses[-1] < result.losses[0]


def _per_sample_losses(model, data, indices, packed: bool, seq: int) -> dict[tuple, float]:
    """Summed masked cross-entropy of every sample (segment) in the rows ``indices``, keyed by its tokens."""
    import torch
    import torch.nn.functional as F

    from llmtools.train.tasks.sft import to_tensors

    b = to_tensors(data.batch(indices, seq), "cpu", packed=True)
    kwargs = {"position_ids": b["position_ids"], "segment_ids": b["segment_ids"]} if packed else {}
    with torch.no_grad():
        logits = model(b["tokens"], **kwargs).float()
    ce = F.cross_entropy(logits.flatten(0, 1), b["labels"].flatten(), reduction="none").view_as(b["labels"])
    ce = ce * b["loss_mask"]
    out = {}
    for row in range(len(indices)):
        seg = b["segment_ids"][row]
        for s in sorted(set(seg.tolist()) - {0}):
            out[tuple(b["tokens"][row][seg == s].tolist())] = float(ce[row][seg == s].sum())
    return out


@pytest.mark.numerics
def test_packed_and_unpacked_per_sample_losses_are_equal(sft_data):
    torch = pytest.importorskip("torch")
    from llmtools.data.sft_dataset import SftDataset
    from llmtools.model import LlamaForCausalLM
    from llmtools.train.plan import resolve_model_config

    torch.manual_seed(0)
    model = LlamaForCausalLM(resolve_model_config(sft_config(sft_data["plain"]))).eval()
    plain, packed = SftDataset(sft_data["plain"]), SftDataset(sft_data["packed"])
    assert packed.packed and not plain.packed and len(packed) < len(plain)
    rows = list(range(4))
    got = _per_sample_losses(model, packed, rows, packed=True, seq=PACK)
    n = len(got)
    assert n > len(rows)  # several samples per packed row
    want = _per_sample_losses(model, plain, list(range(len(plain))), packed=False, seq=PACK)

    def same(tokens):  # the packer may reorder samples: match each by its tokens (a segment that is
        # followed by another in its row also holds its own last token as an input, with a masked label)
        return want[tokens] if tokens in want else want[tokens[:-1]]

    for tokens, loss in got.items():
        # fp32 trainings whose batches are packed in another order: sums of different lengths move the loss by last bits, grown over the steps: 2e-4 of a loss ~5
        assert loss == pytest.approx(same(tokens), abs=2e-4)
    # Control: the same packed rows without the segment mask see their neighbours, and the losses move.
    leaked = _per_sample_losses(model, packed, rows, packed=False, seq=PACK)
    assert max(abs(loss - same(t)) for t, loss in leaked.items()) > 1e-2


def test_prompt_targets_do_not_move_the_loss(sft_data):
    torch = pytest.importorskip("torch")
    from llmtools.data.sft_dataset import SftDataset
    from llmtools.model import LlamaForCausalLM
    from llmtools.train.plan import resolve_model_config
    from llmtools.train.tasks.sft import masked_loss, to_tensors

    torch.manual_seed(0)
    model = LlamaForCausalLM(resolve_model_config(sft_config(sft_data["plain"])))
    b = to_tensors(SftDataset(sft_data["plain"]).batch([0, 1], SEQ), "cpu", packed=False)
    logits = model(b["tokens"])
    base = masked_loss(logits, b["labels"], b["loss_mask"])
    labels = b["labels"].clone()
    prompt = (b["loss_mask"] == 0).nonzero()[0]
    labels[tuple(prompt)] = (labels[tuple(prompt)] + 7) % 256
    assert masked_loss(logits, labels, b["loss_mask"]).item() == base.item()
    logits.retain_grad()
    base.backward()
    grad_rows = logits.grad.abs().sum(-1)
    assert torch.all(grad_rows[b["loss_mask"] == 0] == 0) and torch.all(grad_rows[b["loss_mask"] == 1] > 0)


@pytest.mark.numerics
def test_segment_mask_model_path_matches_plain_causal_for_one_segment():
    torch = pytest.importorskip("torch")
    from llmtools.model import LlamaForCausalLM, load_model_config

    torch.manual_seed(0)
    model = LlamaForCausalLM(load_model_config({**load_model_config("tiny").to_dict(), **TINY})).eval()
    ids = torch.randint(0, 256, (2, 17))
    with torch.no_grad():
        plain = model(ids)
        masked = model(ids, position_ids=torch.arange(17).expand(2, 17), segment_ids=torch.ones(2, 17).long())
    # fp32 decoder twice, the segment-masked attention path against the causal one: logits_atol (tests/numerics.py)
    torch.testing.assert_close(masked, plain, atol=logits_atol(plain, model.config), rtol=0)


def test_bad_task_and_sft_data_are_refused(sft_data, tmp_path):
    from llmtools.errors import InputError
    from llmtools.train.deepspeed_config import load_ds_config  # noqa: F401  (config path only)
    from llmtools.train.plan import make_plan

    with pytest.raises(InputError, match=r"test-sft.yaml: task: 'sfft' is not one of pretrain, sft"):
        sft_config(sft_data["plain"], top__task="sfft")
    cfg = sft_config(str(tmp_path / "missing"))
    with pytest.raises(InputError, match=r"missing_input_ids_document.bin/.idx: not found"):
        make_plan(cfg, ds())
    cfg = sft_config(sft_data["plain"])
    cfg.data.prefixes = [sft_data["plain"], sft_data["packed"]]
    with pytest.raises(InputError, match=r"task sft reads one prefix"):
        make_plan(cfg, ds())


def test_llm_train_cli_runs_the_sft_config(sft_data, python, cli_env, tmp_path):
    import subprocess

    run = tmp_path / "run"
    proc = subprocess.run(
        [python, "-m", "llmtools.cli.train", str(ROOT / "configs/train/tiny-sft.yaml"),
         "--deepspeed", str(ROOT / "configs/deepspeed/zero0.json"), "-o", str(run),
         "--set", f"data.prefixes=[{sft_data['packed']}]", "--set", f"data.seq_length={PACK}", "--set", "training.train_steps=2",
         "--set", "schedule.total_steps=2", "--set", "schedule.warmup_steps=0",
         "--set", "checkpoint.save_every=0", "--set", "model.init_from=null", "--set", "model.preset=tiny"],
        capture_output=True, text=True, env=cli_env, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (run / "checkpoints").is_dir() and "task: sft" in (run / "config.yaml").read_text()
    # A full fine-tuning checkpoint has no adapter to write.
    proc = subprocess.run(
        [python, "-m", "llmtools.cli.ckpt", "convert", str(run), "--to", "hf", "--adapter-only",
         "-o", str(tmp_path / "adapter")],
        capture_output=True, text=True, env=cli_env, timeout=300,
    )  # fmt: skip
    assert (
        proc.returncode == 2 and "was not trained with lora" in proc.stderr and "Traceback" not in proc.stderr
    )
    assert not (tmp_path / "adapter").exists()
