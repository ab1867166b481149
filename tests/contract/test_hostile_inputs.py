"""Inputs trusted only as far as verified, through the installed console scripts: numbers at the extremes,
model configs that ask for too much, tokenizers that lie or panic, foreign folders that drop, repeat or
point outside their files, ids out of range, contradictions between files, and the streams and pipes
around a command. Each row: exit code, one line on stderr naming the file and place, no traceback,
nothing left behind (the machinery of test_bad_inputs.py)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tests.contract.conftest import (
    REPO,
    World,
    changes,
    contract_env,
    error_line,
    run_cli,
    script,
    tree_state,
)
from tests.contract.test_bad_inputs import Row, _prepare, _render, copy_prefix, copy_tree

HUGE = "9" * 400
DS = REPO / "configs" / "deepspeed"


def other_dataset(name: str, dtype=np.uint16, docs=((5, 6, 7, 8) * 20, (9, 10) * 40)):
    """A second dataset (no sidecar, as Megatron writes one), different from the world's."""

    def setup(d: Path, w: World) -> None:
        from llmtools.formats.indexed import IndexedDatasetWriter

        with IndexedDatasetWriter(d / name, dtype, durable=False) as writer:
            for doc in docs:
                writer.add_document(np.array(doc, dtype=dtype))

    return setup


