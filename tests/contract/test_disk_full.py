"""A disk that fills up, for real: every long command writes into a tiny tmpfs (a private mount that exists
only while the command runs) and must end with exit 1, one line naming the output and saying the disk
is full, and nothing of its own left on that filesystem (so the disk is not left full either).

Where mounting is not allowed (no ``unshare``, no user namespaces) the tests skip, saying so.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from tests.contract.conftest import REPO, World, error_line, run_on_full_disk, small_filesystem_runner
from tests.contract.test_bad_inputs import BIG, CHAT, PAIR, copy_world_prefix, lines


@dataclass
class Case:
    name: str
    argv: list[str]
    size_kib: int
    leave_kib: int | None = None  # fill the filesystem first, leaving this much free
    files: dict[str, bytes] | None = None
    copies: tuple[str, ...] = ()  # copies of the world's dataset (prefixes in the folder)


CASES = [
    Case(
        "json2bin",
        ["llm-prep", "json2bin", "big.jsonl", "-t", "{w.gpt2}", "-o", "fs/out/x"],
        64,
        files={"big.jsonl": BIG},
    ),
    Case(
        "json2bin-byte",
        ["llm-prep", "json2bin", "big.jsonl", "-t", "byte", "-o", "fs/x", "--workers", "1"],
        256,
        files={"big.jsonl": BIG},
    ),
    Case(
        "sft",
        ["llm-prep", "sft", "chats.jsonl", "-t", "byte", "--chat-template", "chatml", "-o", "fs/s"],
        32,
        files={"chats.jsonl": lines(*[CHAT] * 2000)},
    ),
    Case(
        "pref",
        ["llm-prep", "pref", "pairs.jsonl", "-t", "byte", "--chat-template", "chatml", "-o", "fs/p"],
        32,
        files={"pairs.jsonl": lines(*[PAIR] * 1000)},
    ),
    Case("merge", ["llm-prep", "merge", "p*", "-o", "fs/m"], 32, copies=tuple(f"p{i}" for i in range(8))),
    Case("hf2bin", ["llm-prep", "hf2bin", "{w.hf}", "-o", "fs/h"], 64, leave_kib=8),
    Case(
        "tokenizer-train",
        ["llm-prep", "tokenizer", "train", "big.jsonl", "--vocab-size", "400", "-o", "fs/tok.json"],
        64,
        leave_kib=4,
        files={"big.jsonl": BIG},
    ),
    Case("sample-corpus", ["llm-prep", "sample-corpus", "-o", "fs/raw", "--docs", "3000"], 128),
    Case(
        "mix", ["llm-mix", "{w.prefix}", "--seq-length", "16", "--num-samples", "600", "-o", "fs/mix.json"], 8
    ),
    Case(
        "mix-materialize",
        [
            "llm-mix",
            "{w.prefix}",
            "--seq-length",
            "16",
            "--num-samples",
            "600",
            "-o",
            "fs/mix.json",
            "--materialize",
            "fs/samples",
        ],
        24,
    ),
    Case("export", ["llm-export", "hf", "{w.prefix}", "-o", "fs/hf"], 64, leave_kib=16),
    Case(
        "export-parquet",
        ["llm-export", "hf", "{w.prefix}", "-o", "fs/pq", "--format", "parquet"],
        64,
        leave_kib=8,
    ),
    Case("convert-hf", ["llm-ckpt", "convert", "{w.run}", "--to", "hf", "-o", "fs/hf"], 96),
    Case(
        "convert-safetensors",
        ["llm-ckpt", "convert", "{w.run}", "--to", "safetensors", "-o", "fs/m.safetensors"],
        96,
    ),
    Case(
        "convert-universal",
        ["llm-ckpt", "convert", "{w.checkpoint}", "--to", "universal", "-o", "fs/univ"],
        256,
    ),
    Case("log-tb", ["llm-log", "tb", "many.jsonl", "--logdir", "fs/tb"], 64, leave_kib=8),
    Case("log-plot", ["llm-log", "plot", "{w.metrics}", "-o", "fs/curves.png"], 64, leave_kib=8),
]


def _many_metrics() -> bytes:
    import json

    return b"".join(
        json.dumps(
            {"kind": "train", "step": s, "loss": 3.0 - s * 1e-5, "lr": 1e-3, "grad_norm": 1.0}
        ).encode()
        + b"\n"
        for s in range(1, 20001)
    )


@pytest.fixture(scope="module")
def outcomes(world: World, tmp_path_factory):
    """Every case once, in parallel (each command in its own mount namespace)."""
    small_filesystem_runner()  # skips here, once, when mounts are not allowed
    root = tmp_path_factory.mktemp("full")

    def one(case: Case):
        d = root / case.name
        d.mkdir()
        return case.name, run_case(case, world, d)

    with ThreadPoolExecutor(max_workers=max(2, min(6, (os.cpu_count() or 2) + 1))) as pool:
        return dict(pool.map(one, CASES))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_full_disk_is_one_named_error_and_leaves_nothing(case: Case, outcomes):
    proc, listing, argv = outcomes[case.name]
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 1, f"exit {proc.returncode}:\n{err[-3000:]}"
    line = error_line(proc, argv[0])
    assert re.search(r"fs/\S*: no space left on device", line), line
    mine = [entry for entry in listing if entry != "./filler"]
    assert mine == [], f"left on the full filesystem: {mine}"


def run_case(case: Case, world: World, tmp_path):
    files = dict(case.files or {})
    copy_world_prefix(case.copies, tmp_path, world)
    if case.name == "log-tb":
        files["many.jsonl"] = _many_metrics()
    for relative, content in files.items():
        (tmp_path / relative).write_bytes(content)
    prepare = ""
    if case.leave_kib is not None:  # a filler file takes all but leave_kib
        filler = (case.size_kib - case.leave_kib) * 1024
        prepare = f"head -c {filler} /dev/zero > fs/filler || exit 98"
    argv = [a.format(w=world) if "{w." in a else a for a in case.argv]
    proc, listing = run_on_full_disk(argv, tmp_path, case.size_kib, prepare)
    return proc, listing or [], argv


READ_ONLY = [
    ("json2bin", ["llm-prep", "json2bin", "{w.corpus}", "-t", "{w.gpt2}", "-o", "fs/x"]),
    ("export", ["llm-export", "hf", "{w.prefix}", "-o", "fs/hf"]),
    ("log-tb", ["llm-log", "tb", "{w.metrics}", "--logdir", "fs/tb"]),
]


@pytest.mark.parametrize(("name", "argv"), READ_ONLY, ids=[name for name, _ in READ_ONLY])
def test_read_only_output_is_one_named_error(name, argv, world: World, tmp_path):
    """An output on a read-only filesystem (what chmod cannot simulate for root): exit 1, the output named."""
    argv = [a.format(w=world) if "{w." in a else a for a in argv]
    proc, listing = run_on_full_disk(argv, tmp_path, 64, "mount -o remount,ro fs || exit 97")
    assert proc.returncode == 1, proc.stderr.decode()[-2000:]
    line = error_line(proc, argv[0])
    assert re.search(r"fs/\S*: Read-only file system", line), line
    assert listing == []


def test_a_checkpoint_save_that_fills_the_disk(world: World, tmp_path):
    """llm-train's own save: DeepSpeed's torch.save says "unexpected pos"; the run ends with exit 1 naming
    the checkpoint being written, and no half-written checkpoint folder is left."""
    argv = [
        "llm-train",
        str(world.tiny_yaml),
        "--deepspeed",
        str(REPO / "configs/deepspeed/zero1.json"),
        "-o",
        "fs/run",
    ]
    proc, listing = run_on_full_disk(argv, tmp_path, 256)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 1, err[-3000:]
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert re.match(r"llm-train: error: fs/run/checkpoints/step_\S+: no space left on device", last), last
    assert not [entry for entry in listing if ".tmp-" in entry or "step_" in entry], listing
