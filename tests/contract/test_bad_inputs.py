"""The contract on bad input, through the installed console scripts as real processes.

One row per bad input, over all six commands. Every row asserts what the README promises:

* the exit code (2 for bad input or usage, 1 for a runtime failure such as an unusable output path);
* exactly one line on stderr, starting ``llm-<command>:`` and naming the file and the place
  (line, byte, key, flag) — the row's pattern;
* no traceback anywhere, and no abort (an in-process call could not see exit 134 at interpreter exit);
* nothing left behind and nothing changed: the row's folder (its inputs and any earlier outputs) has the
  same files with the same checksums afterwards; the shared world is checked once at the end.

Rows run in parallel in a small thread pool (each is its own process), once per session; each row is then
its own test, so a failure names the row.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.contract.conftest import REPO, World, changes, error_line, run_cli, tree_state

DS = REPO / "configs" / "deepspeed"


@dataclass
class Row:
    name: str
    argv: list[str]  # "{d}": the row's folder (also the cwd); "{w.FIELD}": the shared world
    code: int
    where: str  # a regular expression the one stderr line must match (file and place)
    files: dict[str, bytes | str | Callable] = field(default_factory=dict)  # created in the row's folder
    stdin: bytes | None = None
    setup: Callable[[Path, World], None] | None = None
    timeout: float = 240

    @property
    def prog(self) -> str:
        return self.argv[0]


# -- input makers ----------------------------------------------------------------------------------
def lines(*items) -> bytes:
    return b"".join((i if isinstance(i, bytes) else json.dumps(i).encode()) + b"\n" for i in items)


GOOD = {"text": "a good line"}
DEEP = b"[" * 100_000 + b"]" * 100_000
DEEP_VALUE = b'{"text": "a", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}\n"


def text_corpus(n: int) -> bytes:
    return b"".join(
        json.dumps({"text": f"line {i} " + "word " * (i % 13)}).encode() + b"\n" for i in range(n)
    )


def gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def zst(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor().compress(data)


BIG = text_corpus(20_000)  # ~400 KB: compressed files long enough to cut
TRUNCATED_GZ = gz(BIG)[: len(gz(BIG)) // 2]
CORRUPT_GZ = gz(BIG)[:20] + bytes(range(256)) * 8 + gz(BIG)[2068:]
TRUNCATED_ZST = zst(BIG)[: len(zst(BIG)) // 2]
CORRUPT_ZST = zst(BIG)[:4] + b"\xff" * 64


def copy_prefix(dest: str) -> Callable[[Path, World], None]:
    """Copy the world's byte-tokenized dataset to the row's folder as ``dest`` (a prefix), with its sidecar."""

    def setup(d: Path, w: World) -> None:
        for suffix in (".bin", ".idx", ".json"):
            shutil.copy(f"{w.prefix}{suffix}", d / f"{dest}{suffix}")

    return setup


def copy_world_prefix(names, d: Path, w: World) -> None:
    """Copies of the world's byte-tokenized dataset in ``d``, one per name (distinct inputs of one kind)."""
    for name in names:
        copy_prefix(name)(d, w)


def damaged_prefix(dest: str, damage: Callable[[Path], None]) -> Callable[[Path, World], None]:
    def setup(d: Path, w: World) -> None:
        copy_prefix(dest)(d, w)
        damage(d / dest)

    return setup


def truncate(suffix: str, keep: int):
    def damage(prefix: Path) -> None:
        path = Path(f"{prefix}{suffix}")
        data = path.read_bytes()
        path.write_bytes(data[:keep] if keep >= 0 else data[:keep])

    return damage


def overwrite(suffix: str, offset: int, data: bytes):
    def damage(prefix: Path) -> None:
        path = Path(f"{prefix}{suffix}")
        raw = bytearray(path.read_bytes())
        raw[offset : offset + len(data)] = data
        path.write_bytes(bytes(raw))

    return damage


def sidecar(text: bytes):
    def damage(prefix: Path) -> None:
        Path(f"{prefix}.json").write_bytes(text)

    return damage


def copy_tree(source_field: str, dest: str, edit: Callable[[Path], None] | None = None):
    def setup(d: Path, w: World) -> None:
        shutil.copytree(getattr(w, source_field), d / dest, symlinks=True)
        if edit is not None:
            edit(d / dest)

    return setup


def copy_mix(edit: Callable[[dict], None] | None = None, raw: bytes | None = None):
    def setup(d: Path, w: World) -> None:
        shutil.copytree(w.mix.parent, d / "mix")
        if raw is not None:
            (d / "mix" / "mix.json").write_bytes(raw)
        elif edit is not None:
            data = json.loads((d / "mix" / "mix.json").read_text())
            edit(data)
            (d / "mix" / "mix.json").write_text(json.dumps(data))

    return setup


def flip_byte(relative: str):
    def edit(folder: Path) -> None:
        path = folder / relative
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        path.write_bytes(bytes(raw))

    return edit


def write_file(relative: str, data: bytes):
    def edit(folder: Path) -> None:
        (folder / relative).write_bytes(data)

    return edit


def ds_config(**changes_) -> bytes:
    data = json.loads((DS / "zero1.json").read_text())
    for dotted, value in changes_.items():
        node = data
        *parents, key = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[key] = value
    return json.dumps(data).encode()


def template_file(text: str) -> bytes:
    return text.encode()


def sft_args(template: str, *extra: str) -> list[str]:
    return ["llm-prep", "sft", "in.jsonl", "-t", "byte", "--chat-template", template, "-o", "out/s", *extra]


CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
PAIR = {"prompt": "hi", "chosen": "hello", "rejected": "go away"}


def pref_args(template: str, *extra: str) -> list[str]:
    return ["llm-prep", "pref", "in.jsonl", "-t", "byte", "--chat-template", template, "-o", "out/p", *extra]


J2B = ["llm-prep", "json2bin", "in.jsonl", "-t", "{w.gpt2}", "-o", "out/x"]
TRAIN = ["llm-train", "{w.tiny_yaml}", "--deepspeed", str(DS / "zero1.json"), "--dry-run"]
TRAIN_WITH = ["llm-train", "{w.tiny_yaml}", "--deepspeed", "ds.json", "--dry-run"]
MIX = ["llm-mix", "{w.prefix}", "--seq-length", "16", "--num-samples", "32", "-o", "out/mix.json"]

