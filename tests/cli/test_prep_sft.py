"""`llm-prep sft`: the real command, its outputs, and every bad-input case (exit 2, file:line, no output)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import run_cli_inproc, shared

GOOD = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}


def prep(capsys, monkeypatch, *args):
    """`llm-prep` in this process (argument parsing and error mapping included): fast."""
    return run_cli_inproc(capsys, monkeypatch, "prep", *args)


def _jsonl(path, lines):
    path.write_text(
        "".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines), encoding="utf-8"
    )
    return path


def test_real_command_writes_aligned_datasets(python, cli_env, tmp_path):
    src = _jsonl(tmp_path / "chat.jsonl", [GOOD] * 3)
    out = tmp_path / "d" / "chat"
    proc = subprocess.run(
        [python, "-m", "llmtools.cli.prep", "sft", str(src), "-t", "byte", "--chat-template", "chatml",
         "-o", str(out), "--max-length", "160", "--pack"],
        capture_output=True, text=True, env=cli_env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    paths = proc.stdout.split()
    assert len(paths) == 9 and all((tmp_path / "d" / p.rsplit("/", 1)[1]).exists() for p in paths)
    assert "3 samples in 2 sequences" in proc.stderr


def test_json_summary_and_refuses_to_overwrite(capsys, monkeypatch, tmp_path):
    src = _jsonl(tmp_path / "chat.jsonl", [GOOD, GOOD])
    args = ("sft", src, "-t", "byte", "--chat-template", "llama3", "-o", tmp_path / "o", "--json", "-q")
    proc = prep(capsys, monkeypatch, *args)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["samples"] == 2 and summary["skipped"] == {} and len(summary["paths"]) == 6
    proc = prep(capsys, monkeypatch, *args)
    assert proc.returncode == 2 and "already exists (use --force" in proc.stderr
    assert prep(capsys, monkeypatch, *args, "--force").returncode == 0


def test_help_has_examples(capsys, monkeypatch):
    proc = prep(capsys, monkeypatch, "sft", "--help")
    assert proc.returncode == 0 and "Examples:" in proc.stdout and "llm-prep sft" in proc.stdout


# (kind, format, extra flags, bad line, what the message must say)
BAD_CASES = [
    (
        "unknown_role",
        "messages",
        [],
        {"messages": [{"role": "robot", "content": "x"}, GOOD["messages"][1]]},
        "messages[0]: unknown role 'robot'",
    ),
    (
        "empty_assistant",
        "messages",
        [],
        {"messages": [GOOD["messages"][0], {"role": "assistant", "content": "  "}]},
        "assistant turn 1 is empty",
    ),
    ("no_assistant", "messages", [], {"messages": [GOOD["messages"][0]]}, "no assistant turn"),
    ("missing_key", "messages", [], {"conversation": []}, "missing key 'messages'"),
    ("missing_key", "messages", [], {"messages": [{"role": "user"}]}, "messages[0]: missing key 'content'"),
    ("missing_key", "prompt-response", [], {"prompt": "q"}, "missing key 'response'"),
    (
        "missing_key",
        "prompt-response",
        ["--prompt-key", "question"],
        {"prompt": "q", "response": "a"},
        "missing key 'question'",
    ),
    ("missing_key", "alpaca", [], {"instruction": "do", "input": "x"}, "missing key 'output'"),
    (
        "not_a_string",
        "messages",
        [],
        {"messages": [{"role": "user", "content": None}]},
        "expected a string, got null",
    ),
    (
        "not_a_string",
        "alpaca",
        [],
        {"instruction": "do", "input": 3, "output": "ok"},
        "[input]: expected a string",
    ),
    ("bad_messages", "messages", [], {"messages": "hello"}, "expected a list of messages"),
    ("bad_messages", "messages", [], {"messages": ["hello"]}, "messages[0]: expected an object"),
    ("not_an_object", "messages", [], [1, 2], "expected a JSON object, got list"),
    ("malformed_json", "messages", [], '{"messages": [', "malformed JSON"),
    ("template_error", "messages", ["--chat-template", "TEMPLATE"], GOOD, "no system turn allowed"),
]


@pytest.mark.parametrize("case", range(len(BAD_CASES)), ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CASES)])
def test_every_bad_input_names_file_and_line_or_is_skipped(capsys, monkeypatch, tmp_path, case):
    kind, fmt, flags, bad, message = BAD_CASES[case]
    template = tmp_path / "strict.jinja"
    template.write_text(
        "{% for m in messages %}{% if m['role'] == 'system' or loop.index0 > 0 and m['content'] == 'Hello!' %}"
        "{{ raise_exception('no system turn allowed') }}{% endif %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    )
    flags = [str(template) if f == "TEMPLATE" else f for f in flags]
    if "--chat-template" not in flags:
        flags += ["--chat-template", "chatml"]
    good = (
        {"messages": GOOD["messages"]}
        if fmt == "messages"
        else (
            {"prompt": "q", "response": "a", "question": "q"}
            if fmt == "prompt-response"
            else {"instruction": "do", "output": "ok"}
        )
    )
    src = _jsonl(tmp_path / "in.jsonl", [good, good, bad, good])
    out = tmp_path / "out" / "x"
    args = ("sft", src, "-t", "byte", "-o", out, "--format", fmt, *flags)
    if kind == "template_error":  # the template fails on the *good* sample's assistant turn: every line fails
        proc = prep(capsys, monkeypatch, *args)
        assert proc.returncode == 2 and f"{src}:1: chat template" in proc.stderr and message in proc.stderr
        assert (
            "Traceback" not in proc.stderr
            and not (tmp_path / "out").exists()
            or not list((tmp_path / "out").iterdir())
        )
        return
    proc = prep(capsys, monkeypatch, *args)
    assert proc.returncode == 2, proc.stderr
    assert f"{src}:3: " in proc.stderr and message in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr and proc.stdout == ""
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())  # nothing half-written

    proc = prep(capsys, monkeypatch, *args, "--skip-bad", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["samples"] == 3 and summary["skipped"] == {kind: 1}
    sidecar = json.loads((tmp_path / "out" / "x_input_ids_document.json").read_text())
    assert sidecar["counts"]["skipped"] == {kind: 1} and sidecar["sft"]["counts"]["samples"] == 3


def test_invalid_utf8_and_blank_lines(capsys, monkeypatch, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(
        json.dumps(GOOD).encode() + b"\n\n" + b'{"messages": "\xff"}\n' + json.dumps(GOOD).encode() + b"\n"
    )
    args = ("sft", src, "-t", "byte", "--chat-template", "chatml", "-o", tmp_path / "x")
    proc = prep(capsys, monkeypatch, *args)
    assert proc.returncode == 2 and f"{src}:3: invalid UTF-8" in proc.stderr
    proc = prep(capsys, monkeypatch, *args, "--skip-bad", "--json")
    assert json.loads(proc.stdout)["skipped"] == {"invalid_utf8": 1, "blank_line": 1}


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--pack"], "--pack: needs --max-length"),
        (["--format", "sharegpt"], "--format: unknown format"),
        (["--overflow", "wrap"], "--overflow: unknown policy"),
        (["--chat-template", "nope"], "--chat-template: nope: no such file and not a built-in"),
        ([], "--chat-template: tokenizer byte has no folder"),
    ],
)
def test_usage_errors_exit_2(capsys, monkeypatch, tmp_path, flags, message):
    src = _jsonl(tmp_path / "in.jsonl", [GOOD])
    proc = prep(capsys, monkeypatch, "sft", src, "-t", "byte", "-o", tmp_path / "x", *flags)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_missing_input_and_template_syntax_error(capsys, monkeypatch, tmp_path):
    proc = prep(capsys, monkeypatch, "sft", tmp_path / "nope.jsonl", "-t", "byte", "--chat-template", "chatml",
                "-o", tmp_path / "x")  # fmt: skip
    assert proc.returncode == 2 and "nope.jsonl: no such file" in proc.stderr
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% if %}")
    src = _jsonl(tmp_path / "in.jsonl", [GOOD])
    proc = prep(capsys, monkeypatch, "sft", src, "-t", "byte", "--chat-template", bad, "-o", tmp_path / "x")
    assert proc.returncode == 2 and "syntax error" in proc.stderr


def test_tokenizer_own_template_from_hf_folder(capsys, monkeypatch, tmp_path):
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(shared("tokenizers/gpt2/tokenizer.json").read_bytes())
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
        "chat_template": "{{ bos_token }}{% for m in messages %}### {{ m['role'] }}\n{{ m['content'] }}\n{% endfor %}",
    }))  # fmt: skip
    src = _jsonl(tmp_path / "in.jsonl", [GOOD])
    proc = prep(
        capsys, monkeypatch, "sft", src, "-t", folder / "tokenizer.json", "-o", tmp_path / "x", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    from llmtools.formats.indexed import IndexedDatasetReader
    from llmtools.tokenize import load_tokenizer

    ids = IndexedDatasetReader(tmp_path / "x_input_ids_document").document(0)
    mask = IndexedDatasetReader(tmp_path / "x_loss_mask_document").document(0)
    tok = load_tokenizer(str(folder / "tokenizer.json"))
    assert tok.decode(ids) == "<|endoftext|>### user\nHi\n### assistant\nHello!\n"
    assert tok.decode(ids[mask == 1]) == "Hello!\n"
    sidecar = json.loads((tmp_path / "x_loss_mask_document.json").read_text())
    assert sidecar["sft"]["chat_template"]["source"].endswith("tokenizer_config.json")
