"""The quality rules' parameters, recipes, bad-words list and docs, and `llm-prep filter --recipe fineweb` as
one real process deciding as datatrove's FineWeb pipeline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llmtools.errors import InputError, UsageError
from llmtools.prep.curate.quality import build_steps, help_text, markdown, parameter_table
from llmtools.prep.curate.quality.c4_badwords import C4BadWords
from llmtools.prep.curate.quality.punctuation import PUNCTUATION_SET, TERMINAL_PUNCTUATION
from llmtools.prep.curate.step import Document
from tests.conftest import REPO
from tests.curate.quality_docs import adversarial, real_texts, sentences_of, settle_datatrove, write_jsonl

BIN = Path(sys.executable).parent


def test_defaults_and_names_are_datatrove_s():
    pytest.importorskip("datatrove")
    import inspect

    from datatrove.pipeline import filters as dt
    from datatrove.utils import text as dt_text

    assert PUNCTUATION_SET == dt_text.PUNCTUATION_SET and TERMINAL_PUNCTUATION == dt_text.TERMINAL_PUNCTUATION
    theirs = {
        "gopher_quality": dt.GopherQualityFilter, "gopher_repetition": dt.GopherRepetitionFilter,
        "c4_quality": dt.C4QualityFilter, "fineweb_quality": dt.FineWebQualityFilter,
        "c4_badwords": dt.C4BadWordsFilter,
    }  # fmt: skip
    ours = {}
    for p in parameter_table():
        ours.setdefault(p.rule, {})[p.name] = p.default
    for rule, cls in theirs.items():
        signature = inspect.signature(cls.__init__).parameters
        for name, default in ours[rule].items():
            if name in signature:
                expected = signature[name].default
                if name == "stop_words":
                    from datatrove.pipeline.filters.gopher_quality_filter import STOP_WORDS

                    expected = tuple(STOP_WORDS)
                assert default == expected, (rule, name)
        skipped = {"self", "exclusion_writer", "language", "fail_on_missing_language"}
        assert set(signature) - skipped <= set(ours[rule]), rule


def test_overrides_by_name():
    steps = build_steps(
        "fineweb",
        overrides=[
            "gopher_quality.min_doc_words=100", "gopher_quality.max_doc_words=none",
            "gopher_repetition.top_n_grams=2:0.1,3:0.05", "gopher_quality.stop_words=the,a",
            "c4_quality.filter_no_terminal_punct=true", "fineweb_quality.stop_chars=.!",
        ],
    )  # fmt: skip
    repetition, quality, c4, fineweb = steps
    assert (
        quality.min_doc_words == 100 and quality.max_doc_words is None and quality.stop_words == ("the", "a")
    )
    assert repetition.top_n_grams == ((2, 0.1), (3, 0.05))
    assert c4.filter_no_terminal_punct is True
    assert fineweb.stop_chars == (".", "!")
    assert build_steps("fineweb")[2].filter_no_terminal_punct is False
    assert [s.name for s in build_steps("gopher", rules=["fineweb_quality", "gopher_quality"])] == [
        "gopher_repetition", "gopher_quality", "fineweb_quality",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "recipe, rules, overrides, words",
    [
        ("nope", (), (), "no such recipe"),
        (None, ("nope",), (), "no such rule"),
        ("gopher", (), ("gopher_quality.min_doc_words",), "RULE.PARAM=VALUE"),
        ("gopher", (), ("gopher_quality.nope=1",), "no such parameter"),
        ("gopher", (), ("gopher_quality.min_doc_words=lots",), "not an integer"),
        ("gopher", (), ("gopher_quality.max_symbol_word_ratio=nan",), "not a finite number"),
        ("gopher", (), ("gopher_repetition.top_n_grams=2",), "N:FRACTION"),
        ("gopher", (), ("gopher_repetition.dup_n_grams=0:0.1",), "at least 1"),
        ("gopher", (), ("fineweb_quality.new_line_ratio=1",), "not among the chosen rules"),
        ("c4", (), ("c4_quality.split_paragraph=maybe",), "not true or false"),
        (None, ("c4_badwords",), (), "badwords_file"),
    ],
)
def test_bad_overrides_name_the_parameter(recipe, rules, overrides, words):
    with pytest.raises(UsageError, match=words):
        build_steps(recipe, rules, overrides)


def test_docs_hold_the_generated_parameter_table():
    section = markdown()
    assert section in (REPO / "docs" / "curation.md").read_text(encoding="utf-8"), (
        "docs/curation.md is behind the rules: python -m llmtools.prep.curate.quality prints its section"
    )
    for p in parameter_table():
        assert f"`{p.qualified}`" in section and p.qualified in help_text()


def test_badwords_decide_as_datatrove_with_a_local_list(tmp_path, monkeypatch):
    pytest.importorskip("datatrove")
    from datatrove.data import Document as DatatroveDocument
    from datatrove.pipeline.filters import c4_filters

    listing = tmp_path / "en.txt"
    listing.write_bytes(b"darn\r\nheck\nfiddle sticks\n  blast  \nsm\n")
    # datatrove downloads its list; handed the same local file, it must decide as ours
    monkeypatch.setattr(c4_filters, "cached_asset_path_or_download", lambda *a, **k: str(listing))
    texts = adversarial(40, seed=3) + [
        "Oh darn it.", "DARN!", "darned", "fiddle sticks, again", "fiddle  sticks", "what the heck?", "blast",
        "sm all", "(heck)", "heckle",
    ]  # fmt: skip
    for keep_fraction, seed in ((0.0, None), (0.5, 11)):
        theirs = c4_filters.C4BadWordsFilter(keep_fraction=keep_fraction, seed=seed)
        ours = C4BadWords(badwords_file=str(listing), keep_fraction=keep_fraction, seed=seed)
        decided = set()
        for text in texts:
            expected = theirs.filter(DatatroveDocument(text=text, id="0"))
            outcome = ours(Document(text))
            assert (outcome.drop is None) == (expected is True), text
            if outcome.drop:
                assert outcome.drop == "c4_badwords." + expected[1]
            decided.add(outcome.drop)
        assert len(decided) == 2


def test_badwords_list_is_checked(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        C4BadWords(badwords_file=str(tmp_path / "missing.txt"))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\n\xff\xfe\n")
    with pytest.raises(InputError, match=r"bad.txt:2: .*not UTF-8"):
        C4BadWords(badwords_file=str(bad))


def _datatrove_fineweb(texts: list[str]) -> dict[str, tuple[str | None, str]]:
    from datatrove.data import Document as DatatroveDocument
    from datatrove.pipeline import filters as dt
    from datatrove.pipeline.filters.base_filter import get_filter_result

    settle_datatrove()
    pipeline = [
        ("gopher_repetition", dt.GopherRepetitionFilter()), ("gopher_quality", dt.GopherQualityFilter()),
        ("c4_quality", dt.C4QualityFilter(filter_no_terminal_punct=False)), ("fineweb_quality", dt.FineWebQualityFilter()),
    ]  # fmt: skip
    out = {}
    for number, text in enumerate(texts):
        doc = DatatroveDocument(text=text, id=str(number))
        rule = None
        for name, flt in pipeline:
            kept, reason = get_filter_result(flt.filter(doc))
            if not kept:
                rule = f"{name}.{reason}"
                break
        out[str(number)] = (rule, doc.text)
    return out


def test_llm_prep_filter_recipe_fineweb_decides_as_datatrove(tmp_path):
    pytest.importorskip("datatrove")
    real = real_texts(8)
    texts = [t for t in real + adversarial(50, seed=5, sentences=sentences_of(real)) if t.strip()]
    source = tmp_path / "in.jsonl"
    write_jsonl(source, texts)
    out = tmp_path / "out.jsonl"
    proc = subprocess.run(
        [BIN / "llm-prep", "filter", source, "-o", out, "--recipe", "fineweb", "-q"], capture_output=True
    )
    assert proc.returncode == 0, proc.stderr.decode()
    expected = _datatrove_fineweb(texts)
    kept = {r["id"]: r["text"] for r in map(json.loads, out.read_text(encoding="utf-8").splitlines())}
    removed = {
        r["id"]: r for r in map(json.loads, Path(f"{out}.removed").read_text(encoding="utf-8").splitlines())
    }
    assert set(kept) | set(removed) == set(expected) and not set(kept) & set(removed)
    for key, (rule, text) in expected.items():
        if rule is None:
            assert kept[key] == text
        else:
            assert removed[key]["rule"] == rule
    assert len({r["rule"] for r in removed.values()}) >= 4 and len(kept) >= 5
    stats = json.loads(Path(f"{out}.stats.json").read_text())
    assert [s["name"] for s in stats["steps"]] == [
        "gopher_repetition",
        "gopher_quality",
        "c4_quality",
        "fineweb_quality",
    ]

    bad = subprocess.run(
        [BIN / "llm-prep", "filter", source, "-o", tmp_path / "x.jsonl", "--recipe", "fineweb",
         "--set", "gopher_repetition.top_n_grams=2"], capture_output=True,
    )  # fmt: skip
    assert bad.returncode == 2 and b"top_n_grams" in bad.stderr and b"Traceback" not in bad.stderr
    assert not (tmp_path / "x.jsonl").exists()
