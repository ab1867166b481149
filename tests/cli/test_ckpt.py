"""`llm-ckpt` end to end: list, verify, inspect, prune, convert, import-hf; exit codes, stdout, stderr, files.

Most cases run the real entry point in this process (argument parsing and error mapping included); a
few run it as a subprocess to check what a shell sees (help speed, one-line errors, no traceback).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.ckpt import worker
from tests.ckpt.conftest import ds_world, saved_run, saved_run_master  # noqa: F401 - fixtures
from tests.conftest import run_cli_inproc

pytest.importorskip("deepspeed")


def ckpt(capsys, monkeypatch, *args):
    """`llm-ckpt` in this process (argument parsing and error mapping included): fast."""
    return run_cli_inproc(capsys, monkeypatch, "ckpt", *args)


def ckpt_subprocess(cli_env, *args):
    return subprocess.run(
        [sys.executable, "-m", "llmtools.cli.ckpt", *map(str, args)],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=300,
    )


def one_error_line(proc) -> str:
    lines = [
        line for line in proc.stderr.strip().splitlines() if not line.startswith("[20")
    ]  # DeepSpeed's logs
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory, ds_world):  # noqa: F811
    from tests.ckpt.test_convert import _save_llama

    run = tmp_path_factory.mktemp("llama") / "run"
    _save_llama(run, 2)
    return run


def test_help_is_fast_and_has_examples(cli_env):
    started = time.perf_counter()
    proc = ckpt_subprocess(cli_env, "--help")
    assert proc.returncode == 0 and "convert" in proc.stdout
    assert time.perf_counter() - started < 5  # generous on a loaded machine; no torch import (checked below)
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, llmtools.cli.ckpt; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        env=cli_env,
    )
    assert probe.stdout.strip() == "False"
    for command in ("list", "verify", "inspect", "prune", "convert", "import-hf", "eval"):
        help_text = ckpt_subprocess(cli_env, command, "--help").stdout
        assert "Examples:" in help_text and f"llm-ckpt {command}" in help_text, command


def test_list_table_and_json(capsys, monkeypatch, saved_run):  # noqa: F811
    proc = ckpt(capsys, monkeypatch, "list", saved_run)
    assert proc.returncode == 0
    lines = proc.stdout.strip().splitlines()
    assert lines[0].split()[:6] == ["step", "tokens", "time", "complete", "verified", "size"]
    assert [line.split()[0] for line in lines[1:]] == ["2", "4", "6"]
    assert lines[-1].endswith("latest")
    rows = json.loads(ckpt(capsys, monkeypatch, "list", saved_run, "--json").stdout)
    assert [r["step"] for r in rows] == [2, 4, 6]
    assert all(r["complete"] and r["verified"] for r in rows)
    assert rows[1]["tokens"] == 4 * worker.GLOBAL_BATCH * worker.DIM and rows[1]["size"] > 0


def test_list_shows_a_corrupt_checkpoint(capsys, monkeypatch, saved_run):  # noqa: F811
    optim = saved_run / "checkpoints" / "step_00000004" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    # ten bytes changed inside the data, not in the zip's own records (a damaged archive structure is
    # found without checksums, even by --quick)
    data = optim.read_bytes()
    middle = len(data) // 2
    optim.write_bytes(
        data[:middle] + bytes(b ^ 0xFF for b in data[middle : middle + 10]) + data[middle + 10 :]
    )
    rows = json.loads(ckpt(capsys, monkeypatch, "list", saved_run, "--json").stdout)
    assert [r["verified"] for r in rows] == [True, False, True]
    assert "sha256 differs" in rows[1]["problem"]
    quick = json.loads(ckpt(capsys, monkeypatch, "list", saved_run, "--json", "--quick").stdout)
    assert [r["verified"] for r in quick] == [True, True, True]  # sizes only


def test_verify_ok_and_broken(capsys, monkeypatch, saved_run):  # noqa: F811
    good = saved_run / "checkpoints" / "step_00000006"
    proc = ckpt(capsys, monkeypatch, "verify", good)
    assert proc.returncode == 0 and proc.stdout.strip() == f"{good}: ok"
    (good / "rng_rank0000.pt").write_bytes(b"x")
    proc = ckpt(capsys, monkeypatch, "verify", good)
    assert proc.returncode == 2
    assert "rng_rank0000.pt: size 1, meta.json says" in one_error_line(proc)
    proc = ckpt(capsys, monkeypatch, "verify", saved_run)  # the whole run: two good, one bad
    assert proc.returncode == 2 and proc.stdout.count(": ok") == 2
    assert "(1 of 3 checkpoints fail)" in proc.stderr


def test_verify_errors_in_a_real_shell(cli_env, saved_run, tmp_path):  # noqa: F811
    (saved_run / "checkpoints" / "step_00000002" / "meta.json").unlink()
    proc = ckpt_subprocess(cli_env, "verify", saved_run / "checkpoints" / "step_00000002")
    assert proc.returncode == 2 and "meta.json: missing" in one_error_line(proc)
    proc = ckpt_subprocess(cli_env, "verify", tmp_path / "nowhere")
    assert proc.returncode == 2 and "no such checkpoint" in one_error_line(proc)
    proc = ckpt_subprocess(cli_env, "verify", tmp_path)
    assert proc.returncode == 2 and "neither a checkpoint nor a run folder" in one_error_line(proc)


def test_inspect(capsys, monkeypatch, llama_run):
    proc = ckpt(capsys, monkeypatch, "inspect", llama_run, "--json")
    assert proc.returncode == 0
    info = json.loads(proc.stdout)
    from llmtools.model import load_model_config

    config = load_model_config(dict(worker.TINY_LLAMA))
    assert info["num_parameters"] == config.num_parameters()
    assert info["zero_stage"] == 2 and info["world_size"] == 1 and info["precision"] == "fp32"
    assert info["model"]["hidden_size"] == 32 and info["master_weights"]["dtypes"] == {
        "float32": info["num_tensors"]
    }
    assert set(info["optimizer"]["state_numel_rank0"]) >= {"exp_avg", "exp_avg_sq"}
    text = ckpt(capsys, monkeypatch, "inspect", llama_run).stdout
    assert "ZeRO stage 2" in text and f"{config.num_parameters():,}" in text


def test_prune(capsys, monkeypatch, saved_run):  # noqa: F811
    dry = ckpt(capsys, monkeypatch, "prune", saved_run, "--keep", "1", "--dry-run")
    assert dry.returncode == 0 and [p.rsplit("/", 1)[-1] for p in dry.stdout.split()] == [
        "step_00000002",
        "step_00000004",
    ]
    assert len(list((saved_run / "checkpoints").glob("step_*"))) == 3
    proc = ckpt(capsys, monkeypatch, "prune", saved_run, "--keep", "1", "--keep-every", "4")
    assert proc.returncode == 0 and proc.stdout.split() == [str(saved_run / "checkpoints" / "step_00000002")]
    assert sorted(p.name for p in (saved_run / "checkpoints").glob("step_*")) == [
        "step_00000004",
        "step_00000006",
    ]
    bad = ckpt(capsys, monkeypatch, "prune", saved_run, "--keep", "0")
    assert bad.returncode == 2 and "--keep: must be >= 1" in one_error_line(bad)


def test_convert_hf_and_safetensors(capsys, monkeypatch, llama_run, tmp_path, shared_data):
    import torch
    import transformers
    from safetensors.torch import load_file

    tok = shared_data("tokenizers/gpt2/tokenizer.json")
    out = tmp_path / "hf"
    proc = ckpt(capsys, monkeypatch, "convert", llama_run, "--to", "hf", "-o", out, "--tokenizer", tok)
    assert proc.returncode == 0 and proc.stdout.strip() == str(out)
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in out.iterdir()
    }
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert transformers.AutoTokenizer.from_pretrained(out)("Hello world").input_ids == [15496, 995]
    assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, worker.TINY_LLAMA["vocab_size"])
    again = ckpt(capsys, monkeypatch, "convert", llama_run, "--to", "hf", "-o", out)
    assert again.returncode == 2 and "already exists (use --force" in one_error_line(again)
    assert ckpt(capsys, monkeypatch, "convert", llama_run, "--to", "hf", "-o", out, "--force").returncode == 0
    flat = tmp_path / "model.safetensors"
    proc = ckpt(capsys, monkeypatch, "convert", llama_run, "--to", "safetensors", "-o", flat)
    assert proc.returncode == 0 and set(load_file(flat)) == set(load_file(out / "model.safetensors"))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--to", "onnx"], "--to: 'onnx' is not one of hf, safetensors, universal"),
        (["--to", "hf", "--dtype", "int8"], "--dtype: 'int8' is not one of"),
        (["--to", "hf", "--shard-size", "lots"], "--shard-size: 'lots' is not a size"),
        (["--to", "safetensors", "--world-size", "2"], "--world-size: needs --to universal"),
        (
            ["--to", "hf", "--tokenizer", "/nonexistent/tok.json"],
            "--tokenizer: /nonexistent/tok.json does not exist",
        ),
    ],
)
def test_convert_usage_errors(capsys, monkeypatch, llama_run, tmp_path, args, message):
    proc = ckpt(capsys, monkeypatch, "convert", llama_run, "-o", tmp_path / "out", *args)
    assert proc.returncode == 2 and message in one_error_line(proc)
    assert not (tmp_path / "out").exists()


def test_convert_missing_or_foreign_input(capsys, monkeypatch, tmp_path):
    proc = ckpt(capsys, monkeypatch, "convert", tmp_path / "nope", "--to", "hf", "-o", tmp_path / "out")
    assert proc.returncode == 2 and "no such checkpoint" in one_error_line(proc)
    (tmp_path / "empty").mkdir()
    proc = ckpt(capsys, monkeypatch, "convert", tmp_path / "empty", "--to", "hf", "-o", tmp_path / "out")
    assert proc.returncode == 2 and "not a checkpoint folder" in one_error_line(proc)


def test_convert_to_universal(capsys, monkeypatch, llama_run, tmp_path):
    out = tmp_path / "univ"
    proc = ckpt(capsys, monkeypatch, "convert", llama_run, "--to", "universal", "-o", out)
    assert proc.returncode == 0 and proc.stdout.strip() == str(out)
    assert (out / "zero" / "model.embed_tokens.weight" / "fp32.pt").is_file()
    assert (out / "zero" / "model.embed_tokens.weight" / "exp_avg.pt").is_file()
    assert json.loads((out / "llmtools.json").read_text())["step"] == 2


def test_import_hf_then_convert_back(capsys, monkeypatch, llama_run, tmp_path):
    first = tmp_path / "a"
    assert ckpt(capsys, monkeypatch, "convert", llama_run, "--to", "hf", "-o", first).returncode == 0
    imported = tmp_path / "ckpt"
    proc = ckpt(capsys, monkeypatch, "import-hf", first, "-o", imported)
    assert proc.returncode == 0 and proc.stdout.strip() == str(imported)
    assert ckpt(capsys, monkeypatch, "verify", imported).returncode == 0
    second = tmp_path / "b"
    assert ckpt(capsys, monkeypatch, "convert", imported, "--to", "hf", "-o", second).returncode == 0
    assert (first / "model.safetensors").read_bytes() == (second / "model.safetensors").read_bytes()
    missing = ckpt(capsys, monkeypatch, "import-hf", tmp_path / "nothing", "-o", tmp_path / "x")
    assert missing.returncode == 2 and "not a folder" in one_error_line(missing)
