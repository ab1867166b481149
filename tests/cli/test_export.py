"""`llm-export hf` end to end: the real command in a subprocess; exit codes, stdout, stderr, files."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from llmtools.formats.indexed import IndexedDatasetReader, IndexedDatasetWriter
from tests.conftest import run_cli_inproc

datasets = pytest.importorskip("datasets")


def export_inproc(capsys, monkeypatch, *args):
    """`llm-export` in this process (argument parsing and error mapping included): fast."""
    return run_cli_inproc(capsys, monkeypatch, "export", *args)


def export(python, cli_env, *args, cwd=None):
    return subprocess.run([python, "-m", "llmtools.cli.export", *map(str, args)], capture_output=True, text=True,
                          env=cli_env, cwd=cwd, timeout=300)  # fmt: skip


@pytest.fixture
def prefix(tmp_path):
    rng = np.random.default_rng(3)
    path = tmp_path / "src_text_document"
    with IndexedDatasetWriter(path, np.uint16) as writer:
        for _ in range(150):
            writer.add_document(rng.integers(0, 257, int(rng.integers(0, 120))))
    return path


def one_error_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def test_help_has_examples(python, cli_env):
    proc = export(python, cli_env, "hf", "--help")
    assert proc.returncode == 0
    assert "Examples:" in proc.stdout and "llm-export hf mix.json" in proc.stdout
    assert export(python, cli_env, "--help").returncode == 0


def test_export_prints_the_folder_and_loads(python, cli_env, prefix, tmp_path):
    out = tmp_path / "hf"
    proc = export(python, cli_env, "hf", prefix, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out)
    ds = datasets.load_from_disk(str(out))
    reader = IndexedDatasetReader(prefix)
    assert ds["input_ids"] == [reader.document(j).tolist() for j in range(reader.num_documents)]
    assert (out / "README.md").exists() and (out / "llmtools.json").exists()


def test_parquet_packed_json_summary(python, cli_env, prefix, tmp_path):
    out = tmp_path / "pq"
    proc = export(python, cli_env, "hf", f"{prefix}.idx", "-o", out, "--format", "parquet", "--packed",
                  "--seq-length", "64", "--shard-size", "4KB", "--json", "-q")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # -q: no progress bar
    summary = json.loads(proc.stdout)
    reader = IndexedDatasetReader(prefix)
    assert summary["rows"] == reader.num_tokens // 64 and summary["mode"] == "packed"
    shards = [f for f in summary["files"] if f.endswith(".parquet")]
    assert len(shards) > 1
    files = [str(out / f) for f in shards]
    ds = datasets.load_dataset("parquet", data_files=files, cache_dir=str(tmp_path / "cache"))["train"]
    np.testing.assert_array_equal(
        np.array(ds["input_ids"]).reshape(-1), reader.tokens()[: summary["rows"] * 64]
    )


def test_text_column_with_byte_tokenizer(capsys, monkeypatch, tmp_path):
    from llmtools.formats.sidecar import write_sidecar
    from llmtools.tokenize import load_tokenizer

    tok = load_tokenizer("byte")
    texts = ["héllo", "", "wörld\n"]
    prefix = tmp_path / "t"
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for ids in tok.encode_batch(texts):
            writer.add_document(ids)
    write_sidecar(prefix, {"tokenizer": tok.identity(), "append_eod": False})
    proc = export_inproc(
        capsys, monkeypatch, "hf", prefix, "-o", tmp_path / "hf", "--text", "--tokenizer", "byte", "-q"
    )
    assert proc.returncode == 0, proc.stderr
    assert datasets.load_from_disk(str(tmp_path / "hf"))["text"] == texts


def test_mix_json(capsys, monkeypatch, tmp_path):
    from llmtools.data.dataset import BlendedGPTDataset
    from tests.export.test_hf_export import make_mix

    mix = make_mix(tmp_path)
    proc = export_inproc(
        capsys, monkeypatch, "hf", mix, "-o", tmp_path / "hf", "--packed", "--split", "valid", "-q"
    )
    assert proc.returncode == 0, proc.stderr
    ds = datasets.load_from_disk(str(tmp_path / "hf"))
    training = BlendedGPTDataset.from_mix(mix, split="valid")
    np.testing.assert_array_equal(np.array(ds["input_ids"]), training.batch(np.arange(len(training))))


@pytest.mark.parametrize(
    "case, needle",
    [
        ("missing", "no such file"),
        ("corrupt", "src_text_document.idx"),
        ("exists", "already exists and is a non-empty folder llmtools did not write"),
        ("text-without-tokenizer", "--tokenizer"),
        ("bad-format", "--format"),
        ("bad-size", "--shard-size"),
        ("packed-without-length", "--seq-length"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_leaves_nothing(
    capsys, monkeypatch, prefix, tmp_path, case, needle
):
    out = tmp_path / "out"
    args = ["hf", prefix, "-o", out]
    if case == "missing":
        args[1] = tmp_path / "nope"
    elif case == "corrupt":
        idx = prefix.parent / "src_text_document.idx"
        idx.write_bytes(idx.read_bytes()[:-3])
    elif case == "exists":
        out.mkdir()
        (out / "mine").write_text("keep")
    elif case == "text-without-tokenizer":
        args.append("--text")
    elif case == "bad-format":
        args += ["--format", "csv"]
    elif case == "bad-size":
        args += ["--shard-size", "lots"]
    elif case == "packed-without-length":
        args.append("--packed")
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = export_inproc(capsys, monkeypatch, *args)
    assert proc.returncode == 2, proc.stderr
    line = one_error_line(proc)
    assert line.startswith("llm-export: error: ") and needle in line
    assert proc.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing left behind
    if case == "exists":
        assert (out / "mine").read_text() == "keep"


def test_force_replaces_an_earlier_export_only(capsys, monkeypatch, prefix, tmp_path):
    out = tmp_path / "out"
    assert (
        export_inproc(capsys, monkeypatch, "hf", prefix, "-o", out, "--format", "parquet", "-q").returncode
        == 0
    )
    proc = export_inproc(capsys, monkeypatch, "hf", prefix, "-o", out, "--force", "-q")
    assert proc.returncode == 0, proc.stderr
    assert not (out / "data").exists() and len(datasets.load_from_disk(str(out))) == 150


def test_real_process_exit_code_on_bad_input(python, cli_env, tmp_path):
    proc = export(python, cli_env, "hf", tmp_path / "missing_document", "-o", tmp_path / "out")
    assert proc.returncode == 2
    assert one_error_line(proc).startswith("llm-export: error: ") and "no such file" in proc.stderr
    assert not (tmp_path / "out").exists()
