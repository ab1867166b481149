"""The compiled JSONL scanner (``_native/jsonl.c``): whatever it accepts, it extracts exactly as
``json.loads(line)[key]`` would; whatever it cannot judge exactly, it leaves to the Python path."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmtools import _native
from llmtools.prep.jsonl import JsonlChunk, JsonlSource
from llmtools.prep.sources import FlatTexts

LIB = _native.load()
pytestmark = pytest.mark.skipif(LIB is None, reason="no C compiler: the compiled scanner is unavailable")
NOT_PLAIN = -1


def extract(data: bytes, key: str = "text") -> list[bytes] | None:
    """The scanner on ``data`` (whole lines): the texts, or None for 'not plain'."""
    lines = data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)
    out = np.empty(max(len(data), 1), dtype=np.uint8)
    offsets = np.empty(lines + 1, dtype=np.int64)
    name = key.encode()
    got = LIB.llm_jsonl_extract(
        data, len(data), name, len(name), out.ctypes.data, _native.ptr(offsets, _native._i64p), lines
    )
    if got == NOT_PLAIN:
        return None
    assert got == lines
    raw = out.tobytes()
    return [raw[a:b] for a, b in zip(offsets[:-1], offsets[1:], strict=True)]


def reference(line: bytes, key: str = "text") -> bytes | None:
    """What the Python path makes of one line: the text's UTF-8, or None when it is not a document."""
    try:
        obj = json.loads(line.decode("utf-8"))
        value = obj[key]
        return value.encode("utf-8") if isinstance(value, str) else None
    except (ValueError, KeyError, TypeError, UnicodeError, RecursionError):
        return None


def check_line(line: bytes, key: str = "text") -> bool:
    """The scanner's verdict on one line agrees with the reference; True when it accepted the line."""
    got = extract(line + b"\n", key)
    if got is None:
        return False
    assert got == [reference(line, key)], line
    return True


PLAIN = [
    b'{"text": "hello"}',
    b'  {"text":"a\\"b\\\\c\\/d\\b\\f\\n\\r\\t"}  \r',
    b'{"id": 3, "text": "caf\\u00e9 \\u4e2d \\ud83d\\ude00 \\u0000 end", "x": [1, -2.5e+10, true, false, null]}',
    '{"text": "raw caf\u00e9 \u4e2d\u6587 \U0001f600", "meta": {"a": {"b": [[], {}, [{"c": "d"}]]}}}'.encode(),
    b'{"meta": {"text": 1}, "text": "nested key of the same name is not the key"}',
    b'{"text": ""}',
    b'{"a": 0, "b": -0.0, "c": 1E5, "d": "\\u00e9\\"", "text": "x"}',
    b'{"text": "tab\x7fdel"}',
]

NOT_PLAIN_LINES = [
    b"",  # blank: counted by the Python path
    b"   ",
    b"{}",
    b'{"other": "no key"}',
    b'{"text": 5}',
    b'{"text": null}',
    b'{"text": ["a"]}',
    b'{"text": "a", "text": "b"}',  # duplicate: json.loads keeps the last
    b'{"te\\u0078t": "escaped key"}',
    b'{"text": "lone \\ud800 high"}',
    b'{"text": "lone \\udc00 low"}',
    b'{"text": "high then not low \\ud800\\u0041"}',
    b'{"text": "x", "n": NaN}',
    b'{"text": "x", "n": Infinity}',
    b'{"text": "x", "n": -Infinity}',
    b'{"text": "x", "n": 01}',
    b'{"text": "x", "n": 1.}',
    b'{"text": "x", "n": .5}',
    b'{"text": "x", "n": 1e}',
    b'{"text": "x", "n": +1}',
    b'{"text": "raw\ttab"}',  # raw control character
    b'{"text": "bad \\x escape"}',
    b'{"text": "short \\u12"}',
    b'{"text": "x"} trailing',
    b'{"text": "x",}',
    b'{"text": "x" "y": 1}',
    b'["text"]',
    b'"text"',
    b'\xef\xbb\xbf{"text": "bom"}',
    b'{"text": "overlong \xc0\x80"}',
    b'{"text": "surrogate \xed\xa0\x80"}',
    b'{"text": "too big \xf4\x90\x80\x80"}',
    b'{"text": "cut \xe4\xb8"}',
    b'{"text": "stray \x80"}',
    b'{"text": "x", "other": "invalid \xff utf8 elsewhere"}',
    b'{"text": "unterminated',
    b'{"text": "x"',
    b'{"text": "x", "deep": ' + b"[" * 65 + b"]" * 65 + b"}",
    b'{"text": "x", "t": tru}',
]