ROWS: list[Row] = [
    # ---- llm-prep json2bin, default backend (gigatoken with a tokenizer.json): each used to abort, exit 134
    Row(
        "j2b-truncated-line",
        J2B,
        2,
        r"in\.jsonl:2: truncated last line",
        {"in.jsonl": lines(GOOD) + b'{"text": "cut'},
    ),
    Row(
        "j2b-malformed-json",
        J2B,
        2,
        r"in\.jsonl:2: malformed JSON",
        {"in.jsonl": lines(GOOD, b'{"text": ', GOOD)},
    ),
    Row(
        "j2b-invalid-utf8",
        J2B,
        2,
        r"in\.jsonl:1: invalid UTF-8 \(byte 0xff",
        {"in.jsonl": b'{"text": "a\xff"}\n'},
    ),
    Row(
        "j2b-bom",
        J2B,
        2,
        r"in\.jsonl:1: malformed JSON: Unexpected UTF-8 BOM",
        {"in.jsonl": b"\xef\xbb\xbf" + lines(GOOD)},
    ),
    Row(
        "j2b-nul-in-string",
        J2B,
        2,
        r"in\.jsonl:1: malformed JSON: Invalid control character",
        {"in.jsonl": b'{"text": "a\x00b"}\n'},
    ),
    Row(
        "j2b-nul-bytes-line",
        J2B,
        2,
        r"in\.jsonl:2: malformed JSON",
        {"in.jsonl": lines(GOOD) + b"\x00" * 64 + b"\n"},
    ),
    Row(
        "j2b-missing-key",
        J2B,
        2,
        r"in\.jsonl:2: missing key 'text'",
        {"in.jsonl": lines(GOOD, {"body": "x"})},
    ),
    Row("j2b-wrong-type-int", J2B, 2, r"in\.jsonl:1: key 'text' is int", {"in.jsonl": lines({"text": 5})}),
    Row(
        "j2b-wrong-type-null", J2B, 2, r"in\.jsonl:1: key 'text' is null", {"in.jsonl": lines({"text": None})}
    ),
    Row(
        "j2b-wrong-type-list",
        J2B,
        2,
        r"in\.jsonl:1: key 'text' is list",
        {"in.jsonl": lines({"text": ["a"]})},
    ),
    Row("j2b-wrong-type-nan", J2B, 2, r"in\.jsonl:1: key 'text' is float", {"in.jsonl": b'{"text": NaN}\n'}),
    Row(
        "j2b-not-an-object",
        J2B,
        2,
        r"in\.jsonl:1: expected a JSON object, found list",
        {"in.jsonl": b"[1, 2]\n"},
    ),
    Row("j2b-empty-file", J2B, 2, r"in\.jsonl: empty file", {"in.jsonl": b""}),
    Row(
        "j2b-cut-off-stdin",
        ["llm-prep", "json2bin", "-", "-t", "{w.gpt2}", "-o", "out/x"],
        2,
        r"<stdin>:3: truncated last line",
        stdin=lines(GOOD, GOOD) + b'{"te',
    ),
    Row(
        "j2b-lone-surrogate",
        J2B,
        2,
        r"in\.jsonl:1: key 'text' holds a lone surrogate",
        {"in.jsonl": b'{"text": "\\ud800"}\n'},
    ),
    Row(
        "j2b-corrupt-gz",
        ["llm-prep", "json2bin", "in.jsonl.gz", "-t", "{w.gpt2}", "-o", "out/x"],
        2,
        r"in\.jsonl\.gz:\d+: corrupt compressed data",
        {"in.jsonl.gz": CORRUPT_GZ},
    ),
    Row(
        "j2b-truncated-gz",
        ["llm-prep", "json2bin", "in.jsonl.gz", "-t", "{w.gpt2}", "-o", "out/x"],
        2,
        r"in\.jsonl\.gz:\d+: compressed stream ends early",
        {"in.jsonl.gz": TRUNCATED_GZ},
    ),
    Row(
        "j2b-truncated-zst",
        ["llm-prep", "json2bin", "in.jsonl.zst", "-t", "{w.gpt2}", "-o", "out/x"],
        2,
        r"in\.jsonl\.zst:\d+: compressed stream ends early",
        {"in.jsonl.zst": TRUNCATED_ZST},
    ),
    Row(
        "j2b-corrupt-zst",
        ["llm-prep", "json2bin", "in.jsonl.zst", "-t", "{w.gpt2}", "-o", "out/x"],
        2,
        r"in\.jsonl\.zst:1: corrupt compressed data",
        {"in.jsonl.zst": CORRUPT_ZST},
    ),
    Row(
        "j2b-deeply-nested",
        J2B,
        2,
        r"in\.jsonl:2: malformed JSON: nested too deeply",
        {"in.jsonl": lines(GOOD) + DEEP + b"\n"},
    ),
    Row(
        "j2b-deeply-nested-value",
        J2B,
        2,
        r"in\.jsonl:1: malformed JSON: nested too deeply",
        {"in.jsonl": DEEP_VALUE},
    ),
    Row(
        "j2b-bad-line-after-encodes-in-flight",
        J2B,
        2,
        r"in\.jsonl:20001: malformed JSON",
        {"in.jsonl": BIG + b"{oops\n"},
    ),
    Row(
        "j2b-tokenizers-backend",
        [*J2B, "--backend", "tokenizers"],
        2,
        r"in\.jsonl:2: truncated last line",
        {"in.jsonl": lines(GOOD) + b'{"text"'},
    ),
    Row(
        "j2b-byte-tokenizer",
        ["llm-prep", "json2bin", "in.jsonl", "-t", "byte", "-o", "out/x"],
        2,
        r"in\.jsonl:1: invalid UTF-8",
        {"in.jsonl": b'{"text": "\xc3"}\n'},
    ),
    Row(
        "j2b-worker-processes",
        [*J2B, "--backend", "tokenizers", "--workers", "2"],
        2,
        r"in\.jsonl:20001: malformed JSON",
        {"in.jsonl": BIG + b"{oops\n"},
    ),
    Row(
        "j2b-input-is-a-directory",
        ["llm-prep", "json2bin", "sub", "-t", "byte", "-o", "out/x"],
        2,
        r"sub: is a directory",
        {"sub/a.jsonl": lines(GOOD)},
    ),
    Row(
        "j2b-no-such-input",
        ["llm-prep", "json2bin", "missing.jsonl", "-t", "byte", "-o", "out/x"],
        2,
        r"missing\.jsonl: no such file",
    ),
    Row(
        "j2b-glob-matches-nothing",
        ["llm-prep", "json2bin", "none*.jsonl", "-t", "byte", "-o", "out/x"],
        2,
        r"none\*\.jsonl: no file matches",
    ),
    Row(
        "j2b-stdin-twice",
        ["llm-prep", "json2bin", "-", "-", "-t", "byte", "-o", "out/x"],
        2,
        r"-: stdin can be read only once",
    ),
    Row(
        "j2b-existing-output",
        J2B,
        2,
        r"out/x_text_document\.bin: already exists",
        {
            "in.jsonl": lines(GOOD),
            "out/x_text_document.bin": b"earlier output",
            "out/x_text_document.idx": b"idx",
        },
    ),
    Row(
        "j2b-duplicate-json-key",
        [*J2B, "--json-keys", "text,text"],
        2,
        r"--json-keys: duplicate key",
        {"in.jsonl": lines(GOOD)},
    ),
    Row(
        "j2b-workers-zero",
        [*J2B, "--workers", "0"],
        2,
        r"--workers: must be from 1",
        {"in.jsonl": lines(GOOD)},
    ),
    Row(
        "j2b-workers-absurd",
        [*J2B, "--workers", "100000"],
        2,
        r"--workers: must be from 1 to 1024",
        {"in.jsonl": lines(GOOD)},
    ),
    Row(
        "j2b-unknown-backend",
        [*J2B, "--backend", "fast"],
        2,
        r"--backend: unknown backend 'fast'",
        {"in.jsonl": lines(GOOD)},
    ),
    Row(
        "j2b-unknown-special-tokens",
        [*J2B, "--special-tokens", "odd"],
        2,
        r"--special-tokens",
        {"in.jsonl": lines(GOOD)},
    ),
    Row(
        "j2b-no-such-tokenizer",
        ["llm-prep", "json2bin", "in.jsonl", "-t", "nope.json", "-o", "out/x"],
        2,
        r"nope\.json: no such tokenizer",
        {"in.jsonl": lines(GOOD)},
    ),
    Row(
        "j2b-tokenizer-not-json",
        ["llm-prep", "json2bin", "in.jsonl", "-t", "tok.json", "-o", "out/x"],
        2,
        r"tok\.json: not a valid JSON tokenizer file",
        {"in.jsonl": lines(GOOD), "tok.json": b"{not json"},
    ),
    Row(
        "j2b-tokenizer-not-a-tokenizer",
        ["llm-prep", "json2bin", "in.jsonl", "-t", "tok.json", "-o", "out/x"],
        2,
        r"tok\.json: neither a Hugging Face tokenizer\.json",
        {"in.jsonl": lines(GOOD), "tok.json": b'{"a": "b"}'},
    ),
    Row(
        "j2b-tokenizer-deeply-nested",
        ["llm-prep", "json2bin", "in.jsonl", "-t", "tok.json", "-o", "out/x"],
        2,
        r"tok\.json: not a valid JSON tokenizer file .*nested too deeply",
        {"in.jsonl": lines(GOOD), "tok.json": DEEP},
    ),
    Row(
        "j2b-output-under-a-file",
        ["llm-prep", "json2bin", "in.jsonl", "-t", "byte", "-o", "afile/x"],
        1,
        r"afile.*: Not a directory",
        {"in.jsonl": lines(GOOD), "afile": b"a file, not a folder"},
    ),
    Row(
        "j2b-missing-tokenizer-option",
        ["llm-prep", "json2bin", "in.jsonl", "-o", "out/x"],
        2,
        r"give -t/--tokenizer",
        {"in.jsonl": lines(GOOD)},
    ),
    Row(
        "j2b-unknown-option",
        [*J2B, "--frobnicate"],
        2,
        r"No such option: --frobnicate",
        {"in.jsonl": lines(GOOD)},
    ),
    # ---- llm-prep tokenizer train
    Row(
        "tok-malformed-line",
        ["llm-prep", "tokenizer", "train", "in.jsonl", "--vocab-size", "300", "-o", "tok.json"],
        2,
        r"in\.jsonl:2: malformed JSON",
        {"in.jsonl": lines(GOOD, b"{x", GOOD)},
    ),
    Row(
        "tok-vocab-zero",
        ["llm-prep", "tokenizer", "train", "in.jsonl", "--vocab-size", "0", "-o", "tok.json"],
        2,
        r"--vocab-size",
        {"in.jsonl": lines(GOOD)},
    ),
    Row(
        "tok-vocab-absurd",
        ["llm-prep", "tokenizer", "train", "in.jsonl", "--vocab-size", "1000000000000", "-o", "tok.json"],
        2,
        r"--vocab-size",
        {"in.jsonl": lines(GOOD)},
    ),
    Row(
        "tok-existing-output",
        ["llm-prep", "tokenizer", "train", "in.jsonl", "--vocab-size", "300", "-o", "tok.json"],
        2,
        r"tok\.json: already exists",
        {"in.jsonl": lines(GOOD), "tok.json": b"{}"},
    ),
    Row(
        "tok-empty-file",
        ["llm-prep", "tokenizer", "train", "in.jsonl", "--vocab-size", "300", "-o", "tok.json"],
        2,
        r"in\.jsonl: empty file",
        {"in.jsonl": b""},
    ),
    # ---- llm-prep sft: records and bounded chat templates
    Row(
        "sft-malformed-json",
        sft_args("chatml"),
        2,
        r"in\.jsonl:2: malformed JSON",
        {"in.jsonl": lines(CHAT, b"{x", CHAT)},
    ),
    Row(
        "sft-unknown-role",
        sft_args("chatml"),
        2,
        r"in\.jsonl:1: messages\[0\]: unknown role 'wizard'",
        {
            "in.jsonl": lines(
                {"messages": [{"role": "wizard", "content": "x"}, {"role": "assistant", "content": "y"}]}
            )
        },
    ),
    Row(
        "sft-no-assistant",
        sft_args("chatml"),
        2,
        r"in\.jsonl:1: no assistant turn",
        {"in.jsonl": lines({"messages": [{"role": "user", "content": "x"}]})},
    ),
    Row(
        "sft-empty-assistant",
        sft_args("chatml"),
        2,
        r"in\.jsonl:1: assistant turn 1 is empty",
        {
            "in.jsonl": lines(
                {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": " "}]}
            )
        },
    ),
    Row(
        "sft-messages-not-a-list",
        sft_args("chatml"),
        2,
        r"in\.jsonl:1: \[messages\]: expected a list",
        {"in.jsonl": lines({"messages": "hello"})},
    ),
    Row(
        "sft-missing-content",
        sft_args("chatml"),
        2,
        r"in\.jsonl:1: messages\[1\]: missing key 'content'",
        {"in.jsonl": lines({"messages": [{"role": "user", "content": "x"}, {"role": "assistant"}]})},
    ),
    Row(
        "sft-lone-surrogate",
        sft_args("chatml"),
        2,
        r"in\.jsonl:1: \[messages\]\[1\]\[content\]: a lone surrogate escape",
        {
            "in.jsonl": b'{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "\\ud800"}]}\n'
        },
    ),
    Row(
        "sft-deeply-nested",
        sft_args("chatml"),
        2,
        r"in\.jsonl:2: malformed JSON: nested too deeply",
        {"in.jsonl": lines(CHAT) + DEEP + b"\n"},
    ),
    Row(
        "sft-template-string-bomb",
        sft_args("bomb.jinja"),
        2,
        r"in\.jsonl:1: chat template bomb\.jinja: a repeated sequence would be 10,000,000,000 long",
        {"in.jsonl": lines(CHAT), "bomb.jinja": template_file("{{ 'A' * 10000000000 }}")},
    ),
    Row(
        "sft-template-list-bomb",
        sft_args("bomb.jinja"),
        2,
        r"in\.jsonl:1: chat template bomb\.jinja: a repeated sequence",
        {"in.jsonl": lines(CHAT), "bomb.jinja": template_file("{{ messages * 10000000000 }}")},
    ),
    Row(
        "sft-template-power",
        sft_args("bomb.jinja"),
        2,
        r"in\.jsonl:1: chat template bomb\.jinja: a power with",
        {"in.jsonl": lines(CHAT), "bomb.jinja": template_file("{{ 9 ** 99999999 }}")},
    ),
    Row(
        "sft-template-endless-loop",
        sft_args("loop.jinja", "--template-timeout", "0.5"),
        2,
        r"in\.jsonl:1: chat template loop\.jinja: rendering took more than 0\.5 s",
        {
            "in.jsonl": lines(CHAT),
            "loop.jinja": template_file(
                "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
            ),
        },
    ),
    Row(
        "sft-template-recursive-macro",
        sft_args("rec.jinja"),
        2,
        r"in\.jsonl:1: chat template rec\.jinja: recursion too deep",
        {
            "in.jsonl": lines(CHAT),
            "rec.jinja": template_file("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
        },
    ),
    Row(
        "sft-template-doubling",
        sft_args("dbl.jinja"),
        2,
        r"in\.jsonl:1: chat template dbl\.jinja: a value would be",
        {
            "in.jsonl": lines(CHAT),
            "dbl.jinja": template_file(
                "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"
            ),
        },
    ),
    Row(
        "sft-template-huge-output",
        sft_args("out.jinja"),
        2,
        r"in\.jsonl:1: chat template out\.jinja: rendering exceeds",
        {
            "in.jsonl": lines(CHAT),
            "out.jinja": template_file("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}"),
        },
    ),
    Row(
        "sft-template-format-width",
        sft_args("fmt.jinja"),
        2,
        r"in\.jsonl:1: chat template fmt\.jinja: a formatted field",
        {"in.jsonl": lines(CHAT), "fmt.jinja": template_file("{{ '%10000000000d' % 1 }}")},
    ),
    Row(
        "sft-template-center",
        sft_args("c.jinja"),
        2,
        r"in\.jsonl:1: chat template c\.jinja: the centered text",
        {"in.jsonl": lines(CHAT), "c.jinja": template_file("{{ 'a'|center(10000000000) }}")},
    ),
    Row(
        "sft-template-raises",
        sft_args("r.jinja"),
        2,
        r"in\.jsonl:1: chat template r\.jinja: no system turn allowed",
        {
            "in.jsonl": lines(CHAT),
            "r.jinja": template_file("{{ raise_exception('no system turn allowed') }}"),
        },
    ),
    Row(
        "sft-template-syntax-error",
        sft_args("bad.jinja"),
        2,
        r"bad\.jinja:2: chat template syntax error",
        {"in.jsonl": lines(CHAT), "bad.jinja": template_file("{{ messages }}\n{% for %}")},
    ),
    Row(
        "sft-all-bad-skipped",
        sft_args("bomb.jinja", "--skip-bad"),
        2,
        r"in\.jsonl: no usable samples \(skipped: template_error 2\)",
        {"in.jsonl": lines(CHAT, CHAT), "bomb.jinja": template_file("{{ 'A' * 10000000000 }}")},
    ),
    Row(
        "sft-no-such-template",
        sft_args("missing.jinja"),
        2,
        r"--chat-template: missing\.jinja: no such file",
        {"in.jsonl": lines(CHAT)},
    ),
    Row(
        "sft-template-timeout-zero",
        sft_args("chatml", "--template-timeout", "0"),
        2,
        r"--template-timeout",
        {"in.jsonl": lines(CHAT)},
    ),
    Row(
        "sft-max-length-zero",
        sft_args("chatml", "--max-length", "0"),
        2,
        r"--max-length: must be at least 1",
        {"in.jsonl": lines(CHAT)},
    ),
    Row(
        "sft-pack-without-length",
        sft_args("chatml", "--pack"),
        2,
        r"--pack: needs --max-length",
        {"in.jsonl": lines(CHAT)},
    ),
    Row(
        "sft-existing-output",
        sft_args("chatml"),
        2,
        r"out/s_input_ids_document\.bin: already exists",
        {"in.jsonl": lines(CHAT), "out/s_input_ids_document.bin": b"earlier"},
    ),
    # ---- llm-prep pref: preference pairs, through the same bounded templates
    Row(
        "pref-malformed-json",
        pref_args("chatml"),
        2,
        r"in\.jsonl:2: malformed JSON",
        {"in.jsonl": lines(PAIR, b'{"prompt": "q", "chosen": "yes"', PAIR)},
    ),
    Row(
        "pref-missing-rejected",
        pref_args("chatml"),
        2,
        r"in\.jsonl:1: missing key 'rejected'",
        {"in.jsonl": lines({"prompt": "hi", "chosen": "hello"})},
    ),
    Row(
        "pref-string-and-messages",
        pref_args("chatml"),
        2,
        r"in\.jsonl:1: \[chosen\] and \[rejected\]: one is a string, the other a list of messages",
        {"in.jsonl": lines({**PAIR, "rejected": [{"role": "assistant", "content": "no"}]})},
    ),
    Row(
        "pref-unknown-role",
        pref_args("chatml"),
        2,
        r"in\.jsonl:1: chosen\[0\]: unknown role 'wizard'",
        {
            "in.jsonl": lines(
                {
                    "chosen": [{"role": "wizard", "content": "x"}, {"role": "assistant", "content": "a"}],
                    "rejected": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "b"}],
                }
            )
        },
    ),
    Row(
        "pref-deeply-nested",
        pref_args("chatml"),
        2,
        r"in\.jsonl:2: malformed JSON: nested too deeply",
        {"in.jsonl": lines(PAIR) + DEEP + b"\n"},
    ),
    Row(
        "pref-template-string-bomb",
        pref_args("bomb.jinja"),
        2,
        r"in\.jsonl:1: chat template bomb\.jinja: a repeated sequence would be 10,000,000,000 long",
        {"in.jsonl": lines(PAIR), "bomb.jinja": template_file("{{ 'A' * 10000000000 }}")},
    ),
    Row(
        "pref-template-endless-loop",
        pref_args("loop.jinja", "--template-timeout", "0.5"),
        2,
        r"in\.jsonl:1: chat template loop\.jinja: rendering took more than 0\.5 s",
        {
            "in.jsonl": lines(PAIR),
            "loop.jinja": template_file(
                "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
            ),
        },
    ),
    Row(
        "pref-lone-surrogate",
        pref_args("chatml"),
        2,
        r"in\.jsonl:2: \[chosen\]: a lone surrogate escape",
        {"in.jsonl": lines(PAIR) + b'{"prompt": "hi", "chosen": "a\\udc00", "rejected": "b"}\n'},
    ),
    Row(
        "pref-all-too-long",
        pref_args("chatml", "--max-length", "3", "--overflow", "drop"),
        2,
        r"in\.jsonl: no usable pairs \(dropped as too long 2\)",
        {"in.jsonl": lines(PAIR, PAIR)},
    ),
    Row(
        "pref-prompt-leaves-no-room",
        pref_args("chatml", "--max-length", "10", "--max-prompt-length", "10"),
        2,
        r"--max-prompt-length: 10 leaves no room for the response within --max-length 10",
        {"in.jsonl": lines(PAIR)},
    ),
    Row(
        "pref-same-key-twice",
        pref_args("chatml", "--chosen-key", "prompt"),
        2,
        r"--prompt-key, --chosen-key, --rejected-key: must be three different keys",
        {"in.jsonl": lines(PAIR)},
    ),
    Row(
        "pref-template-timeout-nan",
        pref_args("chatml", "--template-timeout", "nan"),
        2,
        r"--template-timeout",
        {"in.jsonl": lines(PAIR)},
    ),
    Row(
        "pref-existing-output",
        pref_args("chatml"),
        2,
        r"out/p_chosen_input_ids_document\.bin: already exists",
        {"in.jsonl": lines(PAIR), "out/p_chosen_input_ids_document.bin": b"earlier"},
    ),
    Row(
        "pref-one-side-of-an-earlier-output",
        pref_args("chatml"),
        2,
        r"out/p_rejected_loss_mask_document\.json: already exists",
        {"in.jsonl": lines(PAIR), "out/p_rejected_loss_mask_document.json": b"{}"},
    ),
    # ---- llm-prep merge, and json2bin's shards
    Row(
        "merge-missing-input",
        ["llm-prep", "merge", "{w.prefix}", "nope_text_document", "-o", "out/m"],
        2,
        r"nope_text_document\.idx: no such file",
    ),
    Row(
        "merge-truncated-bin",
        ["llm-prep", "merge", "{w.prefix}", "t", "-o", "out/m"],
        2,
        r"t\.bin@byte 100: \.bin is 100 bytes but the index describes \d+ bytes \(truncated\)",
        setup=damaged_prefix("t", truncate(".bin", 100)),
    ),
    Row(
        "merge-corrupt-index",
        ["llm-prep", "merge", "u", "{w.prefix}", "-o", "out/m"],
        2,
        r"u\.idx@byte \d+: sequence \d+ has negative length",
        setup=damaged_prefix("u", overwrite(".idx", 40, b"\xff" * 8)),
    ),
    Row(
        "merge-broken-sidecar",
        ["llm-prep", "merge", "s", "{w.prefix}", "-o", "out/m"],
        2,
        r"s\.json: not a valid sidecar JSON file",
        setup=damaged_prefix("s", sidecar(b'{"format": "x"')),
    ),
    Row(
        "merge-different-tokenizers",
        ["llm-prep", "merge", "{w.prefix}", "{w.prefix_gpt2}", "-o", "out/m"],
        2,
        r"tokenized with gpt2 .*datasets of different tokenizers cannot be merged",
    ),
    Row(
        "merge-output-is-an-input",
        ["llm-prep", "merge", "a", "{w.prefix}", "-o", "a", "--force"],
        2,
        r"a\.bin: refusing to write there: it is the input",
        setup=copy_prefix("a"),
    ),
    Row("merge-no-match", ["llm-prep", "merge", "zz*", "-o", "out/m"], 2, r"zz\*: no dataset matches"),
    Row(
        "merge-existing-output",
        ["llm-prep", "merge", "{w.prefix}", "-o", "out/m"],
        2,
        r"out/m\.bin: already exists",
        {"out/m.bin": b"earlier"},
    ),
    Row(
        "j2b-shard-outside",
        ["llm-prep", "json2bin", "in.jsonl", "-t", "byte", "-o", "out/x", "--shard", "3/2"],
        2,
        r"--shard: shard index 3 is outside 0\.\.1",
        {"in.jsonl": lines(GOOD)},
    ),
    Row(
        "j2b-shard-garbled",
        ["llm-prep", "json2bin", "in.jsonl", "-t", "byte", "-o", "out/x", "--shard", "-1/2"],
        2,
        r"--shard: expected I/N",
        {"in.jsonl": lines(GOOD)},
    ),
    # ---- llm-prep hf2bin
    Row(
        "hf2bin-corrupt-parquet",
        ["llm-prep", "hf2bin", "bad.parquet", "-o", "out/h"],
        2,
        r"bad\.parquet",
        {"bad.parquet": b"PAR1" + b"\x00" * 100 + b"PAR1"},
    ),
    Row(
        "hf2bin-truncated-parquet",
        ["llm-prep", "hf2bin", "pq/data", "-o", "out/h"],
        2,
        r"pq/data",
        setup=copy_tree("parquet", "pq", lambda f: [truncate("", 300)(p) for p in f.rglob("*.parquet")]),
    ),
    Row(
        "hf2bin-missing-column",
        ["llm-prep", "hf2bin", "{w.parquet}", "-o", "out/h", "--column", "body"],
        2,
        r"body",
    ),
    Row("hf2bin-no-such-source", ["llm-prep", "hf2bin", "nothing/here", "-o", "out/h"], 2, r"nothing/here"),
    Row(
        "hf2bin-existing-output",
        ["llm-prep", "hf2bin", "{w.hf}", "-o", "out/h"],
        2,
        r"out/h_input_ids_document\.bin: already exists",
        {"out/h_input_ids_document.bin": b"earlier"},
    ),
    # ---- llm-prep inspect / cat
    Row(
        "inspect-truncated-idx",
        ["llm-prep", "inspect", "x"],
        2,
        r"x\.idx@byte 0: file is 20 bytes",
        setup=damaged_prefix("x", truncate(".idx", 20)),
    ),
    Row(
        "inspect-bad-magic",
        ["llm-prep", "inspect", "x"],
        2,
        r"x\.idx@byte 0: bad magic",
        setup=damaged_prefix("x", overwrite(".idx", 0, b"NOTMMIDX!")),
    ),
    Row(
        "inspect-idx-size-mismatch",
        ["llm-prep", "inspect", "x"],
        2,
        r"x\.idx: size \d+ bytes does not match its header",
        setup=damaged_prefix("x", truncate(".idx", -8)),
    ),
    Row(
        "inspect-truncated-bin",
        ["llm-prep", "inspect", "x"],
        2,
        r"x\.bin@byte \d+: \.bin is \d+ bytes but the index",
        setup=damaged_prefix("x", truncate(".bin", 100)),
    ),
    Row(
        "inspect-missing-bin",
        ["llm-prep", "inspect", "x"],
        2,
        r"x\.bin: no such file",
        setup=damaged_prefix("x", lambda p: Path(f"{p}.bin").unlink()),
    ),
    Row(
        "inspect-bad-pointer",
        ["llm-prep", "inspect", "x"],
        2,
        r"x\.idx@byte \d+: pointer of sequence",
        setup=damaged_prefix(
            "x", overwrite(".idx", 34 + 4 * 300 + 8 * 5, b"\x01\x00\x00\x00\x00\x00\x00\x7f")
        ),
    ),
    Row("cat-bad-docs", ["llm-prep", "cat", "{w.prefix}", "--docs", "a:b"], 2, r"--docs"),
    # ---- llm-mix
    Row(
        "mix-no-such-prefix",
        ["llm-mix", "nothing", "--seq-length", "16", "--num-samples", "8", "-o", "out/mix.json"],
        2,
        r"nothing: no such dataset \(expected nothing\.bin and nothing\.idx\)",
    ),
    Row(
        "mix-weight-nan",
        [
            "llm-mix",
            "{w.prefix}",
            "--weights",
            "nan",
            "--seq-length",
            "16",
            "--num-samples",
            "8",
            "-o",
            "m.json",
        ],
        2,
        r"--weights: weight 1 is nan",
    ),
    Row(
        "mix-weight-inf",
        [
            "llm-mix",
            "{w.prefix}",
            "--weights",
            "inf",
            "--seq-length",
            "16",
            "--num-samples",
            "8",
            "-o",
            "m.json",
        ],
        2,
        r"--weights: weight 1 is inf",
    ),
    Row(
        "mix-weight-negative",
        [
            "llm-mix",
            "{w.prefix}",
            "--weights",
            "-1",
            "--seq-length",
            "16",
            "--num-samples",
            "8",
            "-o",
            "m.json",
        ],
        2,
        r"--weights: weight 1 is negative",
    ),
    Row(
        "mix-weight-count",
        [
            "llm-mix",
            "{w.prefix}",
            "--weights",
            "1,2",
            "--seq-length",
            "16",
            "--num-samples",
            "8",
            "-o",
            "m.json",
        ],
        2,
        r"--weights: 2 weight\(s\) for 1 source",
    ),
    Row(
        "mix-same-source-twice",
        [
            "llm-mix",
            "{w.prefix}",
            "{w.prefix_gpt2}",
            "{w.prefix}.bin",
            "--seq-length",
            "16",
            "--num-samples",
            "8",
            "-o",
            "m.json",
        ],
        2,
        r"text_document: the same dataset is named twice",
    ),
    Row(
        "mix-absurd-num-samples",
        ["llm-mix", "{w.prefix}", "--seq-length", "16", "--num-samples", "1000T", "-o", "m.json"],
        2,
        r"--num-samples: 1,000,000,000,000,000 samples need at least",
    ),
    Row(
        "mix-absurd-tokens",
        ["llm-mix", "{w.prefix}", "--seq-length", "16", "--tokens", "1000000T", "-o", "m.json"],
        2,
        r"--tokens: .*(samples need at least|beyond the largest count allowed)",
    ),
    Row(
        "mix-seq-length-zero",
        ["llm-mix", "{w.prefix}", "--seq-length", "0", "--num-samples", "8", "-o", "m.json"],
        2,
        r"--seq-length: must be a positive integer",
    ),
    Row(
        "mix-seq-length-text",
        ["llm-mix", "{w.prefix}", "--seq-length", "long", "--num-samples", "8", "-o", "m.json"],
        2,
        r"--seq-length: 'long' is not a positive integer",
    ),
    Row("mix-existing-output", MIX, 2, r"out/mix\.json: already exists", {"out/mix.json": b"{}"}),
    Row(
        "mix-truncated-idx",
        ["llm-mix", "x", "--seq-length", "16", "--num-samples", "8", "-o", "m.json"],
        2,
        r"x\.idx: size \d+ bytes does not match",
        setup=damaged_prefix("x", truncate(".idx", -16)),
    ),
    Row(
        "mix-mixed-tokenizers",
        [
            "llm-mix",
            "{w.prefix}",
            "{w.prefix_gpt2}",
            "--seq-length",
            "16",
            "--num-samples",
            "8",
            "-o",
            "m.json",
        ],
        2,
        r"tokenizer",
    ),
    Row(
        "mix-materialize-existing",
        [*MIX, "--materialize", "out/samples"],
        2,
        r"out/samples\.bin: already exists",
        {"out/samples.bin": b"earlier"},
    ),
    Row(
        "mix-max-epochs-nan",
        [*MIX, "--max-epochs", "nan"],
        2,
        r"--max-epochs must be a positive finite number",
    ),
    Row("mix-surplus-inf", [*MIX, "--surplus", "inf"], 2, r"--surplus must be a number in \[0, 10\)"),
    Row("mix-bad-split", [*MIX, "--split", "a,b"], 2, r"--split"),
    Row(
        "mix-data-path-mixture",
        [
            "llm-mix",
            "--data-path",
            "0.5",
            "{w.prefix}",
            "x",
            "{w.prefix}",
            "--seq-length",
            "16",
            "--num-samples",
            "8",
            "-o",
            "m.json",
        ],
        2,
        r"--data-path: expected 'WEIGHT PREFIX' pairs",
    ),
    Row(
        "mix-sidecar-malformed",
        ["llm-mix", "x", "--seq-length", "16", "--num-samples", "8", "-o", "m.json"],
        2,
        r"x\.json: not a valid sidecar JSON file",
        setup=damaged_prefix("x", sidecar(b"{oops")),
    ),
    Row(
        "mix-sidecar-deeply-nested",
        ["llm-mix", "x", "--seq-length", "16", "--num-samples", "8", "-o", "m.json"],
        2,
        r"x\.json: not a valid sidecar JSON file .*nested too deeply",
        setup=damaged_prefix("x", sidecar(DEEP)),
    ),
    # ---- llm-export
    Row(
        "export-no-such-source",
        ["llm-export", "hf", "nothing", "-o", "out/hf"],
        2,
        r"nothing\.idx: no such file",
    ),
    Row(
        "export-existing-output",
        ["llm-export", "hf", "{w.prefix}", "-o", "out/hf"],
        2,
        r"out/hf: already exists",
        {"out/hf/keep.txt": b"earlier"},
    ),
    Row(
        "export-bad-format",
        ["llm-export", "hf", "{w.prefix}", "-o", "out/hf", "--format", "csv"],
        2,
        r"--format",
    ),
    Row(
        "export-packed-without-length",
        ["llm-export", "hf", "{w.prefix}", "-o", "out/hf", "--packed"],
        2,
        r"--packed",
    ),
    Row(
        "export-seq-length-zero",
        ["llm-export", "hf", "{w.prefix}", "-o", "out/hf", "--packed", "--seq-length", "0"],
        2,
        r"--seq-length: must be positive",
    ),
    Row(
        "export-text-without-tokenizer",
        ["llm-export", "hf", "{w.prefix}", "-o", "out/hf", "--text"],
        2,
        r"--text needs --tokenizer",
    ),
    Row(
        "export-corrupt-idx",
        ["llm-export", "hf", "x", "-o", "out/hf"],
        2,
        r"x\.idx@byte 0: bad magic",
        setup=damaged_prefix("x", overwrite(".idx", 0, b"XXXXXXXXX")),
    ),
    Row(
        "export-mix-malformed",
        ["llm-export", "hf", "mix/mix.json", "-o", "out/hf"],
        2,
        r"mix/mix\.json: not a valid mix\.json",
        setup=copy_mix(raw=b'{"format": '),
    ),
    Row(
        "export-mix-deeply-nested",
        ["llm-export", "hf", "mix/mix.json", "-o", "out/hf"],
        2,
        r"mix/mix\.json: .*nested too deeply",
        setup=copy_mix(raw=DEEP),
    ),
    Row(
        "export-mix-wrong-format",
        ["llm-export", "hf", "mix/mix.json", "-o", "out/hf"],
        2,
        r"mix/mix\.json\[format\]: expected 'llmtools\.mix'",
        setup=copy_mix(edit=lambda m: m.update(format="other")),
    ),
    Row(
        "export-mix-bad-split",
        ["llm-export", "hf", "{w.mix}", "-o", "out/hf", "--split", "nope"],
        2,
        r"split",
    ),
    # ---- llm-train (everything is checked before any compute: --dry-run)
    Row(
        "train-zero-stage-7",
        TRAIN_WITH,
        2,
        r"ds\.json\[zero_optimization\.stage\]: DeepSpeed .* refuses it",
        {"ds.json": ds_config(zero_optimization__stage=7)},
    ),
    Row(
        "train-ds-unknown-key",
        TRAIN_WITH,
        2,
        r"ds\.json\[trian_batch_size\]: not a key DeepSpeed .*did you mean 'train_batch_size'",
        {"ds.json": ds_config(trian_batch_size=16)},
    ),
    Row(
        "train-ds-unknown-nested-key",
        TRAIN_WITH,
        2,
        r"ds\.json\[zero_optimization\.stagee\]: DeepSpeed .* refuses it",
        {"ds.json": ds_config(zero_optimization__stagee=1)},
    ),
    Row(
        "train-ds-nan",
        TRAIN_WITH,
        2,
        r"ds\.json:1:\d+: not valid JSON \(NaN is not a number JSON allows",
        {"ds.json": b'{"train_batch_size": "auto", "gradient_clipping": NaN}'},
    ),
    Row(
        "train-ds-malformed",
        TRAIN_WITH,
        2,
        r"ds\.json:1:\d+: not valid JSON",
        {"ds.json": b'{"train_batch_size": '},
    ),
    Row(
        "train-ds-deeply-nested",
        TRAIN_WITH,
        2,
        r"ds\.json:1:\d+: not valid JSON \(nested too deeply",
        {"ds.json": DEEP},
    ),
    Row(
        "train-ds-contradiction",
        TRAIN_WITH,
        2,
        r"ds\.json\[train_micro_batch_size_per_gpu\]=7 contradicts",
        {"ds.json": ds_config(train_micro_batch_size_per_gpu=7)},
    ),
    Row("train-lr-inf", [*TRAIN, "--set", "optimizer.lr=inf"], 2, r"optimizer\.lr: expected a finite number"),
    Row("train-lr-nan", [*TRAIN, "--set", "optimizer.lr=nan"], 2, r"optimizer\.lr: expected a finite number"),
    Row(
        "train-yaml-inf",
        ["llm-train", "c.yaml", "--deepspeed", str(DS / "zero1.json"), "--dry-run"],
        2,
        r"c\.yaml: training\.clip_grad: expected a finite number",
        setup=lambda d, w: (d / "c.yaml").write_text(
            w.tiny_yaml.read_text().replace("  precision: fp32\n", "  precision: fp32\n  clip_grad: .inf\n")
        ),
    ),
    Row(
        "train-unknown-key",
        [*TRAIN, "--set", "training.trian_steps=3"],
        2,
        r"unknown key training\.trian_steps .*did you mean",
    ),
    Row(
        "train-malformed-yaml",
        ["llm-train", "c.yaml", "--deepspeed", str(DS / "zero1.json"), "--dry-run"],
        2,
        r"c\.yaml:\d+: not valid YAML",
        {"c.yaml": b"model: [\n  preset: tiny\n"},
    ),
    Row(
        "train-yaml-deeply-nested",
        ["llm-train", "c.yaml", "--deepspeed", str(DS / "zero1.json"), "--dry-run"],
        2,
        r"c\.yaml: .*nested too deeply",
        {"c.yaml": b"model: " + b"[" * 20000 + b"]" * 20000 + b"\n"},
    ),
    Row(
        "train-config-not-a-mapping",
        ["llm-train", "c.yaml", "--deepspeed", str(DS / "zero1.json"), "--dry-run"],
        2,
        r"c\.yaml: a train config must be a mapping",
        {"c.yaml": b"- 1\n- 2\n"},
    ),
    Row(
        "train-missing-data",
        ["llm-train", "c.yaml", "--deepspeed", str(DS / "zero1.json"), "--dry-run"],
        2,
        r"c\.yaml: missing section 'data'",
        {"c.yaml": b"training:\n  train_steps: 2\n"},
    ),
    Row("train-data-missing", [*TRAIN, "--set", "data.prefixes=[nothing]"], 2, r"nothing: no such dataset"),
    Row(
        "train-report-to-unknown",
        [*TRAIN, "--set", "logging.report_to=[nonsense]"],
        2,
        r"logging\.report_to: 'nonsense' is not one of tensorboard, wandb, mlflow",
    ),
    Row(
        "train-tracking-uri-scheme",
        [*TRAIN, "--set", "logging.tracking_uri=nonsense://host"],
        2,
        r"logging\.tracking_uri: 'nonsense://host': unsupported scheme 'nonsense'",
    ),
    Row("train-bad-set", [*TRAIN, "--set", "optimizer.lr"], 2, r"--set 'optimizer\.lr': expected KEY=VALUE"),
    Row(
        "train-model-field",
        [*TRAIN, "--set", "model.hidden_size=-1"],
        2,
        r"tiny\.yaml: model\.hidden_size: must be >= 1, got -1",
    ),
    Row(
        "train-no-such-preset",
        [*TRAIN, "--set", "model.preset=huge"],
        2,
        r"tiny\.yaml: model\.preset: 'huge' is neither",
    ),
    Row("train-tokenizer-exceeds-vocab", [*TRAIN, "--set", "model.vocab_size=100"], 2, r"vocab_size"),
    Row(
        "train-resume-past-steps",
        [
            "llm-train",
            "{w.tiny_yaml}",
            "--deepspeed",
            str(DS / "zero1.json"),
            "-o",
            "run",
            "--resume",
            "auto",
            "--set",
            "training.train_steps=1",
        ],
        2,
        r"run/checkpoints/step_00000002/meta\.json\[[a-z_.]+\]: ",  # refused by the resume policy, named
        setup=copy_tree("run", "run"),
        timeout=400,
    ),
    Row(
        "train-existing-run",
        ["llm-train", "{w.tiny_yaml}", "--deepspeed", str(DS / "zero1.json"), "-o", "run"],
        2,
        r"run.*already",
        setup=copy_tree("run", "run"),
    ),
    # ---- llm-ckpt
    Row(
        "ckpt-verify-flipped-byte",
        ["llm-ckpt", "verify", "ck"],
        2,
        r"ck.*(sha256|checksum)",
        setup=copy_tree("checkpoint", "ck", flip_byte("mp_rank_00_model_states.pt")),
    ),
    Row(
        "ckpt-verify-meta-malformed",
        ["llm-ckpt", "verify", "ck"],
        2,
        r"ck/meta\.json",
        setup=copy_tree("checkpoint", "ck", write_file("meta.json", b'{"step": ')),
    ),
    Row(
        "ckpt-verify-meta-deeply-nested",
        ["llm-ckpt", "verify", "ck"],
        2,
        r"ck/meta\.json.*nested too deeply",
        setup=copy_tree("checkpoint", "ck", write_file("meta.json", DEEP)),
    ),
    Row("ckpt-list-missing", ["llm-ckpt", "list", "nothing"], 2, r"nothing"),
    Row("ckpt-inspect-missing", ["llm-ckpt", "inspect", "nothing"], 2, r"nothing"),
    Row(
        "ckpt-prune-not-a-run",
        ["llm-ckpt", "prune", "plain", "--keep", "1"],
        2,
        r"plain: not a run folder",
        {"plain/notes.txt": b"not a run"},
    ),
    Row("ckpt-prune-keep-zero", ["llm-ckpt", "prune", "{w.run}", "--keep", "0"], 2, r"--keep: must be >= 1"),
    Row(
        "ckpt-convert-existing",
        ["llm-ckpt", "convert", "{w.run}", "--to", "hf", "-o", "out/hf"],
        2,
        r"out/hf: already exists",
        {"out/hf/config.json": b"{}"},
    ),
    Row(
        "ckpt-convert-bad-dtype",
        ["llm-ckpt", "convert", "{w.run}", "--to", "hf", "-o", "out/hf", "--dtype", "fp8"],
        2,
        r"--dtype",
    ),
    Row(
        "ckpt-convert-bad-target",
        ["llm-ckpt", "convert", "{w.run}", "--to", "onnx", "-o", "out/x"],
        2,
        r"--to",
    ),
    Row(
        "ckpt-convert-bad-shard-size",
        ["llm-ckpt", "convert", "{w.run}", "--to", "hf", "-o", "out/hf", "--shard-size", "lots"],
        2,
        r"--shard-size",
    ),
    Row("ckpt-import-hf-missing", ["llm-ckpt", "import-hf", "nothing", "-o", "out/ck"], 2, r"nothing"),
    Row(
        "ckpt-eval-unknown-task",
        ["llm-ckpt", "eval", "{w.run}", "--tasks", "hellaswag"],
        2,
        r"--tasks: hellaswag: no such task file",
    ),
    Row(
        "ckpt-eval-task-not-json",
        ["llm-ckpt", "eval", "{w.run}", "--tasks", "t.jsonl"],
        2,
        r"t\.jsonl:2: not JSON",
        {"t.jsonl": lines({"context": "1+1=", "choices": ["2", "3"], "gold": 0}) + b"{oops\n"},
    ),
    Row(
        "ckpt-eval-missing-checkpoint",
        ["llm-ckpt", "eval", "nothing", "--tasks", "t.jsonl"],
        2,
        r"nothing: no such checkpoint",
        {"t.jsonl": lines({"context": "1+1=", "choices": ["2", "3"], "gold": 0})},
    ),
    # ---- llm-log
    Row(
        "log-all-nul",
        ["llm-log", "summary", "nul.log"],
        2,
        r"nul\.log@byte 0: binary data",
        {"nul.log": b"\x00" * (3 << 20)},
    ),
    Row(
        "log-random-binary",
        ["llm-log", "summary", "bin.log"],
        2,
        r"bin\.log: binary data",
        {"bin.log": bytes((i * 7919 + 13) % 256 for i in range(200_000))},
    ),
    Row(
        "log-broken-gz",
        ["llm-log", "summary", "m.jsonl.gz"],
        2,
        r"m\.jsonl\.gz: corrupt or truncated compressed data",
        setup=lambda d, w: (d / "m.jsonl.gz").write_bytes(gz(w.metrics.read_bytes() * 20)[:300]),
    ),
    Row(
        "log-broken-zst",
        ["llm-log", "summary", "m.jsonl.zst"],
        2,
        r"m\.jsonl\.zst: corrupt or truncated compressed data",
        setup=lambda d, w: (d / "m.jsonl.zst").write_bytes(zst(w.metrics.read_bytes() * 20)[:100]),
    ),
    Row(
        "log-tb-broken-gz",
        ["llm-log", "tb", "m.jsonl.gz", "--logdir", "tb"],
        2,
        r"m\.jsonl\.gz: corrupt or truncated",
        setup=lambda d, w: (d / "m.jsonl.gz").write_bytes(gz(w.metrics.read_bytes() * 20)[:300]),
    ),
    Row(
        "log-tb-bad-state",
        ["llm-log", "tb", "{w.metrics}", "--logdir", "tb", "--run", "r"],
        2,
        r"tb/r/\.llm-log-state\.json: unreadable llm-log state",
        {"tb/r/.llm-log-state.json": b"{oops"},
    ),
    Row(
        "log-plot-nothing",
        ["llm-log", "plot", "notes.txt", "-o", "p.png"],
        2,
        r"nothing to plot",
        {"notes.txt": b"hello\nworld\n"},
    ),
    Row(
        "log-plot-not-png",
        ["llm-log", "plot", "{w.metrics}", "-o", "p.txt"],
        2,
        r"-o/--output: p\.txt must end in \.png",
    ),
    Row(
        "log-plot-existing",
        ["llm-log", "plot", "{w.metrics}", "-o", "p.png"],
        2,
        r"p\.png: already exists",
        {"p.png": b"earlier"},
    ),
    Row("log-plot-dpi", ["llm-log", "plot", "{w.metrics}", "-o", "p.png", "--dpi", "100000"], 2, r"--dpi"),
    Row(
        "log-tb-poll-zero",
        ["llm-log", "tb", "{w.metrics}", "--logdir", "tb", "--poll", "0"],
        2,
        r"--poll must be > 0",
    ),
    Row(
        "log-tb-poll-inf",
        ["llm-log", "tb", "{w.metrics}", "--logdir", "tb", "--poll", "inf"],
        2,
        r"--poll must be > 0",
    ),
    Row(
        "log-spike-threshold-inf",
        ["llm-log", "summary", "{w.metrics}", "--spike-threshold", "inf"],
        2,
        r"--spike-threshold must be a finite number",
    ),
    Row("log-missing-file", ["llm-log", "summary", "nothing.log"], 2, r"nothing\.log: no such file"),
    Row(
        "log-wandb-not-a-run",
        ["llm-log", "wandb", "plain", "--dir", "out"],
        2,
        r"plain: a folder without metrics\.jsonl \(not a run folder",
        {"plain/notes.txt": b"not a run"},
    ),
    Row(
        "log-mlflow-not-a-run",
        ["llm-log", "mlflow", "plain", "--dir", "out"],
        2,
        r"plain: a folder without metrics\.jsonl \(not a run folder",
        {"plain/notes.txt": b"not a run"},
    ),
    Row(
        "log-mlflow-tracking-uri-scheme",
        ["llm-log", "mlflow", "{w.metrics}", "--dir", "out", "--tracking-uri", "nonsense://host"],
        2,
        r"--tracking-uri: 'nonsense://host': unsupported scheme 'nonsense'",
    ),
    Row(
        "log-mlflow-tracking-uri-no-host",
        ["llm-log", "mlflow", "{w.metrics}", "--dir", "out", "--tracking-uri", "http://"],
        2,
        r"--tracking-uri: 'http://': no host",
    ),
    Row("log-directory", ["llm-log", "summary", "sub"], 2, r"sub: not a regular file", {"sub/x": b""}),
    Row(
        "log-unknown-format",
        ["llm-log", "summary", "{w.metrics}", "--format", "csv"],
        2,
        r"--format: unknown format 'csv'",
    ),
]


