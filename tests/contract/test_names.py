"""A name means one thing: every option that takes a shipped file's name or a path follows one rule, through
the real commands.

A value with a ``/`` or the kind's extension (.yaml/.yml for train configs, .json for DeepSpeed configs,
.yaml/.yml/.json for model presets) is a path; anything else is the name of a shipped file. A file of that
name in the working folder never takes its place, and is announced in one ``note:`` line on stderr.

The matrix: every name-taking option (the train config of ``llm-train``, ``--print-config``,
``--deepspeed``, ``model.preset``, ``llm-ckpt convert --model``) x every case (the bare name alone; the bare
name with a planted file of that name here; ``./NAME`` with that file; an unknown bare name that is a file
here; the name with its extension where no such file is). The planted file holds something no shipped file
holds, so which one was read shows in the result.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import SHARED_DATA
from tests.contract.conftest import REPO, _inproc, error_line, run_cli

PLANTED = "- planted-junk\n"  # a YAML list, not JSON: no kind of file accepts it


@dataclass(frozen=True)
class Option:
    prog: str
    kind: str  # the shipped kind (llmtools.resources)
    name: str  # a shipped name of that kind
    extension: str
    argv: Callable[[Path, str], list]  # (the folder of inputs, the value given) -> the command line


def _train(value, base: Path):
    return ["llm-train", value, "--deepspeed", "zero2", "--set", f"data.mix={base / 'mix.json'}", "--dry-run"]


OPTIONS = {
    "llm-train CONFIG": Option("llm-train", "train", "tiny", ".yaml", lambda b, v: _train(v, b)),
    "llm-train --print-config": Option("llm-train", "train", "tiny", ".yaml", lambda b, v: ["llm-train", "--print-config", v]),
    "llm-train --deepspeed": Option(
        "llm-train", "deepspeed", "zero2", ".json",
        lambda b, v: ["llm-train", b / "train.yaml", "--deepspeed", v, "--dry-run"],
    ),
    "llm-train model.preset": Option(
        "llm-train", "models", "tiny", ".yaml",
        lambda b, v: ["llm-train", b / "train.yaml", "--deepspeed", "zero2", "--set", f"model.preset={v}", "--dry-run"],
    ),
    "llm-ckpt convert --model": Option(
        "llm-ckpt", "models", "tiny", ".yaml",
        lambda b, v: ["llm-ckpt", "convert", b / "run", "--to", "hf", "-o", "hf", "--model", v],
    ),
}  # fmt: skip

TRAIN = """\
model: {{preset: tiny}}
data: {{prefixes: [{prefix}], seq_length: 16}}
training: {{micro_batch_size: 2, global_batch_size: 2, train_steps: 1, precision: fp32}}
schedule: {{kind: constant, warmup_steps: 0}}
eval: {{every: 0}}
logging: {{log_every: 1}}
checkpoint: {{save_every: 1}}
"""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """A byte-tokenized dataset, a mix, a train config of the shipped tiny preset and a one-step run of it
    (so that ``--model tiny`` fits its checkpoint)."""
    base = tmp_path_factory.mktemp("names")
    (base / "corpus.jsonl").write_text(
        "".join(
            f'{{"text": "document {i}: the quick brown fox jumps over the lazy dog"}}\n' for i in range(200)
        )
    )
    _inproc(
        "prep", "json2bin", base / "corpus.jsonl", "-t", "byte", "-o", base / "data", "--append-eod", "-q"
    )
    prefix = base / "data_text_document"
    _inproc("mix", prefix, "--seq-length", "128", "--num-samples", "3200", "-o", base / "mix.json")
    (base / "train.yaml").write_text(TRAIN.format(prefix=prefix))
    proc = run_cli(["llm-train", base / "train.yaml", "--deepspeed", REPO / "configs/deepspeed/zero1.json",
                    "-o", base / "run"], base, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    return base


def _run(option: Option, inputs: Path, folder: Path, value: str):
    proc = run_cli(option.argv(inputs, value), folder, timeout=600)
    return proc, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace")


def _notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("note:")]


def _read_planted(out: str, err: str, value: str) -> bool:
    """The planted file was what the command read: printed, or named in the refusal of its content."""
    return "planted-junk" in out or f"{value}:" in err or f"{value}[" in err


@pytest.fixture
def folder(tmp_path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    return work


@pytest.mark.parametrize("option_id", OPTIONS)
def test_a_bare_name_is_the_shipped_file_even_beside_a_file_of_that_name(option_id, inputs, folder):
    option = OPTIONS[option_id]
    alone, out, err = _run(option, inputs, folder, option.name)
    assert alone.returncode == 0, err[-2000:]
    assert not _notes(err), err
    shutil.rmtree(folder)
    folder.mkdir()
    (folder / option.name).write_text(PLANTED)
    beside, out2, err2 = _run(option, inputs, folder, option.name)
    assert beside.returncode == 0, err2[-2000:]
    assert not _read_planted(out2, err2, f"./{option.name}"), err2
    if option_id == "llm-train --print-config":
        assert out2 == out  # the shipped file, byte for byte
    from llmtools.resources import WHAT

    # Once per kind, however many times the name is looked up (the shipped tiny train config names the tiny
    # preset too: that is a second kind, and a second line).
    notes = [line for line in _notes(err2) if f"shipped {WHAT[option.kind]}," in line]
    assert len(notes) == 1, err2
    assert option.name in notes[0] and f"./{option.name}" in notes[0], notes


@pytest.mark.parametrize("option_id", OPTIONS)
def test_a_path_is_the_file_never_the_shipped_one(option_id, inputs, folder):
    option = OPTIONS[option_id]
    (folder / option.name).write_text(PLANTED)
    value = f"./{option.name}"
    proc, out, err = _run(option, inputs, folder, value)
    assert _read_planted(out, err, value), (out, err)
    assert not _notes(err), err
    if proc.returncode != 0:
        assert proc.returncode == 2
        assert value in error_line(proc, option.prog)


@pytest.mark.parametrize("option_id", OPTIONS)
def test_an_unknown_bare_name_is_refused_with_the_shipped_names_even_when_a_file_has_it(
    option_id, inputs, folder
):
    from llmtools.resources import names

    option = OPTIONS[option_id]
    shutil.copy(REPO / "configs" / option.kind / f"{option.name}{option.extension}", folder / "mine")
    proc, _, err = _run(option, inputs, folder, "mine")
    assert proc.returncode == 2, err
    line = error_line(proc, option.prog)
    assert "'mine' is neither a path nor a shipped" in line, line
    assert all(name in line for name in names(option.kind)), line
    assert "write ./mine" in line, line


@pytest.mark.parametrize("option_id", OPTIONS)
def test_a_missing_path_with_the_extension_points_at_the_shipped_name(option_id, inputs, folder):
    option = OPTIONS[option_id]
    value = f"{option.name}{option.extension}"
    proc, _, err = _run(option, inputs, folder, value)
    assert proc.returncode == 2, err
    line = error_line(proc, option.prog)
    assert f"{value}: no such" in line and f"the shipped one is named {option.name}" in line, line


# Built-in names of options that otherwise take a path (a tokenizer file or folder, a template file): the
# name is the built-in, and a file of that name here is announced, never read.
BUILTINS = {
    "llm-prep json2bin -t byte": (
        "byte",
        lambda b, v: ["llm-prep", "json2bin", b / "corpus.jsonl", "-t", v, "-o", "out/data", "-q"],
    ),
    "llm-prep sft --chat-template chatml": (
        "chatml",
        lambda b, v: ["llm-prep", "sft", b / "chats.jsonl", "-t", SHARED_DATA / "tokenizers" / "gpt2" / "tokenizer.json",
                      "--chat-template", v, "-o", "out/sft", "-q"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("option_id", BUILTINS)
def test_a_built_in_name_beside_a_file_of_that_name_is_the_built_in_and_said(option_id, inputs, tmp_path):
    if not (SHARED_DATA / "tokenizers" / "gpt2" / "tokenizer.json").exists():
        pytest.skip("needs the shared data folder (GPT-2's tokenizer)")
    name, argv = BUILTINS[option_id]
    chat = '{"messages": [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4."}]}\n'
    (inputs / "chats.jsonl").write_text(chat * 8)
    results = []
    for planted in (False, True):
        folder = tmp_path / f"planted-{planted}"
        folder.mkdir()
        if planted:
            (folder / name).write_text(PLANTED)
        proc = run_cli(argv(inputs, name), folder, timeout=600)
        err = proc.stderr.decode("utf-8", "replace")
        assert proc.returncode == 0, err[-2000:]
        outputs = {p.name: p.read_bytes() for p in sorted((folder / "out").iterdir()) if p.suffix != ".json"}
        results.append((outputs, _notes(err)))
    (alone, alone_notes), (beside, beside_notes) = results
    assert beside == alone  # the same bytes: the planted file was not read
    assert alone_notes == []
    assert len(beside_notes) == 1 and f"{name}: read the built-in" in beside_notes[0], beside_notes
    assert f"./{name}" in beside_notes[0]
