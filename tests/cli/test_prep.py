"""``llm-prep`` end to end: the real command in a subprocess, exit codes, stdout, stderr, files."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO, shared

FIX = "megatron-deepspeed-fixtures"


def prep(args, env, stdin=None, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "llmtools.cli.prep", *map(str, args)],
        env=env,
        input=stdin,
        capture_output=True,
        cwd=cwd or REPO,
    )


def test_help_is_instant_and_imports_nothing_heavy(cli_env):
    code = (
        "import sys, time; t = time.perf_counter(); import llmtools.cli.prep; "
        "heavy = [m for m in ('torch', 'numpy', 'tokenizers', 'gigatoken', 'transformers', 'deepspeed', "
        "'sentencepiece', 'datasets', 'pyarrow') if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=cli_env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
    for args in (
        ["--help"],
        ["json2bin", "--help"],
        ["tokenizer", "train", "--help"],
        ["inspect", "--help"],
        ["cat", "--help"],
        ["sample-corpus", "--help"],
        ["merge", "--help"],
    ):
        result = prep(args, cli_env)
        assert result.returncode == 0 and b"Usage:" in result.stdout
    assert b"Examples:" in prep(["json2bin", "--help"], cli_env).stdout


def test_json2bin_golden_via_cli(tmp_path, cli_env):
    vocab = shared(f"{FIX}/gpt2-tiny-vocab.json")
    corpus = shared(f"{FIX}/openwebtext-1000.reconstructed.jsonl")
    result = prep(
        ["json2bin", corpus, "-t", vocab, "-o", tmp_path / "owt", "--append-eod", "--workers", "2"], cli_env
    )
    assert result.returncode == 0, result.stderr
    prefix = tmp_path / "owt_text_document"
    assert result.stdout.decode().splitlines() == [f"{prefix}.bin", f"{prefix}.idx", f"{prefix}.json"]
    assert b"1,000 documents, 1,361,845 tokens" in result.stderr
    golden = shared(f"{FIX}/meg-gpt2-openwebtext_text_document.bin").with_suffix("")
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"owt_text_document{suffix}").read_bytes() == golden.with_suffix(
            suffix
        ).read_bytes()
    again = prep(["json2bin", corpus, "-t", vocab, "-o", tmp_path / "owt"], cli_env)
    assert again.returncode == 2 and b"already exists (use --force to overwrite)" in again.stderr


def test_json2bin_stdin_json_summary(tmp_path, cli_env):
    data = gzip.compress(b'{"text": "hello"}\n{"text": ""}\n{"text": "world"}\n')
    result = prep(
        ["json2bin", "-", "-t", "byte", "-o", tmp_path / "s", "--append-eod", "--json", "-q"],
        cli_env,
        stdin=data,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (
        summary["documents"] == 3
        and summary["empty_documents"] == {"text": 1}
        and summary["tokens"] == {"text": 12}
    )
    assert result.stderr == b""
    sidecar = json.loads((tmp_path / "s_text_document.json").read_text())
    assert sidecar["inputs"][0]["path"] == "<stdin>" and sidecar["inputs"][0]["size"] == len(data)


BAD = [
    ("malformed.jsonl", b'{"text": "a"}\n{"text": "b",}\n', ":2: malformed JSON"),
    ("missing.jsonl", b'{"text": "a"}\n{"body": "b"}\n', ":2: missing key 'text'"),
    ("nonstring.jsonl", b'{"text": "a"}\n{"text": ["b"]}\n', ":2: key 'text' is list, expected a string"),
    ("utf8.jsonl", b'{"text": "a"}\n{"text": "\xc3\x28"}\n', ":2: invalid UTF-8"),
    ("empty.jsonl", b"", ": empty file"),
    ("truncated.jsonl", b'{"text": "a"}\n{"text": "b', ":2: truncated last line"),
    (
        "truncated.jsonl.gz",
        gzip.compress(b'{"text": "a"}\n' * 200)[:-12],
        r":\d+: compressed stream ends early",
    ),
]


@pytest.mark.parametrize("name,data,message", BAD, ids=[b[0] for b in BAD])
def test_bad_input_exit_2_file_line_and_no_output(tmp_path, cli_env, name, data, message):
    src = tmp_path / name
    src.write_bytes(data)
    out = tmp_path / "out"
    result = prep(["json2bin", src, "-t", "byte", "-o", out / "x", "--workers", "2"], cli_env)
    assert result.returncode == 2
    err = result.stderr.decode()
    assert re.match(re.escape(f"llm-prep: error: {src}") + message, err), err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not out.exists() or list(out.iterdir()) == []
    skipped = prep(["json2bin", src, "-t", "byte", "-o", out / "y", "--skip-bad", "-q"], cli_env)
    assert skipped.returncode == 0, skipped.stderr
    assert sum(json.loads((out / "y_text_document.json").read_text())["counts"]["skipped"].values()) >= 1


def test_usage_errors_exit_2(tmp_path, cli_env):
    src = tmp_path / "a.jsonl"
    src.write_text('{"text": "a"}\n')
    cases = [
        (
            ["json2bin", src, "-t", "byte", "-o", tmp_path / "o", "--workers", "0"],
            "--workers: must be from 1 to 1024",
        ),
        (
            ["json2bin", src, "-t", "byte", "-o", tmp_path / "o", "--special-tokens", "x"],
            "--special-tokens: unknown policy",
        ),
        (
            ["json2bin", tmp_path / "nope.jsonl", "-t", "byte", "-o", tmp_path / "o"],
            "nope.jsonl: no such file",
        ),
        (
            ["json2bin", src, "-t", tmp_path / "nope.json", "-o", tmp_path / "o"],
            "nope.json: no such tokenizer",
        ),
        (["cat", tmp_path / "missing"], "missing.idx: no such file"),
    ]
    for args, message in cases:
        result = prep(args, cli_env)
        assert result.returncode == 2 and message in result.stderr.decode(), (args, result.stderr)


def test_inspect_and_cat(tmp_path, cli_env):
    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["hello", "", "wörld\nline", "x"]))
    assert (
        prep(["json2bin", src, "-t", "byte", "-o", tmp_path / "a", "--append-eod", "-q"], cli_env).returncode
        == 0
    )
    prefix = tmp_path / "a_text_document"
    report = json.loads(prep(["inspect", f"{prefix}.idx", "--json"], cli_env).stdout)
    assert (report["documents"], report["sequences"], report["tokens"], report["empty_documents"]) == (
        4,
        3,
        20,
        1,
    )
    assert report["dtype"] == "uint16" and report["valid"] and report["tokenizer"]["kind"] == "byte"
    assert report["document_length"]["max"] == 12
    text = prep(["inspect", prefix], cli_env).stdout.decode()
    assert "documents     4 (1 empty)" in text and "valid         yes" in text
    ids = prep(["cat", prefix, "--docs", "0:2"], cli_env).stdout.decode()
    assert ids == "104 101 108 108 111 256\n\n"
    decoded = prep(["cat", prefix, "--docs", "2", "-t", "byte", "--json"], cli_env).stdout.decode()
    assert json.loads(decoded) == {"doc": 2, "text": "wörld\nline<|endoftext|>"}
    assert prep(["cat", prefix, "--docs", "-1", "-t", "byte"], cli_env).stdout.decode() == "x<|endoftext|>\n"
    bad = prep(["cat", prefix, "--docs", "9"], cli_env)
    assert bad.returncode == 2 and b"--docs: document 9 out of range" in bad.stderr
    with open(f"{prefix}.bin", "r+b") as handle:
        handle.truncate(10)
    broken = prep(["inspect", prefix], cli_env)
    assert broken.returncode == 2 and b"a_text_document.bin@byte 10: .bin is 10 bytes" in broken.stderr


def test_inspect_megatron_file_without_sidecar(cli_env):
    prefix = shared(f"{FIX}/bloomtok_ag_news_prompt_targets_document.idx").with_suffix("")
    report = json.loads(prep(["inspect", prefix, "--json"], cli_env).stdout)
    assert report["dtype"] == "int32" and report["documents"] == 100 and "tokenizer" not in report


def test_tokenizer_train_then_json2bin_and_sample_corpus(tmp_path, cli_env):
    first = prep(["sample-corpus", "-o", tmp_path / "raw", "--docs", "200", "--seed", "7"], cli_env)
    assert first.returncode == 0, first.stderr
    paths = first.stdout.decode().split()
    assert paths == [str(tmp_path / "raw" / "stories.jsonl"), str(tmp_path / "raw" / "arith.jsonl")]
    again = prep(["sample-corpus", "-o", tmp_path / "raw2", "--docs", "200", "--seed", "7"], cli_env)
    assert (tmp_path / "raw2" / "stories.jsonl").read_bytes() == (
        tmp_path / "raw" / "stories.jsonl"
    ).read_bytes()
    assert again.returncode == 0
    tok = tmp_path / "tok.json"
    trained = prep(["tokenizer", "train", *paths, "--vocab-size", "400", "-o", tok, "--json"], cli_env)
    assert trained.returncode == 0, trained.stderr
    assert json.loads(trained.stdout)["eod_id"] == 0
    made = prep(["json2bin", *paths, "-t", tok, "-o", tmp_path / "d", "--append-eod", "-q"], cli_env)
    assert made.returncode == 0, made.stderr
    report = json.loads(prep(["inspect", tmp_path / "d_text_document", "--json"], cli_env).stdout)
    assert report["documents"] == 400 and report["tokenizer"]["vocab_size"] == 400


def test_killed_run_leaves_nothing_that_looks_complete(tmp_path, cli_env):
    """SIGKILL in the middle (stdin still open, so the run cannot have finished): no .bin/.idx/.json."""
    import signal
    import time

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmtools.cli.prep",
            "json2bin",
            "-",
            "-t",
            "byte",
            "-o",
            str(tmp_path / "k"),
            "--workers",
            "2",
            "-q",
        ],
        env=cli_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdin.write(b'{"text": "some document text"}\n' * 200_000)
    proc.stdin.flush()
    deadline = time.time() + 120
    while time.time() < deadline and not any(
        p.name.startswith("k_text_document.bin.tmp-") for p in tmp_path.iterdir()
    ):
        time.sleep(0.05)
    time.sleep(0.3)
    psutil = pytest.importorskip("psutil")
    workers = psutil.Process(proc.pid).children()
    assert len(workers) == 2
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive  # the workers notice their parent is gone and exit; no orphans
    names = [p.name for p in tmp_path.iterdir()]
    assert any(".tmp-" in n for n in names)  # it was writing...
    assert not [n for n in names if n.endswith((".bin", ".idx", ".json"))]  # ...but nothing looks finished
    # a forced re-run clears the killed run's temporaries and finishes
    rerun = prep(
        ["json2bin", "-", "-t", "byte", "-o", tmp_path / "k", "--force", "-q"],
        cli_env,
        stdin=b'{"text": "a"}\n',
    )
    assert rerun.returncode == 0, rerun.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"k_text_document{s}" for s in (".bin", ".idx", ".json")
    ]