def hf_config(**changes) -> bytes:
    config = {"model_type": "llama", "vocab_size": 256, "hidden_size": 8, "intermediate_size": 16,
              "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "hidden_act": "silu"}  # fmt: skip
    return json.dumps(config | changes).encode()


def tokenizer_from(edit):
    """The world's GPT-2 tokenizer.json, edited, as ``tok.json`` in the row's folder."""

    def setup(d: Path, w: World) -> None:
        data = json.loads(Path(w.gpt2).read_text(encoding="utf-8"))
        edit(data)
        (d / "tok.json").write_text(json.dumps(data), encoding="utf-8")

    return setup


def shared_id(data: dict) -> None:
    vocab = data["model"]["vocab"]
    vocab["Ġzzzq"] = vocab["the"]  # a second token on an id in use


def backtracking(data: dict) -> None:
    # onig gives up on (a|a)+$ over a run of a's: tokenizers panics in Rust
    split = {"type": "Split", "pattern": {"Regex": "(a|a)+$"}, "behavior": "Isolated", "invert": False}
    data["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [split, data["pre_tokenizer"]]}


def lines(*items) -> bytes:
    return b"".join(json.dumps(i).encode() + b"\n" for i in items)


EVIL_TEXT = lines({"text": "fine"}, {"text": "a" * 40 + "b"})
CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
EVIL_CHAT = lines(CHAT, {"messages": [{"role": "user", "content": "a" * 40 + "b"}, {"role": "assistant", "content": "x"}]})  # fmt: skip


def edit_state(entries):
    def edit(folder: Path) -> None:
        state = json.loads((folder / "state.json").read_text())
        state["_data_files"] = entries(state["_data_files"])
        (folder / "state.json").write_text(json.dumps(state))

    return edit


def saved_ids(name: str, ids):
    def setup(d: Path, w: World) -> None:
        pa = pytest.importorskip("pyarrow")
        folder = d / name
        folder.mkdir()
        table = pa.table({"input_ids": pa.array(ids, type=pa.list_(pa.int64()))})
        with pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as sink:
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
        state = {"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": None}
        (folder / "state.json").write_text(json.dumps(state))

    return setup


def unvouched_run(d: Path, w: World) -> None:
    other_dataset("over", np.int32, docs=((1, 2, 3, 4) * 16, (9, 1000, 3) * 20))(d, w)
    text = Path(w.tiny_yaml).read_text().replace(str(w.prefix), str(d / "over"))
    (d / "over.yaml").write_text(text)


def _drop_a_file(d: Path, w: World) -> None:
    """The export's one shard renamed and a copy listed in its place: the folder holds a file state.json
    does not list."""
    copy_tree("hf", "hf")(d, w)
    folder = d / "hf"
    shard = next(folder.glob("data-*.arrow"))
    shutil.copy(shard, folder / "data-00000-of-00001.arrow.copy")
    (folder / "data-00000-of-00001.arrow.copy").rename(folder / "extra.arrow")


MIX = ["--seq-length", "16", "--num-samples", "64", "-o", "m.json"]
ROWS = [
    Row("mix-weights-sum-overflow", ["llm-mix", "{w.prefix}", "other", "--weights", "1e308,1e308", *MIX], 2,
        r"--weights: the values sum to infinity", setup=other_dataset("other")),
    Row("mix-stage-weights-overflow", ["llm-mix", "{w.prefix}", "other", "--stage", "end", "1e308", "1e308", *MIX],
        2, r"--stage 1 \(end\): the values sum to infinity", setup=other_dataset("other")),
    Row("mix-weight-overflows-float", ["llm-mix", "{w.prefix}", "other", "--weights", "1e999,1", *MIX], 2,
        r"--weights: weight 1 is inf", setup=other_dataset("other")),
    Row("mix-count-400-digits", ["llm-mix", "{w.prefix}", "--seq-length", "16", "--num-samples", HUGE, "-o", "m.json"],
        2, r"--num-samples: .*400 digits"),
    Row("mix-same-content-two-names", ["llm-mix", "{w.prefix}", "twin", "--weights", "1,1", *MIX], 2,
        r"twin: the same data as .*byte_text_document", setup=copy_prefix("twin")),
    Row("prep-shard-count-20-digits", ["llm-prep", "json2bin", "in.jsonl", "-t", "byte", "-o", "out/x", "--shard",
        "0/" + "9" * 20], 2, r"--shard: .*at most 1000000 shards", files={"in.jsonl": lines({"text": "a"})}),
    Row("ckpt-import-hf-deep-config", ["llm-ckpt", "import-hf", "deep", "-o", "out"], 2,
        r"deep/config.json: model.num_hidden_layers: 100000 is beyond",
        files={"deep/config.json": hf_config(num_hidden_layers=100_000), "deep/model.safetensors": b""}),
    Row("ckpt-import-hf-huge-config", ["llm-ckpt", "import-hf", "huge", "-o", "out"], 2,
        r"huge/config.json: model: .* parameters .* beyond",
        files={"huge/config.json": hf_config(hidden_size=65536, intermediate_size=262144, num_hidden_layers=1024,
                                             num_attention_heads=512, num_key_value_heads=512),
               "huge/model.safetensors": b""}),
    Row("prep-tokenizer-shared-id", ["llm-prep", "json2bin", "in.jsonl", "-t", "tok.json", "-o", "out/x"], 2,
        r"tok.json: tokens 'the' and 'Ġzzzq' share id 1169", files={"in.jsonl": lines({"text": "a"})},
        setup=tokenizer_from(shared_id)),
    Row("prep-tokenizer-panics", ["llm-prep", "json2bin", "in.jsonl", "-t", "tok.json", "-o", "out/x"], 2,
        r"in.jsonl:2: the tokenizer failed on this text \(panicked", files={"in.jsonl": EVIL_TEXT},
        setup=tokenizer_from(backtracking)),
    Row("prep-tokenizer-panics-workers", ["llm-prep", "json2bin", "in.jsonl", "-t", "tok.json", "-o", "out/x",
        "--workers", "2", "--backend", "tokenizers"], 2, r"in.jsonl:2: the tokenizer failed on this text",
        files={"in.jsonl": EVIL_TEXT}, setup=tokenizer_from(backtracking)),
    Row("sft-tokenizer-panics", ["llm-prep", "sft", "in.jsonl", "-t", "tok.json", "--chat-template", "chatml", "-o",
        "out/s"], 2, r"in.jsonl:2: the tokenizer failed on this text", files={"in.jsonl": EVIL_CHAT},
        setup=tokenizer_from(backtracking)),
    Row("pref-same-answers", ["llm-prep", "pref", "in.jsonl", "-t", "byte", "--chat-template", "chatml", "-o", "out/p"],
        2, r"in.jsonl:2: \[chosen\] and \[rejected\] are the same answer",
        files={"in.jsonl": lines({"prompt": "q", "chosen": "a", "rejected": "b"},
                                 {"prompt": "q", "chosen": "same", "rejected": "same"})}),
    Row("hf2bin-state-repeats-a-file", ["llm-prep", "hf2bin", "hf", "-t", "byte", "-o", "out/x"], 2,
        r"hf/state.json\[_data_files\]\[1\]: .* listed twice",
        setup=copy_tree("hf", "hf", edit_state(lambda e: e + e))),
    Row("hf2bin-state-points-outside", ["llm-prep", "hf2bin", "hf", "-t", "byte", "-o", "out/x"], 2,
        r"hf/state.json\[_data_files\]\[0\]: '\.\./x.arrow' is not a file name inside",
        setup=copy_tree("hf", "hf", edit_state(lambda e: [{"filename": "../x.arrow"}]))),
    Row("hf2bin-state-drops-a-file", ["llm-prep", "hf2bin", "hf", "-t", "byte", "-o", "out/x"], 2,
        r"hf/state.json\[_data_files\]: does not list extra.arrow", setup=_drop_a_file),
    Row("hf2bin-negative-id", ["llm-prep", "hf2bin", "ids", "-o", "out/x"], 2,
        r"ids: row 1: token id -1 is outside what int32 holds", setup=saved_ids("ids", [[1, 2], [3, -1]])),
    Row("hf2bin-id-2-to-the-40", ["llm-prep", "hf2bin", "ids", "-o", "out/x"], 2,
        r"ids: row 0: token id 1099511627776 is outside", setup=saved_ids("ids", [[1, 2**40]])),
    Row("train-unvouched-ids-beyond-vocab", ["llm-train", "over.yaml", "--deepspeed", DS / "zero1.json", "-o", "run"], 2,
        r"over.bin: token id 1000 .* outside the model's vocab_size 512", setup=unvouched_run),
    Row("export-packed-longer-than-data", ["llm-export", "hf", "{w.prefix}", "--packed", "--seq-length", "10000000",
        "-o", "out"], 2, r"byte_text_document.bin: --seq-length 10000000 is longer than all of its"),
    Row("inspect-negative-id", ["llm-prep", "inspect", "neg"], 2, r"neg.bin@byte 4: token id -1 is negative",
        setup=other_dataset("neg", np.int32, docs=((1, -1, 2),))),
    Row("inspect-float-dataset", ["llm-prep", "inspect", "flt"], 2, r"flt.idx: dtype float32 .* token ids are integers",
        setup=other_dataset("flt", np.float32, docs=((1.5, 2.0),))),
    Row("merge-stamps-no-tokenizer", ["llm-prep", "merge", "{w.prefix}", "nos", "-o", "out/m"], 2,
        r"nos: has no sidecar naming its tokenizer, but .*byte_text_document was made with",
        setup=other_dataset("nos")),
    Row("merge-dataset-listed-twice", ["llm-prep", "merge", "{w.prefix}", "{w.prefix}", "-o", "out/m"], 2,
        r"byte_text_document: the same dataset is named twice"),
    Row("json2bin-input-listed-twice", ["llm-prep", "json2bin", "in.jsonl", "./in.jsonl", "-t", "byte", "-o", "x"],
        2, r"^llm-prep: error: \./in\.jsonl: the same input is named twice", files={"in.jsonl": lines({"text": "a"})}),
    Row("prep-output-dot", ["llm-prep", "json2bin", "in.jsonl", "-t", "byte", "-o", "."], 2,
        r"--output \.: is a folder", files={"in.jsonl": lines({"text": "a"})}),
]  # fmt: skip


@pytest.fixture(scope="module")
def table(world, tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")

    def run_row(row: Row):
        d = _prepare(row, root, world)
        before = tree_state(d)
        argv = [_render(str(a), d, world) for a in row.argv]
        proc = run_cli(argv, d, stdin=row.stdin, timeout=row.timeout)
        return row.name, (proc, before, tree_state(d))

    with ThreadPoolExecutor(max_workers=max(2, min(4, (os.cpu_count() or 2) + 1))) as pool:
        return dict(pool.map(run_row, ROWS))


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_hostile_input(row: Row, table):
    proc, before, after = table[row.name]
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == row.code, f"exit {proc.returncode}, expected {row.code}:\n{err[-2000:]}"
    line = error_line(proc, row.prog)
    assert re.search(row.where, line), f"{line!r} does not name {row.where!r}"
    assert changes(before, after) == [], "files were left behind or changed"


# -- streams and pipes -----------------------------------------------------------------------------------
def test_a_closed_stdin_is_one_line(tmp_path):
    for argv in (["llm-prep", "json2bin", "-", "-t", "byte", "-o", "out/x"], ["llm-log", "summary", "-"]):
        proc = subprocess.run([script(argv[0]), *argv[1:]], cwd=tmp_path, stdin=subprocess.DEVNULL,
                              capture_output=True, env=contract_env(), timeout=120,
                              preexec_fn=lambda: os.close(0))  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        assert "standard input is closed" in error_line(proc, argv[0])
    assert list(tmp_path.iterdir()) == []


def test_json_output_gives_a_non_utf8_path_back_byte_for_byte(tmp_path):
    """--json: a path that is UTF-8 is a string, any other is {"bytes_b64": ...} of its exact bytes (never
    Python's lone-surrogate escape, which strict readers refuse or replace)."""
    odd = os.path.join(os.fsencode(tmp_path), b"d\xff\xfe")
    os.mkdir(odd)
    (tmp_path / "in.jsonl").write_bytes(lines({"text": "a"}))
    argv = [
        script("llm-prep"),
        "json2bin",
        "in.jsonl",
        "-t",
        "byte",
        "-o",
        os.path.join(odd, b"x"),
        "-q",
        "--json",
    ]
    proc = subprocess.run(argv, capture_output=True, env=contract_env(), timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout.decode("utf-8")  # strict: the output is UTF-8 ...
    assert "\\udc" not in text  # ... with no escaped lone surrogates
    report = json.loads(text)
    written = [base64.b64decode(p["bytes_b64"]) for p in report["paths"]]
    assert written == [os.path.join(odd, b"x_text_document" + s) for s in (b".bin", b".idx", b".json")]
    assert all(os.path.isfile(p) for p in written)


def test_files_under_a_non_utf8_name_are_written_by_the_one_rule_and_read_back(tmp_path):
    """json2bin -> llm-mix -> llm-train -> verify -> convert inside a folder whose name is not UTF-8, from
    an input whose name is not UTF-8: every command works, every JSON file written (sidecars, mix.json,
    meta.json, metrics, markers) is strict UTF-8 with such paths as {"bytes_b64": ...}, and the readers
    of those files get the exact paths back (the run reads its mix.json, verify its meta.json)."""
    from llmtools.formats import jsonfile

    odd = os.path.join(os.fsencode(tmp_path), b"d\xff\xfe")
    os.mkdir(odd)
    inside = lambda name: os.path.join(odd, name)  # noqa: E731
    text = lambda word: b"".join(lines({"text": f"{word} {i} " * 20}) for i in range(100))  # noqa: E731
    (tmp_path / "plain.jsonl").write_bytes(text("plain"))
    Path(os.fsdecode(os.path.join(os.fsencode(tmp_path), b"in\xff.jsonl"))).write_bytes(text("odd"))
    (tmp_path / "t.yaml").write_text(
        "model: {preset: tiny, vocab_size: 320, num_hidden_layers: 2, hidden_size: 96, intermediate_size: 256}\n"
        "training: {micro_batch_size: 2, global_batch_size: 2, train_steps: 2}\n"
        "schedule: {kind: constant}\ncheckpoint: {save_every: 0}\neval: {every: 0}\n"
    )
    step = inside(b"run/checkpoints/step_00000002")
    for argv in (
        ["llm-prep", "json2bin", b"in\xff.jsonl", "-t", "byte", "-o", inside(b"odd"), "-q"],
        ["llm-prep", "json2bin", "plain.jsonl", "-t", "byte", "-o", inside(b"plain"), "-q"],
        ["llm-mix", inside(b"odd_text_document"), inside(b"plain_text_document"), "-o", inside(b"mix.json"),
         "--seq-length", "64", "--num-samples", "64"],
        ["llm-train", "t.yaml", "--deepspeed", "zero1", "-o", inside(b"run"), "--set", b"data.mix=" + inside(b"mix.json")],
        ["llm-ckpt", "verify", step],
        ["llm-ckpt", "convert", step, "--to", "hf", "-o", inside(b"hf")],
    ):  # fmt: skip
        proc = subprocess.run([script(argv[0]), *argv[1:]], cwd=tmp_path, capture_output=True,
                              env=contract_env(), timeout=600)  # fmt: skip
        assert proc.returncode == 0, (argv, proc.stderr.decode(errors="replace")[-2000:])
    written = []
    for folder, _, names in os.walk(odd):
        written += [os.path.join(folder, n) for n in names if n.endswith((b".json", b".jsonl"))]
    assert len(written) >= 6, written
    for path in written:
        content = Path(os.fsdecode(path)).read_bytes().decode("utf-8")  # strict UTF-8 ...
        assert "\\udc" not in content, path  # ... with no escaped lone surrogate
    mix = jsonfile.read_json_object(os.fsdecode(inside(b"mix.json")), ours=True)
    prefixes = {os.fsencode(source["prefix"]) for source in mix["sources"]}
    assert prefixes == {inside(b"odd_text_document"), inside(b"plain_text_document")}
    sidecar = jsonfile.loads(Path(os.fsdecode(inside(b"odd_text_document.json"))).read_text(), ours=True)
    assert [os.fsencode(i["path"]) for i in sidecar["inputs"]] == [b"in\xff.jsonl"]
    raw = json.loads(Path(os.fsdecode(inside(b"odd_text_document.json"))).read_text())
    assert base64.b64decode(raw["inputs"][0]["path"]["bytes_b64"]) == b"in\xff.jsonl"


def test_a_broken_pipe_ends_quietly_with_141(world, tmp_path):
    """``llm-prep cat | head``: the reader goes away; the command ends as a Unix tool killed by SIGPIPE
    would (status 141), with nothing on stderr."""
    read, write = os.pipe()
    # The reader is gone before the first write (`... | head -c 0`): a small dataset's text would
    # otherwise fit in the pipe's buffer and the command could finish before a reader went away.
    os.close(read)
    proc = subprocess.Popen([script("llm-prep"), "cat", str(world.prefix)], stdout=write, stderr=subprocess.PIPE,
                            env=contract_env(), cwd=tmp_path)  # fmt: skip
    os.close(write)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141 and err == b"", err


def test_a_400_digit_number_in_a_log_is_shown_not_fatal(tmp_path):
    log = tmp_path / "m.jsonl"
    log.write_text('{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 1' + "0" * 400 + "}\n")
    proc = run_cli(["llm-log", "summary", log], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"NaN/inf losses\s+1 at 2", proc.stdout.decode()), proc.stdout.decode()


def test_a_pipe_given_as_a_path_is_read_once_from_the_start(tmp_path):
    """``json2bin <(cat a.jsonl)`` and a FIFO: every document, none lost to a peek at the first bytes."""
    (tmp_path / "a.jsonl").write_bytes(lines(*({"text": f"doc {i}"} for i in range(50))))
    os.mkfifo(tmp_path / "fifo")
    writer = subprocess.Popen(["sh", "-c", "cat a.jsonl > fifo"], cwd=tmp_path)
    for name, given in (("sub", "<(cat a.jsonl)"), ("fifo", "fifo")):
        command = f"{script('llm-prep')} json2bin {given} -t byte -o out/{name} -q"
        proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, env=contract_env(),
                              timeout=120)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        sidecar = json.loads((tmp_path / "out" / f"{name}_text_document.json").read_text())
        assert sidecar["counts"]["documents"] == 50
    writer.wait(timeout=30)


def test_paths_are_bytes(world, tmp_path):
    """A folder whose name is not UTF-8: a tokenizer.json, a SentencePiece model and an export there work
    (the libraries get the files' bytes, or a Python file, never the path as text)."""
    from tests.conftest import shared

    odd = os.path.join(os.fsencode(tmp_path), b"dir\xff")
    os.mkdir(odd)
    spm = shared("tokenizers/sentencepiece-test/test_model.model")
    shutil.copy(world.gpt2, os.path.join(odd, b"tokenizer.json"))
    shutil.copy(spm, os.path.join(odd, b"t.model"))
    for tok, out in ((b"tokenizer.json", b"a"), (b"t.model", b"b")):
        argv = [script("llm-prep"), "json2bin", str(world.corpus), "-t", os.path.join(odd, tok), "-o",
                os.path.join(odd, out), "-q", "--backend", "tokenizers"]  # fmt: skip
        proc = subprocess.run(argv, capture_output=True, env=contract_env(), timeout=120, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    for fmt in ("arrow", "parquet"):
        argv = [
            script("llm-export"),
            "hf",
            str(world.prefix),
            "-o",
            os.path.join(odd, fmt.encode()),
            "--format",
            fmt,
        ]
        proc = subprocess.run(argv, capture_output=True, env=contract_env(), timeout=120, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