@pytest.mark.parametrize("line", PLAIN)
def test_plain_lines_extract_exactly(line):
    assert check_line(line)


@pytest.mark.parametrize("line", NOT_PLAIN_LINES)
def test_anything_unusual_is_left_to_python(line):
    assert extract(line + b"\n") is None


def test_deep_nesting_within_the_limit_is_plain():
    assert check_line(b'{"text": "x", "deep": ' + b"[" * 64 + b"]" * 64 + b"}")


def test_one_unusual_line_makes_the_whole_chunk_python():
    good = b'{"text": "a"}\n'
    assert extract(good * 3) == [b"a"] * 3
    assert extract(good + b"\n" + good) is None  # a blank line in the middle


def test_last_line_without_newline():
    assert extract(b'{"text": "a"}\n{"text": "b"}') == [b"a", b"b"]


def test_never_writes_more_offsets_than_it_is_given():
    data = b'{"text": "a"}\n{"text": "b"}\n{"text": "c"}\n'
    out, offsets = np.empty(len(data), np.uint8), np.full(4, -7, np.int64)
    got = LIB.llm_jsonl_extract(
        data, len(data), b"text", 4, out.ctypes.data, _native.ptr(offsets, _native._i64p), 2
    )
    assert got == NOT_PLAIN and offsets[3] == -7
    # a chunk that says "terminated" but is not: both paths still read its last line
    chunk = JsonlChunk("f.jsonl", 1, b'{"text": "a"}\n{"text": "b"}', unterminated=False, newlines=1)
    assert chunk.parse(["text"], False, flat=True).texts["text"].tolist() == ["a", "b"]
    assert chunk.parse(["text"], False).texts["text"] == ["a", "b"]


def test_other_key():
    assert extract(b'{"text": 1, "body": "b\\u00e9"}\n', key="body") == ["b\u00e9".encode()]
    assert extract('{"caf\u00e9": "x"}\n'.encode(), key="caf\u00e9") == [b"x"]


json_leaf = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=st.text(),
    others=st.dictionaries(st.text(max_size=6).filter(lambda k: k != "text"), json_value, max_size=4),
    ascii_only=st.booleans(),
    compact=st.booleans(),
    position=st.integers(0, 4),
)
def test_random_objects_round_trip(text, others, ascii_only, compact, position):
    items = list(others.items())
    items.insert(min(position, len(items)), ("text", text))
    line = json.dumps(dict(items), ensure_ascii=ascii_only, separators=(",", ":") if compact else None)
    accepted = check_line(line.encode("utf-8"))
    # Only a top-level key written with an escape is (deliberately) left to the Python path.
    escaped_key = any("\\" in json.dumps(k, ensure_ascii=ascii_only) for k in others)
    assert accepted or escaped_key


MUTATIONS = [
    b'"',
    b"\\",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"u",
    b"n",
    b"0",
    b"e",
    b"-",
    b".",
    b" ",
    b"\t",
    b"\x00",
    b"\x1f",
    b"\x7f",
    b"\x80",
    b"\xc3",
    b"\xa9",
    b"\xed",
    b"\xa0",
    b"\xf4",
    b"\x90",
    b"\xff",
    b"\\u",
    b"\\ud83d",
    b"\\ude00",
    b"\\ud800",
    b"NaN",
    b'"text"',
]


