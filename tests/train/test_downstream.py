"""``eval.tasks``: multiple-choice and perplexity tasks scored in the training loop.

The scores are checked against a separate computation (log p(choice | context) as log p(whole) - log
p(context), one unpadded sequence at a time); a real ``llm-train`` run shows accuracy rising on a task its
data teaches (real Shakespeare continuations against the same letters shuffled) while it stays at chance on
one nothing teaches (random letters); bad task files are one line, exit 2, before compute.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import shared
from tests.train.test_cli import DS, llm_train, write_config


def write_jsonl(path: Path, items: list[dict]) -> Path:
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


def shakespeare_task(path: Path, n: int, seed: int) -> Path:
    """Context: a line of Shakespeare; choices: its true next 16 characters, and the same shuffled."""
    text = shared("tinyshakespeare/input.jsonl").read_text(encoding="utf-8")
    words = " ".join(json.loads(line)["text"] for line in text.splitlines()[:200]).split()
    rng, items = random.Random(seed), []
    while len(items) < n:
        at = rng.randrange(len(words) - 20)
        context, true = " ".join(words[at : at + 6]), " " + " ".join(words[at + 6 : at + 12])
        true = true[:16]
        letters = list(true)
        rng.shuffle(letters)
        wrong = "".join(letters)
        if wrong == true or len(true) < 16:
            continue
        gold = rng.randrange(2)
        items.append({"context": context, "choices": [wrong, true] if gold else [true, wrong], "gold": gold})
    return write_jsonl(path, items)


def random_task(path: Path, n: int, seed: int) -> Path:
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"

    def word(k: int) -> str:
        return "".join(rng.choice(letters) for _ in range(k))

    items = [
        {"context": word(20), "choices": [word(12), word(12)], "gold": rng.randrange(2)} for _ in range(n)
    ]
    return write_jsonl(path, items)


def test_scores_match_a_separate_computation(tmp_path):
    import torch

    from llmtools.model import LlamaForCausalLM, ModelConfig
    from llmtools.tokenize import load_tokenizer
    from llmtools.train.downstream import evaluate_tasks, load_tasks

    tok = load_tokenizer("byte")
    mc = random_task(tmp_path / "mc.jsonl", 7, 1)
    ppl = write_jsonl(
        tmp_path / "ppl.jsonl", [{"text": "To be, or not to be"}, {"text": "that is the question:"}]
    )
    tasks = load_tasks([str(mc), str(ppl)], tok, None, 63)
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        ModelConfig(vocab_size=257, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    ).eval()  # fmt: skip
    got = evaluate_tasks(model, tasks, "cpu", 0, 1, batch=3)

    def logp(ids: list[int]) -> float:
        with torch.no_grad():
            logits = model(torch.tensor([ids[:-1]])).double().log_softmax(-1)[0]
        return float(logits.gather(-1, torch.tensor(ids[1:])[:, None]).sum())

    right = right_norm = 0
    for line in mc.read_text().splitlines():
        item = json.loads(line)
        lls = [
            logp(tok.encode(item["context"] + c)) - logp(tok.encode(item["context"])) for c in item["choices"]
        ]
        norm = [ll / len(c) for ll, c in zip(lls, item["choices"], strict=True)]
        right += max(range(2), key=lls.__getitem__) == item["gold"]
        right_norm += max(range(2), key=norm.__getitem__) == item["gold"]
    assert got["mc/acc"] == right / 7 and got["mc/acc_norm"] == right_norm / 7
    texts = [json.loads(line)["text"] for line in ppl.read_text().splitlines()]
    nats = -sum(logp(tok.encode(t)) for t in texts)
    tokens = sum(len(tok.encode(t)) - 1 for t in texts)
    # float32 logits (batched, padded) against float64 one sequence at a time: ~1e-6 relative per token
    assert got["ppl/loss"] == pytest.approx(nats / tokens, rel=1e-5)
    # the same nats over a byte count: the same relative bound
    assert got["ppl/bpb"] == pytest.approx(nats / math.log(2) / sum(len(t.encode()) for t in texts), rel=1e-5)


def test_accuracy_rises_on_a_taught_task_and_stays_at_chance_otherwise(byte_data, tmp_path, cli_env):
    taught = shakespeare_task(tmp_path / "shakespeare.jsonl", 60, 0)
    untaught = random_task(tmp_path / "random.jsonl", 60, 0)
    config = write_config(
        tmp_path,
        byte_data["mix"],
        training={"train_steps": 12},
        schedule={"warmup_steps": 3, "total_steps": 12},
        logging={"log_every": 4},
        checkpoint={"save_every": 0},
        eval={"every": 1, "iters": 1, "tasks": [str(taught), str(untaught)]},
    )
    out = llm_train([config, "--deepspeed", DS, "-o", tmp_path / "run"], cli_env, timeout=600)
    assert out.returncode == 0, out.stderr
    evals = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == list(range(1, 13))
    first, last = evals[0], evals[-1]
    assert last["shakespeare/acc"] >= 0.9 and last["shakespeare/acc"] >= first["shakespeare/acc"] + 0.1, evals
    # chance is 0.5; 60 two-way examples: standard deviation 0.065, so 0.5 +- 0.25 is ~4 sigma
    assert all(abs(r["random/acc"] - 0.5) <= 0.25 for r in evals), evals
    assert "shakespeare acc" in out.stderr

    # lm-evaluation-harness on the final checkpoint, through llm-ckpt eval: the same accuracies
    pytest.importorskip("lm_eval")
    harness = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmtools.cli.ckpt",
            "eval",
            tmp_path / "run",
            "--tasks",
            taught,
            "--tasks",
            untaught,
        ],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert harness.returncode == 0, harness.stderr
    report = json.loads(harness.stdout)
    assert report["checkpoint"].endswith("step_00000012")
    for task in ("shakespeare", "random"):
        for metric in ("acc", "acc_norm"):
            # a count of right answers over 60 examples: equal unless a choice is a near-tie in float32
            assert report["results"][task][metric] == last[f"{task}/{metric}"], (task, metric, report)
    assert json.loads((tmp_path / "run" / "eval" / "step_00000012.json").read_text()) == report


MOE = {
    "preset": "tiny-moe",
    "head_dim": 16,
    "num_experts": 4,
    "moe_intermediate_size": 64,
}
LORA = {"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def llm_ckpt_eval(run: Path, tasks: list[Path], env: dict) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "llmtools.cli.ckpt", "eval", run]
    for task in tasks:
        args += ["--tasks", task]
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("kind", ["moe", "lora"])
def test_llm_ckpt_eval_agrees_with_the_loop_on_any_checkpoint(byte_data, tmp_path, cli_env, kind):
    """Under ZeRO-3 (weights in partitions; the dense ZeRO-2 case is the test above), a MoE and a LoRA run
    (adapters kept apart from the frozen base): llm-ckpt eval scores the final checkpoint as the training
    loop scored it."""
    pytest.importorskip("lm_eval")
    task = random_task(tmp_path / "random.jsonl", 24, 3)
    sections = {
        "training": {"train_steps": 2},
        "schedule": {"warmup_steps": 1, "total_steps": 2},
        "checkpoint": {"save_every": 0, "save_final": True},
        "eval": {"every": 2, "iters": 1, "tasks": [str(task)]},
    }
    if kind == "moe":
        sections["model"] = MOE
    if kind == "lora":
        import torch

        from llmtools.model import LlamaForCausalLM
        from llmtools.model.hf import save_hf_folder
        from llmtools.train.config import from_dict
        from llmtools.train.plan import resolve_model_config

        raw = yaml.safe_load(write_config(tmp_path, byte_data["mix"], **sections).read_text())
        shape = resolve_model_config(from_dict(raw, "train.yaml"))
        torch.manual_seed(5)
        save_hf_folder(LlamaForCausalLM(shape), shape, tmp_path / "base")
        sections["model"] = {"init_from": str(tmp_path / "base")}
        sections["lora"] = LORA
    config = write_config(tmp_path, byte_data["mix"], **sections)
    out = llm_train([config, "--deepspeed", DS.replace("zero2", "zero3"), "-o", tmp_path / "run"], cli_env)
    assert out.returncode == 0, out.stderr
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    (loop,) = [r for r in records if r["kind"] == "eval"]
    # the run is the kind it is meant to be
    from llmtools.ckpt import layout, safeload

    states = safeload.load(layout.model_states_file(tmp_path / "run/checkpoints/step_00000002"), mmap=True)
    assert (kind == "lora") == bool(states.get("lora"))
    assert (kind == "moe") == ("moe_aux_loss" in next(r for r in records if r["kind"] == "train"))
    # ZeRO-3 saves empty placeholders in the model states: the weights are in the partitions
    assert any(v.numel() == 0 for v in states["module"].values())
    harness = llm_ckpt_eval(tmp_path / "run", [task], cli_env)
    assert harness.returncode == 0, harness.stderr
    report = json.loads(harness.stdout)
    assert report["checkpoint"].endswith("step_00000002")
    for metric in ("acc", "acc_norm"):
        # a count of right answers over 24 examples: equal unless a choice is a near-tie in float32
        assert report["results"]["random"][metric] == loop[f"random/{metric}"], (metric, report, loop)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", ":1: not JSON"),
        (
            '{"context": "a", "choices": ["b", "c"], "gold": 2}',
            ":1: gold: expected the index of the right choice",
        ),
        ('{"context": "a", "choices": ["b"], "gold": 0}', ":1: choices: expected a list of at least 2"),
    ],
)
def test_a_bad_task_file_is_one_line_exit_2(byte_data, tmp_path, cli_env, line, message):
    task = tmp_path / "bad.jsonl"
    task.write_text(line + "\n")
    config = write_config(tmp_path, byte_data["mix"], eval={"every": 2, "tasks": [str(task)]})
    out = llm_train([config, "--deepspeed", DS, "-o", tmp_path / "run"], cli_env, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{task}{message}" in lines[0], out.stderr
    assert not (tmp_path / "run").exists()


def test_per_source_validation_loss_adds_up_to_the_eval_loss(byte_data, tmp_path, cli_env):
    config = write_config(
        tmp_path,
        byte_data["mix"],
        training={"train_steps": 2},
        checkpoint={"save_every": 0},
        eval={"every": 2, "iters": 4, "per_source": True},
    )
    out = llm_train([config, "--deepspeed", DS, "-o", tmp_path / "run"], cli_env, timeout=300)
    assert out.returncode == 0, out.stderr
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    (record,) = [r for r in records if r["kind"] == "eval"]
    names = [Path(p).name for p in byte_data["prefixes"]]
    tokens = {name: record[f"{name}/tokens"] for name in names}
    assert sum(tokens.values()) == record["eval_tokens"] and min(tokens.values()) > 0
    mean = sum(record[f"{name}/loss"] * tokens[name] for name in names) / record["eval_tokens"]
    # the same float32 cross-entropies summed in another order, over ~2k tokens
    assert mean == pytest.approx(record["eval_loss"], rel=1e-5)
    assert all(0 < record[f"{name}/bpb"] < 20 for name in names)  # bytes are known: the byte tokenizer


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "--tasks: {task}: no such task file"),
        (
            '{"context": "a", "choices": ["b", "c"]}\n',
            "{task}:1: gold: expected the index of the right choice (0..1)",
        ),
    ],
)
def test_llm_ckpt_eval_bad_task_is_one_line_exit_2(tmp_path, cli_env, content, message):
    pytest.importorskip("lm_eval")
    task = tmp_path / "task.jsonl"
    if content is not None:
        task.write_text(content)
    out = subprocess.run(
        [sys.executable, "-m", "llmtools.cli.ckpt", "eval", tmp_path / "nowhere", "--tasks", task],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    # the task is checked first: before the checkpoint is even looked for
    assert out.stderr.strip().splitlines() == [f"llm-ckpt: error: {message.format(task=task)}"]
