"""``--force`` replaces an earlier output of ours and nothing else, in every command that writes.

The cases the issue names run as real processes; the same rule in each of the other commands runs through
their real ``main`` in this process (arguments, the helper and the error mapping included), which is
enough to show each command asks the one helper (:func:`llmtools.cli.claim.claim`).
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.trust.conftest import _cli_env, cli, error_line, snapshot

STEP4 = "checkpoints/step_00000004"


def process(command, *args):
    """Every command's --force as a real process too: a refusal's exit code is the process's."""
    return cli(command, *args, env=_cli_env())


def refused(proc, *needles) -> str:
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = error_line(proc)
    for needle in needles:
        assert needle in line, line
    return line


# -------------------------------------------------------------------------- the cases, as processes
def test_convert_into_the_run_or_its_checkpoints_is_refused(run, env):
    before = snapshot(run)
    refused(cli("ckpt", "convert", run, "--to", "hf", "-o", run, "--force", env=env), "it is the input")
    proc = cli("ckpt", "convert", run, "--to", "hf", "-o", run / "checkpoints", "--force", env=env)
    refused(proc, "lies inside the input")
    assert snapshot(run) == before


def test_export_into_the_folder_holding_its_input_is_refused(trust_data, env, tmp_path):
    folder = tmp_path / "data"
    shutil.copytree(trust_data["folder"], folder)
    before = snapshot(folder)
    proc = cli("export", "hf", folder / "shk_text_document", "-o", folder, "--force", env=env)
    refused(proc, "contains the input", "shk_text_document")
    assert snapshot(folder) == before


def test_import_hf_into_a_folder_of_someone_elses_files_is_refused(run, env, tmp_path):
    from llmtools.ckpt.convert import import_hf, to_hf

    hf = to_hf(run / STEP4, tmp_path / "hf")
    theirs = tmp_path / "project"
    theirs.mkdir()
    (theirs / "notes.md").write_text("mine")
    proc = cli("ckpt", "import-hf", hf, "-o", theirs, "--force", env=env)
    refused(proc, "non-empty folder llmtools did not write")
    assert [p.name for p in theirs.iterdir()] == ["notes.md"]
    # ...while an earlier import (ours) is replaced
    import_hf(hf, tmp_path / "ckpt")
    assert cli("ckpt", "import-hf", hf, "-o", tmp_path / "ckpt", "--force", env=env).returncode == 0


def test_json2bin_never_overwrites_its_own_input(env, tmp_path):
    corpus = tmp_path / "c_text_document.json"  # a JSONL file named like the sidecar it would write
    corpus.write_text('{"text": "hello"}\n{"text": "world"}\n')
    before = corpus.read_bytes()
    proc = cli("prep", "json2bin", corpus, "-t", "byte", "-o", tmp_path / "c", "--force", env=env)
    refused(proc, "it is the input", "c_text_document.json")
    listing = tmp_path / "inputs.txt"  # named through an @list, with Megatron's --input spelling
    listing.write_text(f"{corpus}\n")
    proc = cli(
        "prep", "json2bin", "--input", f"@{listing}", "-t", "byte", "-o", tmp_path / "c", "--force", env=env
    )
    refused(proc, "it is the input", "c_text_document.json")
    assert corpus.read_bytes() == before and not (tmp_path / "c_text_document.bin").exists()


# -------------------------------------------------------------------------- every other writer, in process
def test_json2bin_force_replaces_only_its_own_output(tmp_path):
    corpus = tmp_path / "in.jsonl"
    corpus.write_text('{"text": "abc"}\n')
    args = ("json2bin", corpus, "-t", "byte", "-o", tmp_path / "o", "-q")
    assert process("prep", *args).returncode == 0
    refused(process("prep", *args), "already exists (use --force")
    assert process("prep", *args, "--force").returncode == 0
    (tmp_path / "o_text_document.json").unlink()  # now a pair like one Megatron wrote: not ours
    refused(process("prep", *args, "--force"), "without an llmtools sidecar")

    # --force also removes a killed run's leftovers (OUTPUT.tmp-*): never an input named like one
    odd = tmp_path / "n_text_document.bin.tmp-kept" / "in.jsonl"
    odd.parent.mkdir()
    shutil.copy(corpus, odd)
    args = ("json2bin", odd, "-t", "byte", "-o", tmp_path / "n", "-q")
    refused(process("prep", *args, "--force"), "would remove the input", str(odd))
    assert odd.is_file() and process("prep", *args).returncode == 0  # kept without it
    assert odd.is_file()


