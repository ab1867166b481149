"""`llm-prep hf2bin` end to end: JSONL -> json2bin -> llm-export hf -> hf2bin, with the real commands."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import run_cli_inproc

datasets = pytest.importorskip("datasets")
pq = pytest.importorskip("pyarrow.parquet")
pa = pytest.importorskip("pyarrow")


@pytest.fixture
def env(cli_env, tmp_path):
    cli_env = dict(cli_env)
    cli_env["HF_DATASETS_CACHE"] = str(tmp_path / "hfcache")
    cli_env["HF_DATASETS_OFFLINE"] = "1"
    return cli_env


def cli(python, env, module, *args):
    return subprocess.run([python, "-m", f"llmtools.cli.{module}", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip


def prep_inproc(capsys, monkeypatch, *args):
    """`llm-prep` in this process (argument parsing and error mapping included): fast."""
    return run_cli_inproc(capsys, monkeypatch, "prep", *args)


def test_round_trip_with_the_commands(python, env, tmp_path):
    texts = ["one", "", "two\nlines", "ünï ✓"] * 20
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8"
    )
    proc = cli(python, env, "prep", "json2bin", corpus, "-t", "byte", "-o", tmp_path / "a", "-w", "1", "-q")
    assert proc.returncode == 0, proc.stderr
    for fmt in ("parquet",):  # the arrow layout round trip is in tests/prep/test_hf_import.py
        hf = tmp_path / f"hf-{fmt}"
        proc = cli(python, env, "export", "hf", tmp_path / "a_text_document", "-o", hf, "--format", fmt,
                   "--text", "--tokenizer", "byte", "-q")  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        proc = cli(
            python, env, "prep", "hf2bin", hf, "-o", tmp_path / f"b-{fmt}", "--column", "input_ids", "-q"
        )
        assert proc.returncode == 0, proc.stderr
        paths = proc.stdout.split()
        assert [p.rsplit(".", 1)[1] for p in paths] == ["bin", "idx", "json"]
        for suffix in (".bin", ".idx"):
            assert (tmp_path / f"a_text_document{suffix}").read_bytes() == (
                tmp_path / f"b-{fmt}_input_ids_document{suffix}"
            ).read_bytes()
        # the text column, re-tokenized, gives the same bytes too
        proc = cli(python, env, "prep", "hf2bin", hf, "-o", tmp_path / f"c-{fmt}", "--json-keys", "text", "-t", "byte",
                   "-w", "1", "--json", "-q")  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        summary = json.loads(proc.stdout)
        assert summary["documents"] == len(texts) and summary["tokenized_columns"] == ["text"]
        assert (tmp_path / "a_text_document.bin").read_bytes() == (
            tmp_path / f"c-{fmt}_text_document.bin"
        ).read_bytes()


@pytest.mark.parametrize(
    "case, needle",
    [
        ("missing-column", "no column 'body'"),
        ("missing-split", "no split 'test'"),
        ("missing-source", "no such file"),
        ("no-tokenizer", "--tokenizer"),
        ("exists", "already exists"),
    ],
)
def test_bad_input_exits_2(capsys, monkeypatch, env, tmp_path, case, needle):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", env["HF_DATASETS_CACHE"])
    ds = datasets.Dataset.from_dict({"text": ["a", "b"]})
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "saved"))
    args = ["hf2bin", tmp_path / "saved", "-o", tmp_path / "o", "-t", "byte", "-w", "1"]
    if case == "missing-column":
        args += ["--column", "body"]
    elif case == "missing-split":
        args += ["--split", "test"]
    elif case == "missing-source":
        args[1] = tmp_path / "nope"
    elif case == "no-tokenizer":
        args = args[:4]
    elif case == "exists":
        (tmp_path / "o_text_document.bin").write_bytes(b"")
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = prep_inproc(capsys, monkeypatch, *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llm-prep: error: ") and needle in lines[0], proc.stderr
    after = sorted(p.name for p in tmp_path.iterdir() if p.name != "hfcache")
    assert after == [p for p in before if p != "hfcache"]


def test_help(python, env):
    proc = cli(python, env, "prep", "hf2bin", "--help")
    assert proc.returncode == 0 and "Examples:" in proc.stdout and "save_to_disk" in proc.stdout
