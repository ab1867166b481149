"""Nothing a command writes follows a link someone planted.

For each command that writes, appends or deletes, a first run under an audit hook (``tests/trust/hooks``)
lists every path it opens for writing or appending, deletes or renames inside its workspace (temporaries
aside: their names are random). The plants come from that list, never from a hand list:

- at each path opened in place (for writing or appending) or deleted, in turn, a symbolic link to a file
  (or folder) outside the workspace: the target must be unchanged afterwards, and the command must refuse
  with exit 2 naming the path;
- at each folder of ours the command would create inside a folder that already exists (not a folder
  named on the command line: links in the user's own paths are the user's choice), in turn, a link to an
  empty folder outside: it must stay empty;
- at every path only ever replaced by an atomic rename, all at once in one run: their targets must be
  unchanged (a rename over a link replaces the link itself, which is harmless; the command may succeed).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from llmtools.fsutil import TMP_MARK
from tests.trust.conftest import cli, error_line, snapshot

HOOKS = Path(__file__).resolve().parent / "hooks"
VICTIM_TEXT = "someone else's file: must never change\n"
CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]}
PAIR = {"prompt": "hi", "chosen": "hello", "rejected": "go away"}
TASK = {"context": "one two", "choices": [" three", " four"], "gold": 0}


@dataclass
class Case:
    argv: tuple  # with "{ws}", "{config}", "{ds}", "{prefix}" filled in
    folders: tuple = ()  # made (empty) before the run: a folder the user names, so its files are plantable
    setup: tuple = field(default_factory=tuple)  # commands run once to make the workspace (same fill-ins)
    foreign: tuple = ()  # a store a third-party library writes by path (W&B, MLflow): only its folder is ours


CASES = {
    "prune": Case(("ckpt", "prune", "{ws}/run", "--keep", "1")),
    "json2bin": Case(("prep", "json2bin", "{ws}/corpus.jsonl", "-t", "byte", "-o", "{ws}/data/corpus")),
    "tokenizer": Case(
        ("prep", "tokenizer", "train", "{ws}/corpus.jsonl", "--vocab-size", "300", "-o", "{ws}/data/tok.json")
    ),
    "sample-corpus": Case(("prep", "sample-corpus", "-o", "{ws}/raw", "--docs", "5"), folders=("raw",)),
    "hf2bin": Case(
        ("prep", "hf2bin", "{ws}/hf", "-o", "{ws}/data/h"),
        setup=(("export", "hf", "{prefix}", "-o", "{ws}/hf"),),
    ),
    "sft": Case(
        ("prep", "sft", "{ws}/chats.jsonl", "-t", "byte", "--chat-template", "chatml", "-o", "{ws}/data/s")
    ),
    "pref": Case(
        ("prep", "pref", "{ws}/pairs.jsonl", "-t", "byte", "--chat-template", "chatml", "-o", "{ws}/data/p")
    ),
    "merge": Case(("prep", "merge", "{ws}/shards/a", "{ws}/shards/b", "-o", "{ws}/data/m")),
    "mix": Case(("mix", "{prefix}", "--seq-length", "16", "--num-samples", "50", "-o", "{ws}/data/mix.json")),
    "export": Case(("export", "hf", "{prefix}", "-o", "{ws}/hf"), folders=("hf",)),
    "convert-hf": Case(("ckpt", "convert", "{ws}/run", "--to", "hf", "-o", "{ws}/hf"), folders=("hf",)),
    "convert-safetensors": Case(
        ("ckpt", "convert", "{ws}/run", "--to", "safetensors", "-o", "{ws}/data/m.safetensors")
    ),
    "convert-universal": Case(
        ("ckpt", "convert", "{ws}/run/checkpoints/step_00000004", "--to", "universal", "-o", "{ws}/data/u")
    ),
    "import-hf": Case(
        ("ckpt", "import-hf", "{ws}/hf", "-o", "{ws}/data/ck"),
        setup=(("ckpt", "convert", "{ws}/run", "--to", "hf", "-o", "{ws}/hf"),),
    ),
    "eval": Case(("ckpt", "eval", "{ws}/run", "--tasks", "{ws}/task.jsonl", "--tokenizer", "byte")),
    "tb": Case(
        ("log", "tb", "{ws}/run/metrics.jsonl", "--logdir", "{ws}/tb"),
        setup=(("log", "tb", "{ws}/run/metrics.jsonl", "--logdir", "{ws}/tb"), "grow"),
    ),
    "plot": Case(("log", "plot", "{ws}/run/metrics.jsonl", "-o", "{ws}/data/curves.png")),
    "wandb": Case(("log", "wandb", "{ws}/run", "--dir", "{ws}/t"), folders=("t",), foreign=("t/wandb",)),
    "mlflow": Case(
        ("log", "mlflow", "{ws}/run/metrics.jsonl", "--dir", "{ws}/t"), folders=("t",), foreign=("t/mlruns",)
    ),
    "train": Case(
        (
            "train",
            "{config}",
            "--deepspeed",
            "{ds}",
            "-o",
            "{ws}/run",
            "--resume",
            "auto",
            "--set",
            "training.train_steps=6",
        ),
    ),  # fmt: skip
    "train-fresh": Case(
        (
            "train",
            "{config}",
            "--deepspeed",
            "{ds}",
            "-o",
            "{ws}/fresh",
            "--set",
            "training.train_steps=2",
            "--set",
            "checkpoint.save_every=2",
        ),
        folders=("fresh",),
    ),  # fmt: skip
}
SLOW = {"train", "train-fresh"}  # each plant costs a training run: in-place paths and our folders only


def _fill(argv, ws: Path, train_files, trust_data) -> tuple:
    config, ds = train_files
    values = {"ws": ws, "config": config, "ds": ds, "prefix": trust_data["prefix"]}
    return tuple(str(a).format(**values) for a in argv)


def _lines(*records) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def _workspace(ws: Path, case: Case, run_master: Path, trust_data, train_files, env) -> None:
    ws.mkdir(parents=True)
    shutil.copytree(run_master, ws / "run", symlinks=True)
    (ws / "corpus.jsonl").write_text(_lines(*({"text": f"document {i} " * 20} for i in range(40))))
    (ws / "chats.jsonl").write_text(_lines(*[CHAT] * 20))
    (ws / "pairs.jsonl").write_text(_lines(*[PAIR] * 20))
    (ws / "task.jsonl").write_text(_lines(*[TASK] * 2))
    (ws / "data").mkdir()
    (ws / "shards").mkdir()
    for name in "ab":
        for suffix in (".bin", ".idx"):
            shutil.copy(str(trust_data["prefix"]) + suffix, ws / "shards" / f"{name}{suffix}")
    for folder in case.folders:
        (ws / folder).mkdir()
    for step in case.setup:
        if step == "grow":  # a new record for llm-log tb to append to its earlier export
            lines = (ws / "run/metrics.jsonl").read_text().splitlines()
            last = json.loads(lines[-1])
            last["step"] = int(last["step"]) + 1
            with open(ws / "run/metrics.jsonl", "a") as handle:
                handle.write(json.dumps(last) + "\n")
            continue
        proc = cli(*_fill(step, ws, train_files, trust_data), env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]


def _state(victim: Path):
    """Bytes and modification times: a rewrite with the same bytes is a write through the link too."""
    if victim.is_dir():
        return snapshot(victim), sorted((str(p), p.stat().st_mtime_ns) for p in victim.rglob("*"))
    return victim.read_bytes(), victim.stat().st_mtime_ns


class Workspace:
    """The workspace at ``tmp_path/ws``, reset to how it was before the first run (same paths every
    time: the commands record absolute paths in their state)."""

    def __init__(self, name, tmp_path, run_master, trust_data, train_files, env):
        self.case, self.tmp, self.env = CASES[name], tmp_path, env
        self.ws, self.pristine = tmp_path / "ws", tmp_path / "pristine"
        self.fill = lambda argv: _fill(argv, self.ws, train_files, trust_data)
        _workspace(self.ws, self.case, run_master, trust_data, train_files, env)
        shutil.copytree(self.ws, self.pristine, symlinks=True)

    def reset(self) -> Path:
        shutil.rmtree(self.ws)
        shutil.copytree(self.pristine, self.ws, symlinks=True)
        return self.ws

    def run(self, env=None):
        return cli(*self.fill(self.case.argv), env=env or self.env, timeout=600)

    def written(self) -> dict[Path, set[str]]:
        """{path: kinds of event} that a clean run produced inside the workspace."""
        self.reset()
        log = self.tmp / "writes.jsonl"
        traced = dict(
            self.env, LLMTOOLS_TEST_WRITES=str(log), PYTHONPATH=f"{HOOKS}{os.pathsep}{self.env['PYTHONPATH']}"
        )
        proc = self.run(traced)
        assert proc.returncode == 0, proc.stderr[-3000:]
        found: dict[Path, set[str]] = {}
        for line in log.read_text().splitlines():
            event = json.loads(line)
            path = Path(event["path"])
            if self.ws not in path.parents or any(TMP_MARK in part for part in path.parts):
                continue
            found.setdefault(path.relative_to(self.ws), set()).add(event["kind"])
        return found

    def our_folders(self, written) -> set[Path]:
        """Folders the run created on the way to what it wrote, inside a folder that existed before and
        not named on its command line (nor above a path that is)."""
        named = [Path(a) for a in self.fill(self.case.argv) if a.startswith(str(self.ws))]
        found = set()
        for relative in written:
            for folder in reversed((self.ws / relative).parents):
                if self.ws not in folder.parents or (self.pristine / folder.relative_to(self.ws)).exists():
                    continue
                if not any(folder == n or folder in n.parents for n in named):
                    found.add(folder.relative_to(self.ws))
                break  # the highest missing one: a link there is the one that matters
        return found


def _plant(path: Path, victim: Path) -> None:
    """A link at ``path`` to ``victim``: a copy of what was there (read as ours would be), or a small file."""
    if path.is_dir():
        shutil.copytree(path, victim, symlinks=True)
        shutil.rmtree(path)
    else:
        victim.write_text(VICTIM_TEXT)
        if path.exists():
            victim.write_bytes(path.read_bytes())
            path.unlink()
    path.symlink_to(victim)


@pytest.mark.parametrize("command", list(CASES))
def test_no_command_writes_through_a_planted_link(
    command, run_master, trust_data, env, train_files, tmp_path
):
    space = Workspace(command, tmp_path, run_master, trust_data, train_files, env)
    written = space.written()
    assert written, "the audit hook saw no writes"

    ours = {r: k for r, k in written.items() if not any(Path(f) in r.parents for f in space.case.foreign)}
    in_place = {r for r, kinds in ours.items() if kinds & {"open", "delete"}}
    renamed = {r for r in ours if r not in in_place}
    for n, relative in enumerate(sorted(in_place)):
        ws = space.reset()
        if not (ws / relative).parent.is_dir():
            continue  # inside a folder the command makes itself: covered by the folder plants below
        victim = tmp_path / f"victim{n}"
        _plant(ws / relative, victim)
        before = _state(victim)
        proc = space.run()
        assert _state(victim) == before, f"{command} wrote through a link at {relative} ({written[relative]})"
        assert proc.returncode == 2, (relative, proc.stderr[-2000:])
        assert str(ws / relative) in error_line(proc), (relative, proc.stderr[-2000:])
    for n, relative in enumerate(sorted(space.our_folders(written))):
        ws = space.reset()
        victim = tmp_path / f"folder{n}"
        victim.mkdir()
        (ws / relative).symlink_to(victim)
        proc = space.run()
        assert not any(victim.iterdir()), f"{command} wrote into a folder linked at {relative}"
        assert proc.returncode == 2, (relative, proc.stderr[-2000:])
        assert str(ws / relative) in error_line(proc), (relative, proc.stderr[-2000:])
    if command in SLOW or not renamed:
        return
    ws = space.reset()
    victims = {}
    for n, relative in enumerate(sorted(renamed)):
        if (ws / relative).parent.is_dir() and not (ws / relative).parent.is_symlink():
            victims[relative] = tmp_path / f"renamed{n}"
            _plant(ws / relative, victims[relative])
    before = {r: _state(v) for r, v in victims.items()}
    space.run()
    for relative, victim in victims.items():
        assert _state(victim) == before[relative], f"{command} wrote through a link at {relative}"
