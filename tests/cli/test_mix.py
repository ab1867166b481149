"""llm-mix end to end: files written, stdout, exit codes, one-line errors for every bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from llmtools.cli import mix as cli
from llmtools.data.dataset import BlendedGPTDataset
from llmtools.formats.indexed import IndexedDatasetReader, IndexedDatasetWriter
from llmtools.formats.sidecar import write_sidecar

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]
Path = __import__("pathlib").Path


def write_source(prefix, num_docs, seed, tokenizer_hash=None, dtype=np.uint16):
    rng = np.random.RandomState(seed)
    with IndexedDatasetWriter(prefix, dtype, durable=False) as writer:
        for _ in range(num_docs):
            writer.add_document(rng.randint(0, 1000, size=rng.randint(1, 120)))
    if tokenizer_hash:
        write_sidecar(
            prefix,
            {
                "format": "llmtools.indexed-sidecar",
                "version": 1,
                "tokenizer": {
                    "kind": "byte",
                    "source": "byte",
                    "name": "byte",
                    "hash": tokenizer_hash,
                    "vocab_size": 1000,
                    "eod_id": 0,
                    "bos_id": None,
                },
            },
        )
    return str(prefix)


@pytest.fixture
def data(tmp_path):
    a = write_source(tmp_path / "a", 200, 1, "sha256:same")
    b = write_source(tmp_path / "b", 80, 2, "sha256:same")
    return tmp_path, a, b


def llm_mix(monkeypatch, capsys, *args):
    """Run the real entry point in-process: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["llm-mix"])
    monkeypatch.delenv("LLMTOOLS_DEBUG", raising=False)
    code = 0
    try:
        cli.main([str(a) for a in args])
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def test_writes_plan_and_cache(monkeypatch, capsys, data):
    tmp, a, b = data
    code, out, err = llm_mix(
        monkeypatch,
        capsys,
        a,
        b,
        "--weights",
        "0.7,0.3",
        "--seq-length",
        "32",
        "--num-samples",
        "400",
        "--valid-samples",
        "20",
        "--split",
        "90,10",
        "-o",
        tmp / "out/mix.json",
    )
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == str(tmp / "out/mix.json")
    assert all(Path(p).exists() for p in lines)
    # the index cache in one folder beside the mix.json, nothing else beside it
    assert {Path(p).parent for p in lines[1:]} == {tmp / "out" / "mix.cache"}
    assert sorted(p.name for p in (tmp / "out").iterdir()) == ["mix.cache", "mix.json"]
    mix = json.loads((tmp / "out/mix.json").read_text())
    assert set(mix["splits"]) == {"train", "valid"}
    assert mix["tokenizer"]["hash"] == "sha256:same"
    assert len(lines) == 1 + 2 * (2 + 2 * 3)  # mix.json + per split: blend pair + 3 arrays per source
    ds = BlendedGPTDataset.from_mix(tmp / "out/mix.json")
    assert len(ds) == 400 and ds[0].shape == (33,)


def test_megatron_spelling_gives_the_same_plan(monkeypatch, capsys, data):
    tmp, a, b = data
    base = ["--seq-length", "32", "--num-samples", "300", "--json"]
    code1, out1, _ = llm_mix(monkeypatch, capsys, a, b, "--weights", "0.7,0.3", "-o", tmp / "m1.json", *base)
    code2, out2, _ = llm_mix(
        monkeypatch, capsys, "--data-path", "0.7", a, "0.3", b, "-o", tmp / "m2.json", *base
    )
    assert code1 == code2 == 0
    assert json.loads(out1)["cache"]["hash"] == json.loads(out2)["cache"]["hash"]


def test_per_split_data_paths(monkeypatch, capsys, data):
    tmp, a, b = data
    code, out, err = llm_mix(
        monkeypatch,
        capsys,
        "--train-data-path",
        "1",
        a,
        "1",
        b,
        "--valid-data-path",
        b,
        "--seq-length",
        "16",
        "--num-samples",
        "100",
        "--valid-samples",
        "10",
        "-o",
        tmp / "mix.json",
    )
    assert code == 0, err
    mix = json.loads((tmp / "mix.json").read_text())
    assert [c["source"] for c in mix["splits"]["valid"]["components"]] == [1]
    assert mix["split"] is None