def test_tokenizer_train_and_sample_corpus(tmp_path):
    corpus = tmp_path / "raw"
    assert process("prep", "sample-corpus", "-o", corpus, "--docs", "20").returncode == 0
    args = ("sample-corpus", "-o", corpus, "--docs", "20")
    assert process("prep", *args, "--force").returncode == 0  # ours: replaced
    (corpus / "arith.jsonl").write_text('{"text": "edited by hand"}\n')  # no longer what we wrote
    refused(process("prep", *args, "--force"), "changed since llmtools wrote it")

    tok = tmp_path / "tok.json"
    train = ("tokenizer", "train", corpus / "stories.jsonl", "--vocab-size", "300", "-o", tok)
    assert process("prep", *train).returncode == 0
    assert process("prep", *train, "--force").returncode == 0
    tok.write_text(tok.read_text().replace('"version"', '"version" ', 1))  # someone else's file now
    refused(process("prep", *train, "--force"), "changed since llmtools wrote it")
    into_input = ("tokenizer", "train", corpus / "stories.jsonl", "--vocab-size", "300", "-o")
    refused(process("prep", *into_input, corpus / "stories.jsonl", "--force"), "is the input")


def test_hf2bin_sft_and_mix(trust_data, tmp_path):
    pq = tmp_path / "pq"
    prefix = trust_data["prefix"]
    assert process("export", "hf", prefix, "-o", pq, "--format", "parquet", "-q").returncode == 0
    refused(process("prep", "hf2bin", pq, "-o", pq / "x", "-q"), "lies inside the input")

    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    foreign = tmp_path / "s_input_ids_document.bin"
    foreign.write_bytes(b"megatron made me")
    sft = ("sft", chat, "-t", "byte", "--chat-template", "chatml", "-o", tmp_path / "s", "--force")
    refused(process("prep", *sft), "without an llmtools sidecar")
    assert foreign.read_bytes() == b"megatron made me"

    sidecar = f"{prefix}.json"
    mix = ("mix", prefix, "--seq-length", "32", "--num-samples", "10", "-o", sidecar, "--force")
    refused(process(*mix), "it is the input")
    args_file, weights = tmp_path / "args.txt", tmp_path / "weights.txt"  # @FILE lists are inputs too
    args_file.write_text(f"1.0 {prefix}\n")
    weights.write_text("1.0\n")
    for files in (("--data-args-path", args_file), (prefix, "--stage", "end", f"@{weights}")):
        before = {p: p.read_bytes() for p in (args_file, weights)}
        output = files[1] if files[0] == "--data-args-path" else weights
        mix = ("mix", *files, "--seq-length", "32", "--num-samples", "10", "-o", output, "--force")
        refused(process(*mix), "it is the input")
        assert {p: p.read_bytes() for p in (args_file, weights)} == before


def test_log_plot_and_tb(run, tmp_path):
    metrics = run / "metrics.jsonl"
    refused(process("log", "plot", metrics, "-o", metrics, "--force"), "it is the input")
    png = tmp_path / "curves.png"
    assert process("log", "plot", metrics, "-o", png, "-q").returncode == 0
    assert process("log", "plot", metrics, "-o", png, "--force", "-q").returncode == 0
    photo = tmp_path / "photo.png"
    photo.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 32)
    refused(process("log", "plot", metrics, "-o", photo, "--force"), "did not write")
    refused(process("log", "tb", metrics, "--logdir", metrics), "it is the input")


@pytest.mark.parametrize("case", ["ds-config-in-run", "foreign-config"])
def test_train_force_removes_only_an_earlier_run_of_ours(run, env, train_files, tmp_path, case):
    config, ds = train_files
    if case == "ds-config-in-run":  # --force would delete the DeepSpeed config it was given
        before = snapshot(run)
        proc = cli("train", config, "--deepspeed", run / "ds_config.json", "-o", run, "--force", env=env)
        refused(proc, "ds_config.json", "it is the input")
        assert snapshot(run) == before
    else:  # a folder of someone else's files that happens to hold a config.yaml
        theirs = tmp_path / "project"
        theirs.mkdir()
        (theirs / "config.yaml").write_text("name: my project\n")
        for extra in ([], ["--force"]):
            proc = cli("train", config, "--deepspeed", ds, "-o", theirs, *extra, env=env)
            refused(proc, "config.yaml", "did not write")
        assert (theirs / "config.yaml").read_text() == "name: my project\n"


