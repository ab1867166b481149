"""Every shipped train config passes ``llm-train --dry-run`` right after ``make pretrain``, run from the
folder holding ``out/pretrain`` as a user runs it: the fine-tuning configs read the Hugging Face folder
``make pretrain`` writes (``out/pretrain/hf``) and take its shape from it.

The data each config's own comment says to make first (``llm-prep sft`` / ``llm-prep pref`` on a chat or
preference file) is made as the comment says. Two configs are run with stated changes: ``tiny-dpo.yaml``
starts from ``runs/tiny-sft`` (the output of ``tiny-sft.yaml``, not of ``make pretrain``) and here from
``out/pretrain/hf``; ``125m.yaml`` and ``1b.yaml`` read a mix of 2.5B / 20B tokens at sequence length 2048
(``data/mix.json``, from a real corpus) and here ``make pretrain``'s mix, at its length, for 100 steps.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.contract.conftest import contract_env

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CONFIGS = sorted(p.name for p in (ROOT / "configs" / "train").glob("*.yaml"))
CHANGES = {
    "tiny-dpo.yaml": ["model.init_from=out/pretrain/hf"],
    "125m.yaml": ["data.mix=out/pretrain/mix.json", "data.seq_length=128", "training.train_tokens=null",
                  "training.train_steps=100", "training.global_batch_size=16", "schedule.total_steps=100",
                  "schedule.warmup_steps=10"],
    "1b.yaml": ["data.mix=out/pretrain/mix.json", "data.seq_length=128", "training.train_tokens=null",
                "training.train_steps=100", "training.global_batch_size=16", "schedule.total_steps=100",
                "schedule.warmup_steps=10"],
}  # fmt: skip


@pytest.fixture(scope="module")
def after_pretrain(tmp_path_factory) -> Path:
    """A folder as after ``make pretrain`` (its defaults; two training steps instead of 200), plus the SFT
    and preference data the fine-tuning configs' comments make."""
    if shutil.which("make") is None:
        pytest.skip("needs GNU make")
    home = tmp_path_factory.mktemp("user")
    steps = ("--set training.train_steps=2 --set schedule.warmup_steps=0 --set checkpoint.save_every=2 "
             "--set eval.every=0")  # fmt: skip
    made = subprocess.run(
        ["make", "-o", ".venv/.setup-stamp", "-o", "setup", "pretrain", f"OUT={home}/out/pretrain",
         f"TRAIN_ARGS={steps}"],
        cwd=ROOT, capture_output=True, text=True, timeout=1200, env=contract_env(),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr[-4000:]
    (home / "configs").symlink_to(ROOT / "configs")
    chats = [{"messages": [{"role": "user", "content": f"What is {i} + {i}? " * 3},
                           {"role": "assistant", "content": f"It is {2 * i}. " * 3}]} for i in range(3000)]  # fmt: skip
    (home / "chat.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))
    pairs = [
        {"prompt": f"What is {i} + {i}?", "chosen": f"{2 * i}.", "rejected": "No idea."} for i in range(2000)
    ]
    (home / "prefs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    for argv in (
        ["llm-prep", "sft", "chat.jsonl", "-t", "byte", "--chat-template", "chatml", "--max-length", "257", "--pack",
         "-o", "out/sft/chat"],
        ["llm-prep", "pref", "prefs.jsonl", "-t", "byte", "--chat-template", "chatml", "--max-length", "257",
         "--max-prompt-length", "128", "-o", "out/pref/prefs"],
    ):  # fmt: skip
        proc = subprocess.run([str(BIN / argv[0]), *argv[1:]], cwd=home, capture_output=True, text=True,
                              env=contract_env(), timeout=600)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
    return home


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
def test_every_shipped_config_passes_a_dry_run_after_make_pretrain(after_pretrain, name):
    sets = [arg for item in CHANGES.get(name, []) for arg in ("--set", item)]
    proc = subprocess.run(
        [str(BIN / "llm-train"), f"configs/train/{name}", "--deepspeed", "zero2", "--dry-run", "--json", *sets],
        cwd=after_pretrain, capture_output=True, text=True, env=contract_env(), timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["steps"] > 0