def test_tokens_and_explain(monkeypatch, capsys, data):
    tmp, a, b = data
    code, out, err = llm_mix(
        monkeypatch, capsys, a, b, "-w", "1,3", "--seq-length", "64", "--tokens", "64K", "--explain"
    )
    assert code == 0, err
    assert "[train] 1000 samples" in out and "realized" in out and "epochs" in out
    assert "warning:" in err and "repeated" in err  # b is read many times over
    assert "warning:" not in out  # once: on stderr with the other diagnostics, not again in the table
    assert not list(tmp.glob("*.npy"))  # a dry run writes nothing


def test_materialize_round_trip(monkeypatch, capsys, data):
    tmp, a, b = data
    code, out, err = llm_mix(
        monkeypatch,
        capsys,
        a,
        b,
        "--seq-length",
        "16",
        "--num-samples",
        "150",
        "-o",
        tmp / "mix.json",
        "--materialize",
        tmp / "samples",
    )
    assert code == 0, err
    assert str(tmp / "samples.bin") in out.splitlines() and str(tmp / "samples.idx") in out.splitlines()
    reader = IndexedDatasetReader(tmp / "samples")
    ds = BlendedGPTDataset.from_mix(tmp / "mix.json")
    assert reader.num_documents == len(ds) == 150 and reader.dtype == np.uint16
    for i in range(len(ds)):
        np.testing.assert_array_equal(reader[i], ds[i])
    side = json.loads((tmp / "samples.json").read_text())
    assert side["tokenizer"]["hash"] == "sha256:same" and side["counts"]["tokens"] == 150 * 17


def test_existing_output_needs_force(monkeypatch, capsys, data):
    tmp, a, b = data
    args = [a, "--seq-length", "16", "--num-samples", "10", "-o", tmp / "mix.json"]
    assert llm_mix(monkeypatch, capsys, *args)[0] == 0
    code, out, err = llm_mix(monkeypatch, capsys, *args)
    assert code == 2 and "already exists" in err and "--force" in err
    assert llm_mix(monkeypatch, capsys, *args, "--force")[0] == 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["A", "B", "--weights", "0.5"], "1 weight(s) for 2 source(s)"),
        (["A", "B", "--weights", "0.5,-0.5"], "negative"),
        (["A", "B", "--weights", "nan,1"], "finite"),
        (["A", "B", "--weights", "0,0"], "all weights are zero"),
        (["A", "B", "--weights", "x,1"], "not a number"),
        (["A", "--seq-length", "0"], "--seq-length"),
        (["A", "--seq-length", "abc"], "--seq-length"),
        (["A", "--num-samples", "-3"], "--num-samples"),
        (["A", "--num-samples", "2.5"], "--num-samples"),
        (["A", "--num-samples", "5", "--tokens", "100"], "exactly one of"),
        (["missing_prefix"], "no such dataset"),
        (["CORRUPT"], "corrupt.idx: size"),
        (["EMPTY"], "empty"),
        (["A", "OTHER_TOKENIZER"], "different tokenizers"),
        (["--data-path", "0.5", "A", "B", "C"], "not a number"),
        (["A", "--split", "90,-10"], "--split"),
        (["A", "--seed", "-1"], "--seed"),
    ],
)
def test_bad_input_one_line_exit_2(monkeypatch, capsys, data, args, message):
    tmp, a, b = data
    corrupt = write_source(tmp / "corrupt", 5, 3)
    with open(f"{corrupt}.idx", "r+b") as handle:
        handle.truncate(50)
    with IndexedDatasetWriter(tmp / "empty", np.uint16, durable=False) as writer:
        writer.add_documents(np.array([], np.uint16), np.array([0]))
    other = write_source(tmp / "other", 30, 4, "sha256:different")
    names = {
        "A": a,
        "B": b,
        "C": a,
        "CORRUPT": corrupt,
        "EMPTY": str(tmp / "empty"),
        "OTHER_TOKENIZER": other,
    }
    argv = [names.get(x, x) for x in args]
    if "--seq-length" not in argv:
        argv += ["--seq-length", "16"]
    if "--num-samples" not in argv and "--tokens" not in argv:
        argv += ["--num-samples", "10"]
    code, out, err = llm_mix(monkeypatch, capsys, *argv, "-o", tmp / "mix.json")
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("llm-mix: error: ") and message in err, err
    assert "Traceback" not in err and out == ""
    assert not (tmp / "mix.json").exists()