def test_merge_never_replaces_an_input_or_a_foreign_dataset(trust_data, env, tmp_path):
    folder = tmp_path / "data"
    shutil.copytree(trust_data["folder"], folder)
    source = folder / "shk_text_document"
    before = snapshot(folder)
    refused(cli("prep", "merge", source, "-o", source, "--force", env=env), "it is the input")
    # through an @list naming it, and an output named by its .bin
    listing = tmp_path / "parts.txt"
    listing.write_text(f"{source}\n")
    refused(cli("prep", "merge", f"@{listing}", "-o", f"{source}.bin", "--force", env=env), "it is the input")
    assert snapshot(folder) == before

    out = tmp_path / "merged"
    assert cli("prep", "merge", source, "-o", out, "-q", env=env).returncode == 0
    refused(cli("prep", "merge", source, "-o", out, env=env), "already exists (use --force")
    assert cli("prep", "merge", source, "-o", out, "--force", "-q", env=env).returncode == 0  # ours
    (tmp_path / "merged.json").unlink()  # a pair like one Megatron's merge_datasets.py wrote: not ours
    refused(cli("prep", "merge", source, "-o", out, "--force", env=env), "without an llmtools sidecar")

    # inputs without sidecars (Megatron's) merge into a marked pair, which --force may replace again
    bare = tmp_path / "bare"
    for suffix in (".bin", ".idx"):
        shutil.copy(f"{source}{suffix}", f"{bare}{suffix}")
    out = tmp_path / "merged_bare"
    assert cli("prep", "merge", bare, "-o", out, "-q", env=env).returncode == 0
    assert sorted(p.name for p in tmp_path.glob("merged_bare*") if p.suffix != ".lock") == [
        "merged_bare.bin", "merged_bare.bin.llmtools.json", "merged_bare.idx", "merged_bare.idx.llmtools.json"
    ]  # fmt: skip
    refused(cli("prep", "merge", bare, "-o", out, env=env), "already exists (use --force")
    assert cli("prep", "merge", bare, "-o", out, "--force", "-q", env=env).returncode == 0


def test_pref_force_replaces_only_its_own_output(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "Name a colour", "chosen": "Blue.", "rejected": "Seven."}) + "\n")
    args = ("pref", pairs, "-t", "byte", "--chat-template", "chatml", "-o", tmp_path / "p", "-q")
    assert process("prep", *args).returncode == 0
    assert process("prep", *args, "--force").returncode == 0
    foreign = tmp_path / "p_chosen_input_ids_document.json"
    foreign.write_text('{"made": "by hand"}')
    refused(process("prep", *args, "--force"), "p_chosen_input_ids_document")
    assert foreign.read_text() == '{"made": "by hand"}'
    into = ("pref", pairs, "-t", "byte", "--chat-template", "chatml", "-o", pairs / "p", "--force")
    refused(process("prep", *into), "lies inside the input")


def test_a_folder_holding_only_a_reference_pass_is_a_run_of_ours(env, train_files, tmp_path):
    """A preference run stopped after its reference pass: a run without --force, cleared by --force; a
    ``reference`` folder llmtools did not write is kept, --force or not."""
    import numpy as np

    from llmtools.formats import output_marks as outputs
    from llmtools.formats import reference

    assert outputs.REFERENCE_META == reference.META_FILE
    run_dir = tmp_path / "run"
    reference.write_reference(run_dir / "reference", np.zeros((2, 2)), {"weights": None})
    assert outputs.not_ours(run_dir) is None and outputs.not_ours(run_dir / "reference") is None
    config, ds = train_files
    train = ("train", config, "--deepspeed", ds, "-o", run_dir, "--set", "training.train_steps=1")
    refused(cli(*train, env=env), "already holds a run (reference)")
    assert cli(*train, "--force", env=env).returncode == 0
    assert not (run_dir / "reference").exists() and (run_dir / "metrics.jsonl").is_file()

    theirs = tmp_path / "theirs"
    (theirs / "reference").mkdir(parents=True)
    (theirs / "reference" / "notes.md").write_text("mine")
    for extra in ([], ["--force"]):
        proc = cli("train", config, "--deepspeed", ds, "-o", theirs, *extra, env=env)
        refused(proc, "reference", "did not write")
    assert [p.name for p in theirs.rglob("*")] == ["reference", "notes.md"]
