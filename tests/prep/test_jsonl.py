"""JSONL reading: chunking with exact line numbers, compression, stdin, globs, and every bad-input kind."""

from __future__ import annotations

import gzip
import io
import json

import pytest
import zstandard

from llmtools.errors import InputError
from llmtools.prep.jsonl import JsonlSource, expand_inputs
from llmtools.prep.sources import DocumentSource

ROWS = [{"text": f"document {i} " + "x" * (i % 7), "n": i} for i in range(50)]


def jsonl_bytes(rows=ROWS) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def collect(source: JsonlSource, keys=("text",), skip_bad=None):
    skip = source.skip_bad if skip_bad is None else skip_bad
    texts, lines, bad, blank = [], [], [], 0
    for item in source.batches():
        batch = item.parse(keys, skip)
        texts += batch.texts[keys[0]]
        lines += [(batch.source, n) for n in batch.lines]
        bad += batch.bad
        blank += batch.blank_lines
    return texts, lines, bad, blank


@pytest.mark.parametrize("chunk_bytes", [1, 7, 100, 1 << 20])
def test_chunks_keep_line_numbers(tmp_path, chunk_bytes):
    path = tmp_path / "a.jsonl"
    path.write_bytes(jsonl_bytes())
    source = JsonlSource([str(path)], chunk_bytes=chunk_bytes)
    assert isinstance(source, DocumentSource)
    texts, lines, bad, _ = collect(source)
    assert texts == [r["text"] for r in ROWS]
    assert lines == [(str(path), i + 1) for i in range(50)]
    assert not bad
    (info,) = source.inputs()
    assert info["size"] == path.stat().st_size and len(info["sha256"]) == 64


def test_gzip_zstd_multi_member_and_order(tmp_path):
    data = jsonl_bytes()
    gz = tmp_path / "b.jsonl.gz"
    gz.write_bytes(gzip.compress(data[:300]) + gzip.compress(data[300:]))  # two gzip members
    zst = tmp_path / "c.jsonl.zst"
    cctx = zstandard.ZstdCompressor()
    zst.write_bytes(cctx.compress(data[:500]) + cctx.compress(data[500:]))  # two zstd frames
    odd = tmp_path / "d.data"  # compression is found by magic bytes, not by name
    odd.write_bytes(gzip.compress(data))
    texts, lines, _, _ = collect(JsonlSource([str(zst), str(gz), str(odd)], chunk_bytes=64))
    assert texts == [r["text"] for r in ROWS] * 3
    assert lines[0] == (str(zst), 1) and lines[50] == (str(gz), 1) and lines[-1] == (str(odd), 50)


def test_stdin_and_globs(tmp_path):
    for name in ("b.jsonl", "a.jsonl", "c.txt"):
        (tmp_path / name).write_bytes(jsonl_bytes(ROWS[:2]))
    assert expand_inputs([str(tmp_path / "*.jsonl")]) == [
        str(tmp_path / "a.jsonl"),
        str(tmp_path / "b.jsonl"),
    ]
    source = JsonlSource(["-"], stdin=io.BytesIO(gzip.compress(jsonl_bytes())))
    texts, lines, _, _ = collect(source)
    assert len(texts) == 50 and lines[3] == ("<stdin>", 4)
    assert source.inputs()[0]["path"] == "<stdin>" and source.total_bytes is None
    with pytest.raises(InputError, match="no file matches"):
        expand_inputs([str(tmp_path / "*.zst")])
    with pytest.raises(InputError, match="nope.jsonl: no such file"):
        expand_inputs([str(tmp_path / "nope.jsonl")])
    with pytest.raises(InputError, match="is a directory"):
        expand_inputs([str(tmp_path)])


def test_lines_only_the_standard_library_accepts(tmp_path):
    """orjson refuses NaN; Megatron parses with json, which accepts it: such a line is a document."""
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"text": "a", "score": NaN}\n{"text": "b", "score": Infinity}\n')
    texts, _, bad, _ = collect(JsonlSource([str(path)]))
    assert texts == ["a", "b"] and not bad


