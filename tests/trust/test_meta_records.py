"""Every record of a checkpoint's meta.json is untrusted, whichever command reads it: a mangled record is one
line on stderr and exit 2 (or, where the value is still one a writer could have written, the command
works), never an internal error. The eval tokenizer named in meta.json is found relative to the run, not
the current folder, and must have the recorded hash.

The generator mangles one record (or a field inside one) of a real checkpoint's meta.json at a time and
runs the readers of ``llm-ckpt`` through their real ``main`` (in this process: hundreds of cases); a
representative table runs the installed console scripts as processes, ``llm-train --resume`` included.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli_inproc

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

BIN = Path(sys.executable).parent

VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63),
    st.sampled_from([1e308, -1.5, 0.5, 10**5000 // 10**4990]),
    st.sampled_from(["", "x", "fp64", "../../x", "/etc/passwd", "byte", "step_00000004"]),
    st.lists(st.one_of(st.integers(-3, 10), st.text(max_size=2)), max_size=3),
    st.dictionaries(st.sampled_from(["a", "degree", "source", "hash", "x"]), st.integers(-1, 3), max_size=2),
)

# Records with an inside that readers walk: a field inside them is mangled too.
TP_RECORD = {"degree": 1, "split_dims": {"model.embed_tokens.weight": 0}, "shapes": {"model.embed_tokens.weight": [320, 48]}}  # fmt: skip


def _copy_checkpoint(master: Path, run: Path) -> Path:
    step = run / "checkpoints" / master.name
    shutil.copytree(master, step)
    (run / "checkpoints" / "latest").write_text(master.name)
    return step


def _mangled(meta: dict, data) -> dict:
    meta = json.loads(json.dumps(meta))
    meta.setdefault("tensor_parallel", json.loads(json.dumps(TP_RECORD)))
    key = data.draw(st.sampled_from(sorted(meta)), label="record")
    inner = meta[key]
    if isinstance(inner, dict) and inner and key != "files" and data.draw(st.booleans(), label="inside"):
        field = data.draw(st.sampled_from(sorted(inner)), label="field")
        if isinstance(inner[field], dict) and inner[field] and data.draw(st.booleans(), label="deeper"):
            inner[field][data.draw(st.sampled_from(sorted(inner[field])))] = data.draw(VALUES)
        else:
            inner[field] = data.draw(VALUES, label="value")
    elif data.draw(st.booleans(), label="drop") and key != "tensor_parallel":
        del meta[key]
    else:
        meta[key] = data.draw(VALUES, label="value")
    return meta


def _one_line(proc, what: str) -> None:
    """Exit 0, or exit 2 with one error line naming meta.json; never an internal error or a traceback."""
    assert proc.returncode in (0, 2), (what, proc.returncode, proc.stderr[-2000:])
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr, (what, proc.stderr[-2000:])
    if proc.returncode == 2:
        errors = [line for line in proc.stderr.splitlines() if "error:" in line]
        assert len(errors) == 1, (what, proc.stderr[-2000:])


@pytest.fixture(scope="module")
def master(run_master):
    return run_master / "checkpoints" / "step_00000004"


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_each_mangled_record_is_one_line_in_every_reader(master, tmp_path_factory, capsys, monkeypatch, data):
    meta = _mangled(json.loads((master / "meta.json").read_text()), data)
    run = tmp_path_factory.mktemp("mangled") / "run"
    step = _copy_checkpoint(master, run)
    (step / "meta.json").write_text(json.dumps(meta))
    for args in (["verify", step], ["list", run], ["inspect", step], ["inspect", step, "--data"]):
        _one_line(run_cli_inproc(capsys, monkeypatch, "ckpt", *args), args)


# One of each kind of record, each as a real process through every subcommand that reads meta.json.
TABLE = {
    "tp-shapes": ("tensor_parallel", {"degree": 1, "split_dims": {"a": 0}, "shapes": {"a": "x"}}),
    "tp-degree": ("tensor_parallel", {"degree": "2"}),
    "tokenizer": ("tokenizer", "tok.json"),
    "tokenizer-source": ("tokenizer", {"source": 7, "hash": None}),
    "time": ("time", 1e308),
    "precision": ("precision", "fp64"),
    "data": ("data", {"ledger": [1]}),
    "model": ("model", "tiny"),
}


@pytest.mark.parametrize("case", sorted(TABLE))
def test_mangled_records_through_the_console_scripts(master, tmp_path, case):
    key, value = TABLE[case]
    run = tmp_path / "run"
    step = _copy_checkpoint(master, run)
    meta = json.loads((step / "meta.json").read_text())
    meta[key] = value
    (step / "meta.json").write_text(json.dumps(meta))
    commands = [
        ["llm-ckpt", "verify", step],
        ["llm-ckpt", "list", run],
        ["llm-ckpt", "inspect", step],
        ["llm-ckpt", "convert", step, "--to", "hf", "-o", tmp_path / "hf"],
        ["llm-ckpt", "eval", step, "--tasks", tmp_path / "task.jsonl"],
    ]
    (tmp_path / "task.jsonl").write_text(json.dumps({"context": "a", "choices": [" b", " c"], "gold": 0}) + "\n")
    for command in commands:
        proc = subprocess.run([BIN / command[0], *map(str, command[1:])], capture_output=True, text=True,
                              cwd=tmp_path, timeout=300)  # fmt: skip
        _one_line(proc, command[:2])
        if command[1] == "verify":
            # A mangled record is a mangled meta.json: verify refuses it, naming the record.
            assert proc.returncode == 2 and f"[{key}]" in proc.stderr, proc.stderr


def test_a_mangled_record_refuses_a_resume(master, tmp_path, train_files):
    config, ds = train_files
    run = tmp_path / "run"
    step = _copy_checkpoint(master, run)
    meta = json.loads((step / "meta.json").read_text())
    meta["tensor_parallel"] = {"degree": 1, "split_dims": {"a": 0}, "shapes": {"a": [1, "x"]}}
    (step / "meta.json").write_text(json.dumps(meta))
    proc = subprocess.run(
        [BIN / "llm-train", config, "--deepspeed", ds, "-o", run, "--resume", str(step)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "internal error" not in proc.stderr and "tensor_parallel" in proc.stderr, proc.stderr[-2000:]


# ------------------------------------------------------------------------------------ eval's tokenizer
def _tokenizer(path: Path, words: list[str]) -> str:
    """A small BPE tokenizer.json (vocabulary inside the tiny model's 320) at ``path``; its hash."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=280, special_tokens=["<unk>", "<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tok.train_from_iterator(words * 20, trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    from llmtools.tokenize.loader import load_tokenizer

    return load_tokenizer(str(path), backend="tokenizers").hash


def _eval_setup(master: Path, tmp_path: Path, source: str) -> tuple[Path, Path, str]:
    run = tmp_path / "run"
    step = _copy_checkpoint(master, run)
    good = _tokenizer(run / "tok" / "tokenizer.json", ["alpha beta", "gamma delta"])
    meta = json.loads((step / "meta.json").read_text())
    meta["tokenizer"] = {"kind": "hf-json", "source": source, "name": "tok", "hash": good, "vocab_size": 280}
    (step / "meta.json").write_text(json.dumps(meta))
    elsewhere = tmp_path / "elsewhere"
    _tokenizer(elsewhere / "tok" / "tokenizer.json", ["one two three", "four five"])  # another one, same name
    task = tmp_path / "task.jsonl"
    task.write_text(json.dumps({"context": "alpha", "choices": [" beta", " gamma"], "gold": 0}) + "\n")
    return step, elsewhere, good


def _eval(step: Path, task: Path, cwd: Path):
    return subprocess.run(
        [BIN / "llm-ckpt", "eval", step, "--tasks", task, "--limit", "1", "--batch", "1"],
        capture_output=True, text=True, cwd=cwd, timeout=600,
    )  # fmt: skip


def test_eval_finds_the_recorded_tokenizer_relative_to_the_run_not_the_current_folder(master, tmp_path):
    step, elsewhere, _ = _eval_setup(master, tmp_path, "tok/tokenizer.json")
    cwd = tmp_path / "empty"  # no tok/ here: only the run's own can be found
    cwd.mkdir()
    proc = _eval(step, tmp_path / "task.jsonl", cwd)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["results"]


def test_eval_refuses_a_recorded_tokenizer_whose_hash_differs(master, tmp_path):
    step, elsewhere, _ = _eval_setup(master, tmp_path, "tok/tokenizer.json")
    shutil.copyfile(elsewhere / "tok" / "tokenizer.json", tmp_path / "run" / "tok" / "tokenizer.json")
    proc = _eval(step, tmp_path / "task.jsonl", tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "meta.json[tokenizer]" in errors[0] and "not the one" in errors[0], proc.stderr
    assert not (tmp_path / "run" / "eval").exists()