def test_mutated_lines_never_disagree_with_json_loads():
    """Random damage to valid lines: the scanner either refuses the line or agrees with json.loads."""
    rng = random.Random(1234)
    seeds = [line for line in PLAIN] + [
        json.dumps(
            {"text": 'caf\u00e9 \U0001f600 "q" \\ end', "n": [1, 2.5, None], "m": {"k": "v"}}, ensure_ascii=a
        ).encode()
        for a in (True, False)
    ]
    accepted = 0
    for _ in range(20000):
        line = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 3)):
            where = rng.randrange(len(line) + 1)
            action = rng.random()
            if action < 0.4:
                line[where:where] = rng.choice(MUTATIONS)
            elif action < 0.7 and where < len(line):
                del line[where : where + rng.randint(1, 3)]
            elif where < len(line):
                line[where : where + 1] = rng.choice(MUTATIONS)
        line = bytes(line).replace(b"\n", b" ")
        accepted += check_line(line)
    assert accepted > 1000  # the mutations leave many lines valid: the comparison is not vacuous


def test_flat_parse_equals_python_parse(tmp_path):
    rows = [{"text": f"doc {i} caf\u00e9 \U0001f600" * (i % 5), "n": i} for i in range(300)]
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=i % 2 == 0) + "\n" for i, r in enumerate(rows)))
    for item in JsonlSource([str(path)], chunk_bytes=2000).batches():
        flat = item.parse(["text"], False, flat=True)
        plain = item.parse(["text"], False)
        assert isinstance(flat.texts["text"], FlatTexts)
        assert flat.texts["text"].tolist() == plain.texts["text"]
        assert list(flat.lines) == list(plain.lines) and flat.nbytes == plain.nbytes and not flat.bad


def test_flat_parse_falls_back_on_any_bad_line():
    chunk = JsonlChunk("f.jsonl", 7, b'{"text": "a"}\n{"text": 1}\n')
    batch = chunk.parse(["text"], True, flat=True)
    assert batch.texts["text"] == ["a"] and [b.kind for b in batch.bad] == ["not_a_string"]
    assert batch.bad[0].message.startswith("f.jsonl:8:")


def test_flat_texts_concat():
    a = FlatTexts(np.frombuffer(b"abc", np.uint8), np.array([0, 1, 3]))
    b = FlatTexts(np.frombuffer(b"de", np.uint8), np.array([0, 0, 2]))
    both = FlatTexts.concat([a, b])
    assert both.tolist() == ["a", "bc", "", "de"] and len(both) == 4 and both[3] == "de" == both[-1]
    with pytest.raises(IndexError):
        both[4]


def test_json2bin_files_are_the_same_without_the_scanner(tmp_path, monkeypatch):
    """The C scanner is an optimization only: with it disabled, json2bin writes the same bytes."""
    from llmtools.prep.json2bin import json2bin
    from tests.conftest import shared

    tokenizer = str(shared("tokenizers/gpt2/tokenizer.json"))
    lines = shared("lambada/lambada_test.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)[:600]
    odd = ['{"text": "lone \\ud800 surrogate"}\n', "\n", '{"text": "x", "n": NaN}\n', '{"text": 3}\n']
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        "".join(lines[:300] + odd + lines[300:]) + json.dumps({"text": "caf\u00e9 end"}), encoding="utf-8"
    )

    def run(name):
        out = tmp_path / name
        json2bin(
            [str(corpus)],
            tokenizer,
            str(out),
            append_eod=True,
            workers=2,
            backend="gigatoken",
            skip_bad=True,
            chunk_bytes=4096,
            progress=False,
        )
        return [(tmp_path / f"{name}_text_document{s}").read_bytes() for s in (".bin", ".idx")]

    native_chunks = []
    original = JsonlChunk._parse_native

    def spy(self, keys):
        batch = original(self, keys)
        native_chunks.append(batch is not None)
        return batch

    monkeypatch.setattr(JsonlChunk, "_parse_native", spy)
    with_scanner = run("native")
    assert sum(native_chunks) > 10 and not all(native_chunks)  # both paths ran
    monkeypatch.setattr(_native, "_lib", None)
    monkeypatch.setattr(_native, "_tried", True)
    assert run("python") == with_scanner