def test_blank_lines_and_unterminated_last_line(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(
        b'{"text": "a"}\n\n   \n{"text": "b"}\r\n{"text": "c"}'
    )  # CRLF and no final newline are fine
    texts, lines, bad, blank = collect(JsonlSource([str(path)]))
    assert texts == ["a", "b", "c"] and [n for _, n in lines] == [1, 4, 5] and not bad and blank == 2


BAD_CASES = [
    (
        b'{"text": "ok"}\n{"text": "a"\n',
        "malformed_json",
        ":2: malformed JSON: Expecting ',' delimiter at column 13",
    ),
    (b'{"text": "ok"}\n[1, 2]\n', "not_an_object", ":2: expected a JSON object, found list"),
    (
        b'{"text": "ok"}\n{"body": "x"}\n',
        "missing_key",
        ":2: missing key 'text' (keys: body; choose with --json-keys)",
    ),
    (b'{"text": "ok"}\n{"text": null}\n', "not_a_string", ":2: key 'text' is null, expected a string"),
    (b'{"text": "ok"}\n{"text": 5}\n', "not_a_string", ":2: key 'text' is int, expected a string"),
    (b'{"text": "ok"}\n{"text": "\xff\xfe"}\n', "invalid_utf8", ":2: invalid UTF-8 (byte 0xff at column 11)"),
    (
        b'{"text": "ok"}\n{"text": "\\ud800x"}\n',
        "invalid_utf8",
        ":2: key 'text' holds a lone surrogate escape",
    ),
    (
        b'{"text": "ok"}\n{"text": "cut of',
        "truncated_line",
        ":2: truncated last line (no newline at end of file",
    ),
]


@pytest.mark.parametrize("data,kind,message", BAD_CASES)
def test_bad_lines_name_file_and_line(tmp_path, data, kind, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(data + b'{"text": "after"}\n' if kind != "truncated_line" else data)
    texts, _, bad, _ = collect(JsonlSource([str(path)], skip_bad=False))
    assert bad[0].kind == kind
    assert bad[0].message.startswith(f"{path}{message}")
    texts, _, bad, _ = collect(JsonlSource([str(path)], skip_bad=True))
    assert texts == (["ok", "after"] if kind != "truncated_line" else ["ok"]) and [b.kind for b in bad] == [
        kind
    ]


def test_empty_and_truncated_files(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match=r"empty\.jsonl: empty file"):
        collect(JsonlSource([str(empty)]))
    empty_gz = tmp_path / "empty.jsonl.gz"
    empty_gz.write_bytes(gzip.compress(b""))
    with pytest.raises(InputError, match=r"empty\.jsonl\.gz: empty file"):
        collect(JsonlSource([str(empty_gz)]))
    for name, blob in [
        ("t.jsonl.gz", gzip.compress(jsonl_bytes())),
        ("t.jsonl.zst", zstandard.ZstdCompressor().compress(jsonl_bytes())),
    ]:
        cut = tmp_path / name
        cut.write_bytes(blob[: len(blob) - 10])
        with pytest.raises(InputError, match=rf"{name}:\d+: compressed stream ends early"):
            collect(JsonlSource([str(cut)]))
    corrupt = tmp_path / "c.jsonl.gz"
    corrupt.write_bytes(b"\x1f\x8b" + b"\x00" * 40)
    with pytest.raises(InputError, match=r"c\.jsonl\.gz:1: corrupt compressed data"):
        collect(JsonlSource([str(corrupt)]))
    good = tmp_path / "good.jsonl"
    good.write_bytes(jsonl_bytes(ROWS[:3]))
    source = JsonlSource([str(empty), str(tmp_path / "t.jsonl.gz"), str(good)], skip_bad=True)
    texts, _, _, _ = collect(source)
    assert texts[-3:] == [r["text"] for r in ROWS[:3]]
    assert source.skipped == {"empty_file": 1, "truncated_file": 1}


def test_clean_fast_path_matches_line_by_line_parsing(tmp_path):
    """parse() takes a one-call path for chunks whose every line is a clean object; any other chunk is
    judged line by line. Both must give the same documents, line numbers and counts."""
    from llmtools.prep.jsonl import JsonlChunk

    clean = jsonl_bytes()
    mixed = clean + b"\n" + b'{"text": 1}\n' + b'"just a string"\n' + b"[1, 2]\n" + b'{"text": "z"}\n'
    for data in (clean, mixed):
        chunk = JsonlChunk("f.jsonl", 10, data)
        rows = data.split(b"\n")[:-1]
        fast = chunk.parse(("text",), skip_bad=True)
        slow = chunk._parse_rows(rows, ("text",), skip_bad=True)
        assert fast.texts == slow.texts
        assert list(fast.lines) == list(slow.lines)
        assert (len(fast), fast.blank_lines, [b.message for b in fast.bad]) == (
            len(slow),
            slow.blank_lines,
            [b.message for b in slow.bad],
        )
    assert chunk._parse_clean(rows, "text") is None  # the mixed chunk is never taken by the fast path


@pytest.mark.parametrize("chunk_bytes", [1, 5, 16, 40])
def test_a_line_past_the_bound_is_refused_or_skipped_whatever_the_blocks(tmp_path, monkeypatch, chunk_bytes):
    """A file without newlines (or an endless stream) would make the reader hold everything: past
    MAX_LINE_BYTES it stops, naming the line; with skip_bad the line is skipped and counted, and every
    other line is read with its own number, wherever the blocks cut."""
    import llmtools.prep.jsonl as jsonl

    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 40)
    long = json.dumps({"text": "y" * 60})
    rows = [json.dumps({"text": f"short {i}"}) for i in range(4)]
    path = tmp_path / "a.jsonl"
    path.write_text("\n".join([rows[0], long, rows[1], rows[2], long, rows[3]]) + "\n")
    with pytest.raises(InputError, match=r"a\.jsonl:2: a line longer than 40 bytes"):
        collect(JsonlSource([str(path)], chunk_bytes=chunk_bytes))
    source = JsonlSource([str(path)], skip_bad=True, chunk_bytes=chunk_bytes)
    texts, lines, _, _ = collect(source)
    assert texts == [f"short {i}" for i in range(4)]
    assert [n for _, n in lines] == [1, 3, 4, 6]
    assert source.skipped == {"line_too_long": 2}
    path.write_text(rows[0] + "\n" + long)  # the last line, unterminated and too long
    source = JsonlSource([str(path)], skip_bad=True, chunk_bytes=chunk_bytes)
    assert collect(source)[0] == ["short 0"] and source.skipped == {"line_too_long": 1}
