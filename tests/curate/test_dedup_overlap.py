"""Two sources deduplicated together: the documents they shared reach `llm-mix --explain` through each
output's curation stats and json2bin's sidecar, with the numbers of dedup's OUT/stats.json."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from llmtools.formats.curation_stats import check_stats
from tests.conftest import REPO

BIN = Path(sys.executable).parent


def _cli(*args, cwd):
    proc = subprocess.run([str(BIN / args[0]), *map(str, args[1:])], capture_output=True, text=True, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return proc


def _text(rng: random.Random) -> str:
    return " ".join("".join(rng.choice("abcdefghij") for _ in range(6)) for _ in range(60))


def _corpus(tmp_path: Path) -> tuple[list[str], list[str]]:
    rng = random.Random(7)
    books = [_text(rng) for _ in range(30)]
    web = [_text(rng) for _ in range(40)]
    web[:5] = books[:5]  # exact copies
    web[5:9] = [b.rsplit(" ", 2)[0] + " zzzz yyyy" for b in books[5:9]]  # near copies
    for name, texts in (("books", books), ("web", web)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return books, web


def _dataset(tmp_path: Path, run: str, name: str, prefix: str) -> None:
    (kept,) = (tmp_path / run / "kept" / name).glob("*.jsonl")
    _cli("llm-prep", "json2bin", kept, "-t", "byte", "-o", f"data/{prefix}", "--provenance", f"{kept}.stats.json",
         "-q", cwd=tmp_path)  # fmt: skip


def _warnings(tmp_path: Path, *prefixes: str) -> list[str]:
    err = _cli("llm-mix", *[f"data/{p}_text_document" for p in prefixes], "--seq-length", "32", "--num-samples",
               "10", "--explain", cwd=tmp_path).stderr  # fmt: skip
    return [line for line in err.splitlines() if line.startswith("llm-mix: warning:")]


def test_shared_documents_reach_mix_explain(tmp_path):
    books, web = _corpus(tmp_path)
    _cli("llm-prep", "dedup", "--source", "books=books.jsonl", "--source", "web=web.jsonl", "-o", "out", "-q",
         cwd=tmp_path)  # fmt: skip
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    pair = {(c["removed_from"], c["kept_in"]): c for c in stats["across_sources"]}[("web", "books")]
    assert pair["documents"] == 9 and pair["characters"] == sum(len(t) for t in web[:9])
    for name in ("books", "web"):
        _dataset(tmp_path, "out", name, name)
        sidecar = json.loads((tmp_path / "data" / f"{name}_text_document.json").read_text())
        jsonschema.validate(sidecar, json.loads((REPO / "schemas" / "sidecar.schema.json").read_text()))
        (stage,) = sidecar["curation"]
        other = "web" if name == "books" else "books"
        assert stage["dedup"]["source"] == name and stage["dedup"]["shared"] == [
            {"with": other, "kept_in": "books", "documents": 9, "characters": pair["characters"]}
        ]
    mix = _cli("llm-mix", "data/books_text_document", "data/web_text_document", "--seq-length", "32",
               "--num-samples", "10", "--explain", cwd=tmp_path).stdout  # fmt: skip
    chars = pair["characters"]
    assert f"= duplicates shared with web: 9 documents, {chars:,} characters, kept here" in mix
    web_chars = sum(len(t) for t in web)
    assert (
        f"= duplicates shared with books: 9 documents ({9 / 40:.2%}), {chars:,} characters "
        f"({chars / web_chars:.2%}), kept in books" in mix
    )


def test_duplicates_left_in_by_separate_runs_are_warned(tmp_path):
    _corpus(tmp_path)
    _cli("llm-prep", "dedup", "--source", "books=books.jsonl", "--source", "web=web.jsonl", "-o", "joint", "-q",
         cwd=tmp_path)  # fmt: skip
    for name in ("books", "web"):
        _cli(
            "llm-prep", "dedup", "--source", f"{name}={name}.jsonl", "-o", f"alone-{name}", "-q", cwd=tmp_path
        )
        _dataset(tmp_path, "joint", name, name)
        _dataset(tmp_path, f"alone-{name}", name, f"{name}-alone")
    stats = json.loads((tmp_path / "joint" / "stats.json").read_text())
    pair = {(c["removed_from"], c["kept_in"]): c for c in stats["across_sources"]}[("web", "books")]
    assert _warnings(tmp_path, "books", "web") == []  # one run: the shared documents are in books only
    # books kept 9 documents whose copies the joint run removed from web; web deduplicated alone keeps them
    (left_in,) = _warnings(tmp_path, "books", "web-alone")
    assert (
        f"data/web-alone_text_document: {pair['documents']} documents ({pair['characters']:,} characters) "
        "of the source web are duplicates of documents in data/books_text_document" in left_in
    )
    # web deduplicated with books lost its copies: books deduplicated alone beside it holds each once
    assert _warnings(tmp_path, "books-alone", "web") == []
    (unknown,) = _warnings(tmp_path, "books-alone", "web-alone")
    assert "deduplicated in another run than data/books-alone_text_document" in unknown
    assert "how many is unknown" in unknown


def _record(**dedup):
    block = {"run": "0123456789abcdef", "source": "web", "shared": []} | dedup
    return {
        "format": "llmtools.curation-stats", "version": 2, "command": "dedup", "steps": [], "inputs": [],
        "output": {"path": "x", "bytes": 0, "sha256": "0" * 64}, "removed": "x.removed",
        "documents": {"in": 3, "kept": 2, "removed": 1, "changed": 0},
        "characters": {"in": 30, "kept": 20, "removed": 10}, "skipped": {},
        "rules": {"dedup.near": {"documents": 1, "characters": 10, "share": 0.3, "character_share": 0.3}},
        "changes": {}, "dedup": block,
    }  # fmt: skip


ROW = {"with": "books", "kept_in": "books", "documents": 1, "characters": 10}


@pytest.mark.parametrize(
    ("dedup", "words"),
    [
        ({"shared": [ROW | {"documents": 2}]}, "more documents lost"),
        ({"shared": [ROW | {"kept_in": "wiki"}]}, "kept_in"),
        ({"shared": [ROW | {"with": "web"}]}, "with"),
        ({"shared": [ROW | {"documents": -1}]}, "documents"),
        ({"run": 5}, "run"),
    ],
)
def test_a_bad_dedup_block_is_refused(dedup, words):
    assert check_stats(_record(shared=[ROW]))["dedup"]["shared"] == [ROW]
    with pytest.raises(ValueError, match=words):
        check_stats(_record(**dedup))
    old = _record(shared=[ROW]) | {"version": 1}
    with pytest.raises(ValueError, match="version 2"):
        check_stats(old)
