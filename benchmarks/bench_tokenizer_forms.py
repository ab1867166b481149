"""``llm-prep sft`` with one tokenizer given in each of its forms, timed as whole processes.

The forms: a Hugging Face tokenizer folder used for the first time (an empty cache), the same folder again,
and the folder's own ``tokenizer.json``; and, for contrast, a folder that only transformers can read (its
``tokenizer_config.json`` names a model class), first and again. Each round runs every form once, in turn,
so the host's load weighs on all alike (the compiled C helpers, kept in the same cache, are built
beforehand); the figures are medians over the rounds, as ratios to the
``tokenizer.json`` run. Every form must write the same bytes (checked).

The folders are written by transformers' ``save_pretrained`` from ``../shared/data/tokenizers/gpt2`` with
ChatML tokens and a chat template, the chats are generated (``--chats``, four user and four assistant turns).

    .venv/bin/python benchmarks/bench_tokenizer_forms.py [--chats 64] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.conftest import shared  # noqa: E402 - the shared data, found as the tests find it

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WORDS = "the quick brown fox jumps over a lazy dog café 中文 hello world 42 <b>bold</b>".split()


def make_folder(path: Path) -> Path:
    import transformers

    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(shared("tokenizers/gpt2/tokenizer.json")),
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
    )
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = TEMPLATE
    tok.save_pretrained(path)
    return path


def model_class_folder(plain: Path, path: Path) -> Path:
    """The same files, its config naming GPT-2's class: transformers' reading is then the only exact one."""
    path.mkdir()
    for name in os.listdir(plain):
        (path / name).write_bytes((plain / name).read_bytes())
    config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["tokenizer_class"] = "GPT2Tokenizer"
    (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return path


def make_chats(path: Path, count: int) -> Path:
    rng = random.Random(0)
    with open(path, "w", encoding="utf-8") as handle:
        for _ in range(count):
            messages = []
            for _ in range(4):
                messages.append({"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(30))})
                messages.append(
                    {"role": "assistant", "content": " ".join(rng.choice(WORDS) for _ in range(60))}
                )
            handle.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")
    return path


def run_sft(chats: Path, tokenizer: Path, prefix: Path, cache: Path) -> tuple[float, bytes, str]:
    env = {**os.environ, "LLMTOOLS_CACHE": str(cache)}
    command = [
        str(Path(sys.executable).parent / "llm-prep"),
        "sft",
        str(chats),
        "-t",
        str(tokenizer),
        "-o",
        str(prefix),
    ]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr}")
    written = b"".join(
        Path(f"{prefix}_{k}_document.{e}").read_bytes()
        for k in ("input_ids", "loss_mask")
        for e in ("bin", "idx")
    )
    return seconds, written, done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one round of 8 chats")
    args = parser.parse_args()
    if args.quick:
        args.chats, args.rounds = 8, 1
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        plain = make_folder(root / "tok")
        model = model_class_folder(plain, root / "tok-class")
        chats = make_chats(root / "chats.jsonl", args.chats)
        times: dict[str, list[float]] = {}
        outputs = {}
        # The cache also holds the compiled C helpers, built by a command's first run on a machine: built
        # here once, so that "first use" measures the tokenizer folder alone.
        warm = root / "cache-helpers"
        run_sft(chats, plain / "tokenizer.json", root / "warm" / "sft", warm)
        for round_number in range(args.rounds):
            cache = root / f"cache{round_number}"  # no tokenizer views: the first use of each folder
            shutil.copytree(warm, cache, ignore=shutil.ignore_patterns("tokenizers"))
            forms = [
                ("folder, first use", plain),
                ("folder, again", plain),
                ("tokenizer.json", plain / "tokenizer.json"),
                ("model-class folder, first use", model),
                ("model-class folder, again", model),
            ]
            for i, (name, tokenizer) in enumerate(forms):
                seconds, written, stderr = run_sft(
                    chats, tokenizer, root / f"out{round_number}_{i}" / "sft", cache
                )
                if name == "folder, first use" and "through transformers" in stderr:
                    raise SystemExit("the plain folder was read through transformers")
                times.setdefault(name, []).append(seconds)
                outputs[name] = written
        if len(set(outputs.values())) != 1:
            raise SystemExit(f"the forms wrote different bytes: {sorted(outputs)}")
        base = statistics.median(times["tokenizer.json"])
        print(
            f"llm-prep sft, {args.chats} chats, whole processes, median of {args.rounds} interleaved rounds"
        )
        print(f"{'form':32s} {'seconds':>8s} {'vs tokenizer.json':>18s}  rounds")
        for name, values in times.items():
            median = statistics.median(values)
            rounds = ", ".join(f"{v:.2f}" for v in values)
            print(f"{name:32s} {median:8.2f} {median / base:17.2f}x  {rounds}")
        print("outputs: identical bytes for every form")


if __name__ == "__main__":
    main()