def test_mixed_tokenizers_allowed_and_bare_source_noted(monkeypatch, capsys, data):
    tmp, a, _ = data
    other = write_source(tmp / "other", 30, 4, "sha256:different")
    bare = write_source(tmp / "bare", 30, 5)
    code, out, err = llm_mix(
        monkeypatch,
        capsys,
        a,
        other,
        bare,
        "--allow-mixed-tokenizers",
        "--seq-length",
        "16",
        "--num-samples",
        "20",
        "-o",
        tmp / "mix.json",
    )
    assert code == 0, err
    assert "no sidecar" in err and "mixed tokenizers allowed" in err


def test_real_command_and_fast_help(data, cli_env):
    tmp, a, b = data
    started = time.perf_counter()
    result = subprocess.run(
        [str(REPO / "bin" / "llm-mix"), "--help"], capture_output=True, text=True, env=cli_env
    )
    assert result.returncode == 0 and "Examples" in result.stdout and "--data-path" in result.stdout
    assert time.perf_counter() - started < 5  # generous: the machine is shared; the goal is < 0.3 s
    result = subprocess.run(
        [
            str(REPO / "bin" / "llm-mix"),
            "--data-path",
            "0.6",
            a,
            "0.4",
            b,
            "--seq-length",
            "8",
            "--num-samples",
            "50",
            "-o",
            str(tmp / "mix.json"),
        ],
        capture_output=True,
        text=True,
        env=cli_env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == str(tmp / "mix.json")
    result = subprocess.run(
        [str(REPO / "bin" / "llm-mix"), a, "--seq-length", "8", "-o", str(tmp / "x.json")],
        capture_output=True,
        text=True,
        env=cli_env,
    )
    assert (
        result.returncode == 2
        and result.stderr.strip() == "llm-mix: error: give exactly one of --num-samples N or --tokens T"
    )


@pytest.mark.parametrize(
    "written, given",
    [
        (["web_text_document"], "web"),  # the json2bin -o prefix instead of its dataset
        (["web_text_document", "web_code_document"], "web"),  # one dataset per --json-keys key
        ([f"web_k{i}_document" for i in range(7)], "web"),  # many keys: the first few, and a count
        (["web_en_text_document"], "web_en"),  # an underscore in the prefix itself
        (["sub/web_text_document"], "sub/web"),  # a prefix in a folder keeps its folder
        (["web_text_document"], "other"),  # nothing written from this prefix: no suggestion
    ],
)
def test_a_json2bin_output_prefix_gets_its_datasets_suggested(tmp_path, cli_env, written, given):
    for k, name in enumerate(written):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        write_source(tmp_path / name, 20, k)
    out = subprocess.run(
        [str(Path(sys.executable).parent / "llm-mix"), given,
         "--num-samples", "10", "--seq-length", "16", "-o", "mix.json"],
        cwd=tmp_path, env=cli_env, capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and out.stdout == "", out.stderr
    assert f"{given}: no such dataset" in out.stderr
    mine = sorted(n for n in written if n.startswith(given + "_"))
    if not mine:
        assert "did you mean" not in out.stderr
        return
    shown = mine[:4]
    assert f"did you mean {' or '.join(shown)}" in out.stderr, out.stderr
    assert (f"and {len(mine) - 4} more?" in out.stderr) == (len(mine) > 4)
    assert not (tmp_path / "mix.json").exists()
