"""Outputs honour the umask, as ``open()`` and ``mkdir`` do: 0644 files and 0755 folders under umask 022,
0600 and 0700 under 077 — and they still appear only when complete (temporaries, then a rename)."""

from __future__ import annotations

import os
import stat
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.contract.conftest import World, contract_env, script
from tests.contract.test_bad_inputs import CHAT, PAIR, lines

COMMANDS = {
    "json2bin": ["llm-prep", "json2bin", "{w.corpus}", "-t", "{w.gpt2}", "-o", "out/data/x"],
    "sft": ["llm-prep", "sft", "chats.jsonl", "-t", "byte", "--chat-template", "chatml", "-o", "out/sft/s"],
    "pref": ["llm-prep", "pref", "pairs.jsonl", "-t", "byte", "--chat-template", "chatml", "-o", "out/pref/p"],
    "merge": ["llm-prep", "merge", "{w.prefix}", "-o", "out/merge/m"],
    "hf2bin": ["llm-prep", "hf2bin", "{w.hf}", "-o", "out/h/h"],
    "tokenizer": ["llm-prep", "tokenizer", "train", "{w.corpus}", "--vocab-size", "300", "-o", "out/tok/tokenizer.json"],
    "sample-corpus": ["llm-prep", "sample-corpus", "-o", "out/raw", "--docs", "20"],
    "mix": ["llm-mix", "{w.prefix}", "--seq-length", "16", "--num-samples", "32", "-o", "out/mix/mix.json",
            "--materialize", "out/mix/samples"],
    "export": ["llm-export", "hf", "{w.prefix}", "-o", "out/hf"],
    "convert": ["llm-ckpt", "convert", "{w.run}", "--to", "hf", "-o", "out/model"],
    "safetensors": ["llm-ckpt", "convert", "{w.run}", "--to", "safetensors", "-o", "out/st/model.safetensors"],
    "tb": ["llm-log", "tb", "{w.metrics}", "--logdir", "out/tb"],
    "plot": ["llm-log", "plot", "{w.metrics}", "-o", "out/plot/curves.png"],
}  # fmt: skip


def modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.lstat().st_mode) for p in [root, *root.rglob("*")]}


def run_under_umask(umask: int, names: list[str], world: World, base: Path) -> dict[str, tuple]:
    def one(name: str):
        d = base / f"{name}-{umask:03o}"
        d.mkdir()
        (d / "chats.jsonl").write_bytes(lines(*[CHAT] * 5))
        (d / "pairs.jsonl").write_bytes(lines(*[PAIR] * 5))
        argv = [a.format(w=world) if "{w." in a else a for a in COMMANDS[name]]
        # The umask is set by a shell that then execs the command (no preexec_fn: not thread-safe).
        proc = subprocess.run(
            ["sh", "-c", f'umask {umask:03o} && exec "$0" "$@"', script(argv[0]), *map(str, argv[1:])],
            cwd=d, capture_output=True, env=contract_env(), timeout=300,
        )  # fmt: skip
        return name, (proc, d / "out")

    with ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2))) as pool:
        return dict(pool.map(one, names))


# Under 022 every command's outputs are checked by tests/contract/test_examples.py (all README examples);
# 077 shows that the umask is honoured, not replaced by a fixed 0644.
@pytest.mark.parametrize(
    ("umask", "names"),
    [(0o077, ["json2bin", "sft", "pref", "merge", "mix", "export", "convert", "tb", "plot"])],
)
def test_outputs_honour_the_umask(umask, names, world, tmp_path):
    results = run_under_umask(umask, names, world, tmp_path)
    wrong = []
    for name, (proc, out) in results.items():
        assert proc.returncode == 0, f"{name}: {proc.stderr.decode()[-2000:]}"
        for rel, mode in modes(out).items():
            want = (0o777 if Path(out, rel).is_dir() else 0o666) & ~umask
            if mode != want:
                wrong.append(f"{name}: {rel} is {mode:o}, expected {want:o}")
        assert not [p for p in out.rglob("*") if ".tmp-" in p.name], f"{name} left temporaries"
    assert wrong == []


def test_the_trained_run_honours_the_umask(world):
    """The world's run was written by llm-train under this session's umask: checkpoints, meta, metrics."""
    umask = os.umask(0)
    os.umask(umask)
    wrong = [
        f"{rel}: {mode:o}"
        for rel, mode in modes(world.run).items()
        if mode != ((0o777 if (world.run / rel).is_dir() else 0o666) & ~umask)
        # DeepSpeed copies its recovery scripts into the checkpoints as executables (0744)
        and Path(rel).name not in ("zero_to_fp32.py", "zero_to_torch.py")
    ]
    assert wrong == []
