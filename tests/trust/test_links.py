"""Nothing a command writes follows a link someone planted.

For each command, a first run under an audit hook (``tests/trust/hooks``) lists every path it opens for
writing or appending, deletes or renames inside its workspace (temporaries aside: their names are
random). Then, for each such path, a fresh workspace gets a symbolic link there, to a file (or folder)
outside it, and the command runs again: the link's target must be byte-identical afterwards, and where
the command would have written through the path in place (opened it for writing or appending, or deleted
it) it must refuse with exit 2 naming the path. (A path only ever replaced by an atomic rename replaces
the link itself, which is harmless: there only the target is checked.)
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from llmtools.fsutil import TMP_MARK
from tests.trust.conftest import cli, error_line, snapshot

HOOKS = Path(__file__).resolve().parent / "hooks"
VICTIM_TEXT = "someone else's file: must never change\n"


def _workspace(root: Path, run_master: Path, command: str, env) -> Path:
    ws = root / "ws"
    ws.mkdir(parents=True)
    shutil.copytree(run_master, ws / "run", symlinks=True)
    (ws / "corpus.jsonl").write_text(
        "".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(40))
    )
    (ws / "data").mkdir()
    if command == "tb":  # an earlier export to append to, and a new record to append
        first = cli("log", "tb", ws / "run/metrics.jsonl", "--logdir", ws / "tb", env=env)
        assert first.returncode == 0, first.stderr[-2000:]
        lines = (ws / "run/metrics.jsonl").read_text().splitlines()
        last = json.loads(lines[-1])
        last["step"] = int(last["step"]) + 1
        with open(ws / "run/metrics.jsonl", "a") as handle:
            handle.write(json.dumps(last) + "\n")
    return ws


def _argv(command: str, ws: Path, train_files) -> tuple:
    config, ds = train_files
    return {
        "prune": ("ckpt", "prune", ws / "run", "--keep", "1"),
        "json2bin": ("prep", "json2bin", ws / "corpus.jsonl", "-t", "byte", "-o", ws / "data/corpus"),
        "tb": ("log", "tb", ws / "run/metrics.jsonl", "--logdir", ws / "tb"),
        "train": (
            "train",
            config,
            "--deepspeed",
            ds,
            "-o",
            ws / "run",
            "--resume",
            "auto",
            "--set",
            "training.train_steps=6",
        ),  # fmt: skip
    }[command]


def _state(victim: Path):
    """Bytes and modification times: a rewrite with the same bytes is a write through the link too."""
    if victim.is_dir():
        return snapshot(victim), sorted((str(p), p.stat().st_mtime_ns) for p in victim.rglob("*"))
    return victim.read_bytes(), victim.stat().st_mtime_ns


def _reset(tmp_path: Path, run_master: Path, command: str, env) -> Path:
    """The workspace at ``tmp_path/ws``, as it was before the first run (same paths every time: the
    commands record absolute paths in their state)."""
    ws, pristine = tmp_path / "ws", tmp_path / "pristine"
    if not pristine.exists():
        _workspace(tmp_path, run_master, command, env)
        shutil.copytree(ws, pristine, symlinks=True)
    shutil.rmtree(ws)
    shutil.copytree(pristine, ws, symlinks=True)
    return ws


def _written(command, tmp_path, run_master, env, train_files) -> dict[Path, set[str]]:
    """{path: kinds of event} that a clean run of ``command`` produced inside its workspace."""
    ws = _reset(tmp_path, run_master, command, env)
    log = tmp_path / "writes.jsonl"
    traced = dict(env, LLMTOOLS_TEST_WRITES=str(log), PYTHONPATH=f"{HOOKS}{os.pathsep}{env['PYTHONPATH']}")
    proc = cli(*_argv(command, ws, train_files), env=traced, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found: dict[Path, set[str]] = {}
    for line in log.read_text().splitlines():
        event = json.loads(line)
        path = Path(event["path"])
        if ws not in path.parents or any(TMP_MARK in part for part in path.parts):
            continue
        found.setdefault(path.relative_to(ws), set()).add(event["kind"])
    return found


@pytest.mark.parametrize("command", ["prune", "json2bin", "tb", "train"])
def test_no_command_writes_through_a_planted_link(command, run_master, env, train_files, tmp_path):
    written = _written(command, tmp_path, run_master, env, train_files)
    assert written, "the audit hook saw no writes"
    for n, (relative, kinds) in enumerate(sorted(written.items())):
        if command == "train" and not kinds & {"open", "delete"}:
            continue  # each plant costs a training run; paths only renamed onto are covered by the others
        ws = _reset(tmp_path, run_master, command, env)
        path = ws / relative
        if not path.parent.is_dir():
            continue  # inside a folder the command makes itself: nobody could plant a link there first
        victim = tmp_path / f"victim{n}"
        if path.is_dir():
            shutil.copytree(path, victim, symlinks=True)
            shutil.rmtree(path)
        else:
            victim.write_text(VICTIM_TEXT)
            if path.exists():
                victim.write_bytes(path.read_bytes())  # a target like the real file: read as ours would be
                path.unlink()
        before = _state(victim)
        path.symlink_to(victim)
        proc = cli(*_argv(command, ws, train_files), env=env, timeout=600)
        after = _state(victim)
        assert after == before, f"{command} wrote through a link at {relative} ({sorted(kinds)})"
        if kinds & {"open", "delete"}:
            assert proc.returncode == 2, (relative, proc.stderr[-2000:])
            assert str(path) in error_line(proc), (relative, proc.stderr[-2000:])
