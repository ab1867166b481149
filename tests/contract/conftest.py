"""The process-level contract, proven by real processes: what every contract test shares.

* :func:`world`: a tiny but complete set of inputs and earlier outputs (JSONL, tokenized datasets, a
  mix, an HF export, a trained run with checkpoints and metrics), built once per session. Rows read
  it and never write it; its checksums are compared at the end of the session.
* :func:`run_cli`: one installed console script in a subprocess, with a timeout.
* :func:`tree_state` / :func:`changes`: file listings with checksums, for "nothing left behind,
  inputs and earlier outputs untouched".
* :func:`small_filesystem`: a tiny tmpfs in a private mount namespace (gone when the command ends, even
  if the test dies), to fill a disk for real; skipped with the reason where mounts are not allowed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO, SHARED_DATA

BIN = Path(sys.executable).parent
HOOKS = Path(__file__).resolve().parent / "hooks"
COMMANDS = ("llm-prep", "llm-mix", "llm-export", "llm-train", "llm-ckpt", "llm-log")


def script(name: str) -> str:
    """The installed console script (the .venv's), else the checkout's bin/ wrapper."""
    installed = BIN / name
    return str(installed if installed.exists() else REPO / "bin" / name)


def contract_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("LLMTOOLS_DEBUG", None)
    env.update({"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
    env.update(extra)
    return env


# A test runner started in the background (`pytest &` in a script) has SIGINT ignored, under `nohup`
# SIGHUP, and its children would inherit that (an ignored signal stays ignored across exec, and the
# commands rightly keep it so); they must see the default disposition, as under a terminal or a batch
# scheduler. Set here, once, in the main thread: a preexec_fn would do it per child, but is not safe
# with the thread pools that start the commands (a child can deadlock between fork and exec).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
for _signum in (signal.SIGHUP, signal.SIGTERM):
    if signal.getsignal(_signum) is signal.SIG_IGN:
        # Still ignored here, as asked; but a handler, unlike SIG_IGN, is not inherited through exec.
        signal.signal(_signum, lambda *_: None)


def run_cli(argv: list[str], cwd: Path, stdin: bytes | None = None, timeout: float = 240, env=None):
    """Run ``argv`` (its first item a command name such as ``llm-prep``) as a real process."""
    command = [script(argv[0]) if argv[0] in COMMANDS else argv[0], *map(str, argv[1:])]
    return subprocess.run(
        command,
        cwd=cwd,
        input=stdin if stdin is not None else b"",
        capture_output=True,
        timeout=timeout,
        env=env or contract_env(),
    )


def start_cli(argv: list[str], cwd: Path, env=None, stdin=subprocess.DEVNULL) -> subprocess.Popen:
    command = [script(argv[0]) if argv[0] in COMMANDS else argv[0], *map(str, argv[1:])]
    return subprocess.Popen(
        command,
        cwd=cwd,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env or contract_env(),
    )


# -- file states -----------------------------------------------------------------------------------
def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tree_state(root: Path) -> dict[str, str]:
    """Every file and folder under ``root``: its sha256 (files), 'dir' or the link target."""
    state = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            path = Path(folder, name)
            state[str(path.relative_to(root))] = f"link:{os.readlink(path)}" if path.is_symlink() else "dir"
        for name in files:
            path = Path(folder, name)
            rel = str(path.relative_to(root))
            state[rel] = f"link:{os.readlink(path)}" if path.is_symlink() else _digest(path)
    return state


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """What differs: '+new', '-gone', '~changed' paths."""
    out = [f"+{p}" for p in sorted(after.keys() - before.keys())]
    out += [f"-{p}" for p in sorted(before.keys() - after.keys())]
    out += [f"~{p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]]
    return out


def temporaries(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".tmp-" in p.name)


def error_line(proc, prog: str) -> str:
    """The one line a failing command writes on stderr; asserts there is exactly one and no traceback."""
    err = proc.stderr.decode("utf-8", "replace")
    out = proc.stdout.decode("utf-8", "replace")
    assert "Traceback" not in err and "Traceback" not in out, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{err}"
    assert lines[0].startswith(f"{prog}: "), lines[0]
    return lines[0]


# -- the world -------------------------------------------------------------------------------------
@dataclass
class World:
    root: Path
    gpt2: Path  # tokenizer.json: json2bin's default backend is gigatoken with it
    corpus: Path  # good JSONL, 300 documents
    chats: Path  # good chat JSONL
    prefix: Path  # byte-tokenized dataset (uint16)
    prefix_gpt2: Path  # the same corpus with gpt2 (another tokenizer)
    mix: Path  # mix.json over prefix
    hf: Path  # llm-export hf folder of prefix
    parquet: Path  # llm-export hf --format parquet folder of prefix
    run: Path  # a trained run: checkpoints at steps 1 and 2, metrics.jsonl
    checkpoint: Path  # its step 2
    metrics: Path
    tiny_yaml: Path  # a train config over prefix that trains in seconds


TINY_TRAIN = """\
model:
  preset: tiny
  hidden_size: 32
  intermediate_size: 64
  num_hidden_layers: 1
  num_attention_heads: 2
  num_key_value_heads: 1
  vocab_size: 512
data:
  prefixes: [{prefix}]
  seq_length: 16
training:
  micro_batch_size: 2
  global_batch_size: 2
  train_steps: 2
  precision: fp32
optimizer:
  lr: 1.0e-3
schedule:
  kind: constant
  warmup_steps: 0
eval:
  every: 0
logging:
  log_every: 1
checkpoint:
  save_every: 1
"""


def _inproc(module: str, *args) -> None:
    """A command's real ``main`` in this process (building inputs only: no claim rests on it)."""
    import importlib

    main = importlib.import_module(f"llmtools.cli.{module}").main
    saved = sys.argv
    sys.argv = [f"llm-{module}", *map(str, args)]
    try:
        main()
    except SystemExit as done:
        if done.code not in (0, None):
            raise RuntimeError(
                f"building the contract world: llm-{module} {' '.join(map(str, args))} failed"
            ) from None
    finally:
        sys.argv = saved


def build_world(root: Path) -> World:
    gpt2 = SHARED_DATA / "tokenizers" / "gpt2" / "tokenizer.json"
    if not gpt2.exists():
        pytest.skip(f"needs {gpt2} (the shared data folder beside the repo; always present in CI)")
    root.mkdir(parents=True, exist_ok=True)
    corpus = root / "corpus.jsonl"
    with open(corpus, "w", encoding="utf-8") as out:
        for i in range(300):
            out.write(
                json.dumps({"text": f"Document {i}: the quick brown fox jumps over {i % 7} lazy dogs."})
                + "\n"
            )
    chats = root / "chats.jsonl"
    with open(chats, "w", encoding="utf-8") as out:
        for i in range(20):
            messages = [
                {"role": "user", "content": f"What is {i} + 1?"},
                {"role": "assistant", "content": f"{i + 1}."},
            ]
            out.write(json.dumps({"messages": messages}) + "\n")
    data = root / "data"
    _inproc("prep", "json2bin", corpus, "-t", "byte", "-o", data / "byte", "--append-eod", "-q")
    _inproc(
        "prep",
        "json2bin",
        corpus,
        "-t",
        gpt2,
        "-o",
        data / "gpt2",
        "--append-eod",
        "-q",
        "--backend",
        "tokenizers",
    )
    prefix, prefix_gpt2 = data / "byte_text_document", data / "gpt2_text_document"
    mix = root / "mix" / "mix.json"
    _inproc("mix", prefix, "--seq-length", "16", "--num-samples", "64", "--valid-samples", "8", "-o", mix)
    hf, parquet = root / "hf", root / "hf-parquet"
    _inproc("export", "hf", prefix, "-o", hf)
    _inproc("export", "hf", prefix, "-o", parquet, "--format", "parquet")
    tiny_yaml = root / "tiny.yaml"
    tiny_yaml.write_text(TINY_TRAIN.format(prefix=prefix))
    run = root / "run"
    proc = run_cli(
        ["llm-train", tiny_yaml, "--deepspeed", REPO / "configs/deepspeed/zero1.json", "-o", run],
        root,
        timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"building the contract world: llm-train failed:\n{proc.stderr.decode()[-3000:]}")
    checkpoint = run / "checkpoints" / "step_00000002"
    assert checkpoint.is_dir(), sorted(p.name for p in (run / "checkpoints").iterdir())
    return World(
        root=root, gpt2=gpt2, corpus=corpus, chats=chats, prefix=prefix, prefix_gpt2=prefix_gpt2, mix=mix,
        hf=hf, parquet=parquet, run=run, checkpoint=checkpoint, metrics=run / "metrics.jsonl", tiny_yaml=tiny_yaml,
    )  # fmt: skip


@pytest.fixture(scope="session")
def world(tmp_path_factory) -> World:
    """Built once; every contract test may read it, none may change it (checked at the end)."""
    built = build_world(tmp_path_factory.mktemp("contract") / "world")
    before = tree_state(built.root)
    yield built
    # llm-train --resume may add nothing; llm-log tb writes elsewhere. Anything changed here is a bug.
    assert changes(before, tree_state(built.root)) == [], "a contract test changed the shared world"


# -- a filesystem to fill --------------------------------------------------------------------------
def _namespace_prefix() -> list[str] | None:
    """``unshare`` arguments that give a private mount namespace in which tmpfs can be mounted."""
    if shutil.which("unshare") is None:
        return None
    for prefix in (["unshare", "--mount", "--propagation", "private"], ["unshare", "-r", "-m"]):
        probe = subprocess.run(
            [
                *prefix,
                "sh",
                "-c",
                "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs $d && umount $d; rmdir $d",
            ],
            capture_output=True,
        )
        if probe.returncode == 0:
            return prefix
    return None


_NAMESPACE: list | None | bool = False


def small_filesystem_runner() -> list[str]:
    """The ``unshare`` prefix to run a script with a private tmpfs, or skip with the reason."""
    global _NAMESPACE
    if _NAMESPACE is False:
        _NAMESPACE = _namespace_prefix()
    if _NAMESPACE is None:
        pytest.skip("cannot mount a small tmpfs here (no unshare, or mounts not permitted in a namespace)")
    return list(_NAMESPACE)


def run_on_full_disk(argv: list[str], workdir: Path, size_kib: int, prepare: str = "", timeout: float = 240):
    """Run ``argv`` with ``workdir/fs`` a fresh ``size_kib`` KiB tmpfs that exists only for this command.

    ``prepare`` (shell, run inside the mount first) can fill it. Returns the process and the listing of
    the tmpfs after the command ended (``find`` output), taken before the mount goes away."""
    prefix = small_filesystem_runner()
    mount = workdir / "fs"
    mount.mkdir(exist_ok=True)
    listing = workdir / "listing.txt"
    command = " ".join(_quote(script(a) if a in COMMANDS else a) for a in map(str, argv))
    body = (
        f"set -u; mount -t tmpfs -o size={size_kib}k tmpfs {_quote(mount)} || exit 97; cd {_quote(workdir)}; "
        f"{prepare}\n{command}; rc=$?; (cd {_quote(mount)} && find . -mindepth 1 | sort) > {_quote(listing)}; exit $rc"
    )
    proc = subprocess.run(
        [*prefix, "bash", "-c", body],
        cwd=workdir,
        capture_output=True,
        timeout=timeout,
        env=contract_env(),
    )
    if proc.returncode == 97:
        pytest.skip(f"cannot mount a tmpfs at {mount}: {proc.stderr.decode()[-300:]}")
    return proc, listing.read_text().split() if listing.exists() else None


def _quote(text) -> str:
    import shlex

    return shlex.quote(str(text))