def _render(item: str, d: Path, w: World) -> str:
    return item.format(d=d, w=w) if "{" in item and ("{d" in item or "{w." in item) else item


def _prepare(row: Row, root: Path, w: World) -> Path:
    d = root / row.name
    d.mkdir(parents=True)
    for relative, content in row.files.items():
        path = d / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    if row.setup is not None:
        row.setup(d, w)
    return d


@pytest.fixture(scope="session")
def table(world, tmp_path_factory, request):
    """Every selected row run once, in parallel: name -> (process, state before, state after)."""
    root = tmp_path_factory.mktemp("table")
    selected = {
        item.callspec.params["row"].name
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_bad_input"
    }

    def run_row(row: Row):
        d = _prepare(row, root, world)
        before = tree_state(d)
        argv = [_render(str(a), d, world) for a in row.argv]
        proc = run_cli(argv, d, stdin=row.stdin, timeout=row.timeout)
        return row.name, (proc, before, tree_state(d))

    with ThreadPoolExecutor(max_workers=max(2, min(6, (os.cpu_count() or 2) + 1))) as pool:
        return dict(pool.map(run_row, [row for row in ROWS if row.name in selected]))


def test_the_table_is_large_and_covers_every_command():
    assert len(ROWS) >= 100
    assert len({row.name for row in ROWS}) == len(ROWS)
    assert {row.prog for row in ROWS} == {
        "llm-prep",
        "llm-mix",
        "llm-export",
        "llm-train",
        "llm-ckpt",
        "llm-log",
    }


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_bad_input(row: Row, table):
    proc, before, after = table[row.name]
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == row.code, f"exit {proc.returncode}, expected {row.code}:\n{err[-2000:]}"
    line = error_line(proc, row.prog)
    assert re.search(row.where, line), f"{line!r} does not name {row.where!r}"
    assert changes(before, after) == [], "files were left behind or changed"
