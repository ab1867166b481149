"""Hostile cases of our own making: a hypothesis generator per command builds argument vectors and mutates
input files (numbers at the extremes, odd bytes in paths and text, symlinks, truncations, duplicates,
contradictions between files) and runs the real console scripts, asserting the contract:

* the exit status is 0, 1 or 2; no traceback anywhere, no "internal error";
* a failure ends with one ``llm-<command>: error:`` line;
* it ends within a bound (the subprocess timeout);
* nothing is left behind (no temporaries) and the inputs are untouched.

Fast by default (``make test``: a few examples per command, derandomized: the same cases every run).
``LLMTOOLS_FUZZ_EXAMPLES=N`` (and ``LLMTOOLS_FUZZ_SEED``: random cases instead of the fixed ones) runs a
deeper search; docs/trust-inputs.md records what it tried and found.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.contract.conftest import contract_env, script

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EXAMPLES = int(os.environ.get("LLMTOOLS_FUZZ_EXAMPLES", "4"))
SEED = os.environ.get("LLMTOOLS_FUZZ_SEED")
TIMEOUT = 120  # seconds: a command still running after this is a hang (a loaded CI machine included)
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=SEED is None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)

# -- what the generator draws from ----------------------------------------------------------------------
NUMBERS = st.sampled_from(
    ["0", "-1", "1", "0.5", "1e308", "-1e308", "1e999", "nan", "inf", "-inf", "1e-320", "9" * 20, "9" * 400,
     "2147483648", "18446744073709551616", "1_000", "0x10", "", " ", "1,2", "1.5B", "1e3"]
)  # fmt: skip
JSON_NUMBERS = st.sampled_from(
    [0, -1, 1, 2**31, 2**63, 2**64, 10**400, 1e308, -1e308, 0.5, True, None, "1", [], {}]
)
ODD_NAMES = st.sampled_from([b"in.jsonl", b"in\xff.jsonl", b"\xe9t\xe9.jsonl", b"-dash.jsonl", b" sp ace.jsonl",
                             b"new\nline.jsonl", b"a" * 200 + b".jsonl"])  # fmt: skip
GOOD_LINES = [json.dumps({"text": f"document {i}: " + "word " * (i % 7)}).encode() + b"\n" for i in range(30)]


@st.composite
def mutated(draw, lines: list[bytes]) -> bytes:
    """``lines``, then a few mutations: truncate, flip or insert odd bytes, duplicate, drop, swap."""
    data = bytearray(b"".join(lines))
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["truncate", "flip", "insert", "duplicate", "nul", "bom", "none"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "truncate":
            del data[at:]
        elif kind == "flip" and data:
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "insert":
            data[at:at] = draw(st.sampled_from([b"\xff\xfe", b"\x00", b"\ud800", b'"\\ud800"', b"NaN", b"[" * 50,
                                                b"1" * 400, b"\n\n", b"\r"]))  # fmt: skip
        elif kind == "duplicate":
            data += data[at:]
        elif kind == "nul":
            data[at:at] = b"\x00" * 8
        elif kind == "bom":
            data[0:0] = b"\xef\xbb\xbf"
    return bytes(data)


def _digests(root: Path) -> dict[str, str]:
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder, name)
            out[os.fsdecode(path.relative_to(root))] = (
                "link" if path.is_symlink() else hashlib.sha256(path.read_bytes()).hexdigest()
            )
    return out


def run(prog: str, args: list, cwd: Path, inputs: Path, stdin: bytes = b""):
    """Run and assert the contract; the inputs (everything under ``inputs``) must be unchanged."""
    before = _digests(inputs)
    argv = [script(prog), *(a if isinstance(a, bytes) else str(a) for a in args)]
    try:
        proc = subprocess.run(
            argv, cwd=cwd, input=stdin, capture_output=True, timeout=TIMEOUT, env=contract_env()
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{prog} {args!r}: still running after {TIMEOUT} s")
    err = proc.stderr.decode("utf-8", "replace")
    shown = f"{prog} {args!r} -> exit {proc.returncode}\n{err[-3000:]}"
    assert proc.returncode in (0, 1, 2), shown
    assert "Traceback" not in err and b"Traceback" not in proc.stdout, shown
    assert "internal error" not in err, shown
    if proc.returncode:
        last = [line for line in err.splitlines() if line.strip()][-1]
        assert last.startswith(f"{prog}: error: "), shown
    left = [str(p) for p in cwd.rglob("*") if ".tmp-" in p.name or p.name.endswith(".lock")]
    assert left == [], f"{shown}\nleft behind: {left}"
    assert _digests(inputs) == before, f"{shown}\nthe inputs changed"
    return proc


def _fresh(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("gen")
    (root / "in").mkdir()
    (root / "out").mkdir()
    return root / "in", root / "out"


def _dataset(prefix: Path, dtype=np.uint16, docs=((1, 2, 3) * 10, (4, 5) * 20, ())) -> None:
    from llmtools.formats.indexed import IndexedDatasetWriter

    with IndexedDatasetWriter(prefix, dtype, durable=False) as writer:
        for doc in docs:
            writer.add_document(np.array(doc, dtype=dtype))


# -- llm-prep json2bin / sft ----------------------------------------------------------------------------
@FUZZ
@given(name=ODD_NAMES, data=mutated(GOOD_LINES), link=st.booleans(), workers=st.sampled_from(["1", "2"]),
       extra=st.lists(st.sampled_from([["--append-eod"], ["--skip-bad"], ["--json-keys", "text", "x"],
                                       ["--shard", "0/2"], ["--partitions", "2"]]), max_size=2))  # fmt: skip
def test_json2bin(tmp_path_factory, name, data, link, workers, extra):
    inputs, out = _fresh(tmp_path_factory)
    path = os.path.join(os.fsencode(inputs), name)
    with open(path, "wb") as handle:
        handle.write(data)
    given_path = path
    if link:
        given_path = os.path.join(os.fsencode(inputs), b"link-" + name)
        os.symlink(path, given_path)
    args = ["json2bin", given_path, "-t", "byte", "-o", out / "x", "--workers", workers, "-q"]
    run("llm-prep", args + [a for group in extra for a in group], out, inputs)


@FUZZ
@given(data=mutated([json.dumps({"messages": [{"role": "user", "content": f"q{i}"},
                                                {"role": "assistant", "content": f"a{i}"}] * (i % 3 + 1)}).encode()
                     + b"\n" for i in range(12)]),
       extra=st.lists(st.sampled_from([["--skip-bad"], ["--max-length", "8"], ["--pack", "--max-length", "16"],
                                       ["--max-length", "9" * 30]]), max_size=2))  # fmt: skip
def test_sft(tmp_path_factory, data, extra):
    inputs, out = _fresh(tmp_path_factory)
    (inputs / "chat.jsonl").write_bytes(data)
    args = ["sft", inputs / "chat.jsonl", "-t", "byte", "--chat-template", "chatml", "-o", out / "s", "-q"]
    run("llm-prep", args + [a for group in extra for a in group], out, inputs)


# -- llm-mix -------------------------------------------------------------------------------------------
@FUZZ
@given(weights=st.lists(NUMBERS, min_size=1, max_size=3), samples=NUMBERS, seq=NUMBERS,
       stage=st.booleans(), twin=st.booleans())  # fmt: skip
def test_mix(tmp_path_factory, weights, samples, seq, stage, twin):
    inputs, out = _fresh(tmp_path_factory)
    _dataset(inputs / "a")
    _dataset(inputs / "b", docs=((7, 8, 9) * 12,) if not twin else ((1, 2, 3) * 10, (4, 5) * 20, ()))
    blend = ["--stage", "end", *weights] if stage else ["--weights", ",".join(weights)]
    args = [
        inputs / "a",
        inputs / "b",
        *blend,
        "--num-samples",
        samples,
        "--seq-length",
        seq,
        "-o",
        out / "m.json",
    ]
    proc = run("llm-mix", args, out, inputs)
    if proc.returncode == 0:  # strict JSON: no NaN or Infinity in what we wrote
        json.loads((out / "m.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in mix.json"))


# -- llm-export hf ---------------------------------------------------------------------------------------
@FUZZ
@given(seq=NUMBERS, packed=st.booleans(), dtype=st.sampled_from(["uint16", "int32"]))
def test_export(tmp_path_factory, seq, packed, dtype):
    inputs, out = _fresh(tmp_path_factory)
    _dataset(inputs / "a", np.dtype(dtype))
    args = ["hf", inputs / "a", "-o", out / "hf"] + (["--packed", "--seq-length", seq] if packed else [])
    run("llm-export", args, out, inputs)


# -- llm-log ---------------------------------------------------------------------------------------------
@FUZZ
@given(values=st.lists(JSON_NUMBERS, min_size=1, max_size=6), junk=mutated([b'{"step": 9, "loss": 1.0}\n']),
       command=st.sampled_from([["summary"], ["summary", "--json"]]))  # fmt: skip
def test_log(tmp_path_factory, values, junk, command):
    inputs, out = _fresh(tmp_path_factory)
    text = b"".join(
        json.dumps({"step": i, "loss": v, "lr": v}).encode() + b"\n" for i, v in enumerate(values)
    )
    (inputs / "metrics.jsonl").write_bytes(text + junk)
    run("llm-log", [*command, inputs / "metrics.jsonl"], out, inputs)


# -- llm-ckpt import-hf (a model config as untrusted input) ---------------------------------------------
FIELDS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "head_dim", "rope_theta", "rms_norm_eps", "max_position_embeddings"]  # fmt: skip


@FUZZ
@given(changes=st.dictionaries(st.sampled_from(FIELDS), JSON_NUMBERS, max_size=3))
def test_import_hf_config(tmp_path_factory, changes):
    inputs, out = _fresh(tmp_path_factory)
    config = {"model_type": "llama", "vocab_size": 256, "hidden_size": 8, "intermediate_size": 16,
              "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1} | changes  # fmt: skip
    (inputs / "config.json").write_text(json.dumps(config))
    (inputs / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    run("llm-ckpt", ["import-hf", inputs, "-o", out / "ckpt"], out, inputs)
