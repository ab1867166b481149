"""``llm-ckpt eval`` against lm-evaluation-harness's own ``hf`` model on our exported Hugging Face folder:
the same checkpoint, the same multiple-choice task, the same numbers."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys

import pytest

from tests.conftest import shared

pytest.importorskip("lm_eval")
pytest.importorskip("transformers")


def run(args, env, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "llmtools.cli.ckpt", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_llm_ckpt_eval_equals_lm_eval_hf_on_the_exported_folder(tmp_path, cli_env):
    import transformers

    gpt2 = shared("tokenizers/gpt2")
    # A random tiny Llama with GPT-2's vocabulary, brought in as our checkpoint (import-hf)
    config = transformers.LlamaConfig(
        vocab_size=50257, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False,
    )  # fmt: skip
    transformers.set_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "random")
    out = run(["import-hf", tmp_path / "random", "-o", tmp_path / "ckpt"], cli_env)
    assert out.returncode == 0, out.stderr

    rng = random.Random(0)
    words = "the cat dog sat ran on a mat hill king queen sword night day sun moon red blue".split()
    items = []
    for _ in range(40):
        context = " ".join(rng.choice(words) for _ in range(6))
        choices = [" " + " ".join(rng.choice(words) for _ in range(rng.randint(1, 3))) for _ in range(3)]
        items.append({"context": context, "choices": choices, "gold": rng.randrange(3)})
    task = tmp_path / "words.jsonl"
    task.write_text("".join(json.dumps(item) + "\n" for item in items))
    # no question text: an empty context, one-token and longer choices (lm-eval scores each choice's first
    # token after its prefix token)
    blank = tmp_path / "blank.jsonl"
    blank.write_text("".join(
        json.dumps({"context": "", "choices": [rng.choice(words), " " + " ".join(rng.sample(words, 3))],
                    "gold": rng.randrange(2)}) + "\n"
        for _ in range(16)
    ))  # fmt: skip

    ours = run(
        ["eval", tmp_path / "ckpt", "--tasks", task, "--tasks", blank, "--tokenizer", gpt2 / "tokenizer.json"],
        cli_env,
    )
    assert ours.returncode == 0, ours.stderr
    ours_blank = json.loads(ours.stdout)["results"]["blank"]
    ours = json.loads(ours.stdout)["results"]["words"]

    # lm-eval's own hf model on the folder llm-ckpt convert exports (GPT-2's tokenizer copied in)
    out = run(
        ["convert", tmp_path / "ckpt", "--to", "hf", "-o", tmp_path / "hf", "--tokenizer", gpt2], cli_env
    )
    assert out.returncode == 0, out.stderr
    import yaml

    from llmtools.ckpt.harness import task_yaml
    from llmtools.formats.tasks import read_task_files

    (tmp_path / "tasks").mkdir()
    for found in read_task_files([str(task), str(blank)]):
        (tmp_path / "tasks" / f"{found.name}.yaml").write_text(yaml.safe_dump(task_yaml(found)))
    script = f"""
import json, lm_eval
from lm_eval.tasks import TaskManager
r = lm_eval.simple_evaluate(
    model="hf",
    model_args={{"pretrained": "{tmp_path / "hf"}", "device": "cpu", "dtype": "float32", "prefix_token_id": 50256}},
    tasks=["words", "blank"], task_manager=TaskManager(include_path="{tmp_path / "tasks"}"), batch_size=8)
print(json.dumps(r["results"]))
"""
    env = {**cli_env, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    # lm-eval's hf model starts a process group when it sees a rank in the environment (accelerate): one
    # left by an in-process training test of the same worker is not this single process's
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK"):
        env.pop(name, None)
    theirs = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    assert theirs.returncode == 0, theirs.stderr[-3000:]
    theirs = json.loads(theirs.stdout.strip().splitlines()[-1])
    theirs_blank, theirs = theirs["blank"], theirs["words"]
    assert ours_blank["acc"] == theirs_blank["acc,none"], (ours_blank, theirs_blank)
    assert ours_blank["acc_norm"] == theirs_blank["acc_norm,none"], (ours_blank, theirs_blank)
    # counts of right answers over 40 examples, from fp32 logits of the same weights and token ids
    assert ours["acc"] == theirs["acc,none"] and ours["acc_norm"] == theirs["acc_norm,none"], (ours, theirs)
    shutil.rmtree(tmp_path / "hf")
