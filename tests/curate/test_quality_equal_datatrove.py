"""The quality rules decide what datatrove's filters decide: on real text and seeded adversarial documents,
for default and other parameters, every rule's keep/drop, its reason (datatrove's own string), the new
text C4 leaves, and the measured value (a threshold set to it flips datatrove's decision exactly there)."""

from __future__ import annotations

import math
import warnings

import pytest

pytest.importorskip("datatrove")
pytest.importorskip("spacy")

from datatrove.data import Document as DatatroveDocument  # noqa: E402
from datatrove.pipeline import filters as dt  # noqa: E402
from datatrove.pipeline.filters.base_filter import get_filter_result  # noqa: E402

from llmtools.prep.curate.quality.c4 import C4Paragraph, C4Quality  # noqa: E402
from llmtools.prep.curate.quality.fineweb import FineWebQuality  # noqa: E402
from llmtools.prep.curate.quality.gopher_quality import GopherQuality  # noqa: E402
from llmtools.prep.curate.quality.gopher_repetition import GopherRepetition  # noqa: E402
from llmtools.prep.curate.quality.recipes import build_steps  # noqa: E402
from llmtools.prep.curate.step import Document  # noqa: E402
from llmtools.prep.curate.words import split_words  # noqa: E402
from tests.curate.quality_docs import adversarial, real_texts, sentences_of, settle_datatrove  # noqa: E402


@pytest.fixture(scope="module")
def texts() -> list[str]:
    settle_datatrove()
    real = real_texts(12)
    return real + adversarial(90, seed=7, sentences=sentences_of(real))


def theirs(flt, text: str):
    """(kept, reason, text after) of a datatrove filter; 'raises' when datatrove fails on the text."""
    doc = DatatroveDocument(text=text, id="0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy's mean of nothing
        try:
            kept, reason = get_filter_result(flt.filter(doc))
        except ZeroDivisionError:
            return "raises", None, text
    return bool(kept), reason, doc.text


def ours(step, text: str):
    outcome = step(Document(text))
    kept = outcome.drop is None
    reason = None if kept else outcome.drop.split(".", 1)[1]
    assert kept or outcome.drop.startswith(step.name + ".")
    return kept, reason, outcome.text if outcome.text is not None else text, outcome


def _datatrove_kwargs(kwargs: dict) -> dict:
    return {key: list(value) if key == "stop_words" else value for key, value in kwargs.items()}


def _compare(our_step, their_filter, texts) -> dict[str, int]:
    reasons: dict[str, int] = {}
    for text in texts:
        their_kept, their_reason, their_text = theirs(their_filter, text)
        kept, reason, new_text, _ = ours(our_step, text)
        if their_kept == "raises":
            reasons["datatrove raises"] = reasons.get("datatrove raises", 0) + 1
            continue
        assert (kept, reason) == (their_kept, their_reason), text[:300]
        if kept:
            assert new_text == their_text, text[:300]
        reasons[str(reason)] = reasons.get(str(reason), 0) + 1
    return reasons


GOPHER_QUALITY = [
    {},
    {
        "min_doc_words": 10, "max_doc_words": 300, "min_avg_word_length": 4, "max_avg_word_length": 6,
        "max_symbol_word_ratio": 0.02, "max_bullet_lines_ratio": 0.3, "max_ellipsis_lines_ratio": 0.1,
        "max_non_alpha_words_ratio": 0.9, "min_stop_words": 4, "stop_words": ("the", "a", "of", "is"),
    },
    {"min_doc_words": None, "max_doc_words": 0, "min_avg_word_length": None, "max_non_alpha_words_ratio": 0.5},
]  # fmt: skip
GOPHER_REPETITION = [
    {},
    {
        "dup_line_frac": 0.1, "dup_para_frac": None, "dup_line_char_frac": 0.05, "dup_para_char_frac": 0.05,
        "top_n_grams": ((1, 0.3), (2, 0.1), (5, 0.05)), "dup_n_grams": ((3, 0.05), (4, 0.04), (11, 0.02)),
    },
    {"dup_line_frac": None, "dup_para_frac": 0.9, "dup_line_char_frac": 0, "dup_para_char_frac": None},
]  # fmt: skip
C4 = [
    {},
    {"filter_no_terminal_punct": False},
    {"split_paragraph": False},
    {
        "remove_citations": False, "min_num_sentences": -1, "min_words_per_line": -1, "max_word_length": 20,
        "filter_lorem_ipsum": False, "filter_curly_bracket": False, "filter_no_terminal_punct": False,
    },
    {"filter_javascript": False, "filter_policy": False, "min_num_sentences": 8, "min_words_per_line": 6},
]  # fmt: skip
FINEWEB = [
    {},
    {
        "line_punct_thr": 0.5, "line_punct_exclude_zero": True, "stop_chars": (".", "!"), "short_line_thr": 0.3,
        "short_line_length": 60, "char_duplicates_ratio": 0.2, "new_line_ratio": 0.05,
    },
]  # fmt: skip


@pytest.mark.parametrize("kwargs", GOPHER_QUALITY)
def test_gopher_quality(texts, kwargs):
    seen = _compare(GopherQuality(**kwargs), dt.GopherQualityFilter(**_datatrove_kwargs(kwargs)), texts)
    assert len(seen) >= 3, seen


@pytest.mark.parametrize("kwargs", GOPHER_REPETITION)
def test_gopher_repetition(texts, kwargs):
    seen = _compare(GopherRepetition(**kwargs), dt.GopherRepetitionFilter(**kwargs), texts)
    assert len(seen) >= 3, seen


@pytest.mark.parametrize("kwargs", C4)
def test_c4_quality_and_the_text_it_leaves(texts, kwargs):
    seen = _compare(C4Quality(**kwargs), dt.C4QualityFilter(**kwargs), texts)
    assert "None" in seen, seen


def test_c4_quality_counts_its_changes():
    text = "Kept line one is here.\n\nA cited line, really [1].\nshort\nThis site uses cookies to run.\n"
    _, _, new_text, outcome = ours(C4Quality(min_num_sentences=1), text)
    assert new_text == "Kept line one is here.\nA cited line, really ."
    # dropped: the empty line, "short", the policy line; changed: the cited line
    assert outcome.changes == 4 and outcome.values["kept_lines"] == 2


@pytest.mark.parametrize("kwargs", FINEWEB)
def test_fineweb_quality(texts, kwargs):
    seen = _compare(FineWebQuality(**kwargs), dt.FineWebQualityFilter(**kwargs), texts)
    assert len(seen) >= 3, seen


@pytest.mark.parametrize("settings", [{}, {"min_paragraphs": 2, "min_paragraph_len": 40}])
def test_c4_paragraph(texts, settings):
    theirs_filter = dt.C4ParagraphFilter()
    for key, value in settings.items():
        setattr(theirs_filter, key, value)
    seen = _compare(C4Paragraph(**settings), theirs_filter, texts)
    assert len(seen) == 2, seen


def _step_through(steps, text: str):
    """What a command does: steps in order, stopping at a drop, a changed text in a new Document (so
    nothing cached of the old text survives but what a step handed on)."""
    doc = Document(text)
    for step in steps:
        outcome = step(doc)
        if outcome.drop is not None:
            return False, outcome.drop, doc.text
        if outcome.text is not None:
            doc = Document(outcome.text, doc.meta)
    return True, None, doc.text


def test_fineweb_recipe_is_datatrove_fineweb_pipeline(texts):
    """The recipe decides as datatrove's FineWeb example: the same filters, order and settings; C4's new
    text goes on to FineWeb's rules, which read its words as handed on (never split again)."""
    steps = build_steps("fineweb")
    pipeline = [
        dt.GopherRepetitionFilter(), dt.GopherQualityFilter(),
        dt.C4QualityFilter(filter_no_terminal_punct=False), dt.FineWebQualityFilter(),
    ]  # fmt: skip
    names = [f"{s.name}." for s in steps]
    assert names == ["gopher_repetition.", "gopher_quality.", "c4_quality.", "fineweb_quality."]
    outcomes = set()
    for text in texts:
        doc = DatatroveDocument(text=text, id="0")
        expected: tuple = (True, None)
        for name, flt in zip(names, pipeline, strict=True):
            kept, reason = get_filter_result(flt.filter(doc))
            if not kept:
                expected = (False, name + reason)
                break
        kept, rule, new_text = _step_through(steps, text)
        assert (kept, rule) == expected, text[:300]
        if kept:
            assert new_text == doc.text
        outcomes.add(rule)
    assert len(outcomes) >= 5, outcomes


def test_words_handed_on_by_c4_are_the_words_of_its_new_text(texts):
    step = C4Quality(filter_no_terminal_punct=False, min_num_sentences=-1)
    handed = 0
    for text in texts:
        doc = Document(text)
        split_words(text)
        from llmtools.prep.curate.words import words

        words(doc)
        outcome = step(doc)
        if outcome.text is None:
            continue
        fresh = Document(outcome.text)
        assert words(fresh) == split_words(outcome.text), text[:300]
        handed += 1
    assert handed > 20


def _flip(make, text, reason, param, value, kind, pair_n=None):
    """Datatrove, with the threshold at our measured value, no longer drops for `reason`; just past it, it
    does: so the value is exactly the one datatrove compares."""

    def run(threshold):
        kwargs = {param: ((pair_n, threshold),) if pair_n is not None else threshold}
        return theirs(make(**kwargs), text)[1]

    assert run(value) != reason
    past = (
        value + 1
        if isinstance(value, int)
        else math.nextafter(value, math.inf if kind == "min" else -math.inf)
    )
    if kind == "max" and isinstance(value, int):
        past = value - 1
    assert run(past) == reason


GOPHER_QUALITY_THRESHOLDS = {
    "gopher_short_doc": ("min_doc_words", "min"),
    "gopher_long_doc": ("max_doc_words", "max"),
    "gopher_below_avg_threshold": ("min_avg_word_length", "min"),
    "gopher_above_avg_threshold": ("max_avg_word_length", "max"),
    "gopher_too_many_hashes": ("max_symbol_word_ratio", "max"),
    "gopher_too_many_bullets": ("max_bullet_lines_ratio", "max"),
    "gopher_too_many_end_ellipsis": ("max_ellipsis_lines_ratio", "max"),
    "gopher_below_alpha_threshold": ("max_non_alpha_words_ratio", "min"),
    "gopher_enough_stop_words": ("min_stop_words", "min"),
}
FINEWEB_THRESHOLDS = {
    "line_punct_ratio": ("line_punct_thr", "min"),
    "short_line_ratio": ("short_line_thr", "max"),
    "char_dup_ratio": ("char_duplicates_ratio", "max"),
    "list_ratio": ("new_line_ratio", "max"),
}


def _flips(texts, step, make, thresholds, per_reason=2) -> set[str]:
    done: dict[str, int] = {}
    for text in texts:
        kept, reason, _, outcome = ours(step, text)
        if kept or reason not in thresholds or done.get(reason, 0) >= per_reason:
            continue
        param, kind = thresholds[reason][:2]
        value = outcome.values[step.measures[reason]]
        _flip(make, text, reason, param, value, kind, *thresholds[reason][2:])
        done[reason] = done.get(reason, 0) + 1
    return set(done)


def test_gopher_quality_values_are_datatrove_s(texts):
    flipped = _flips(texts, GopherQuality(), dt.GopherQualityFilter, GOPHER_QUALITY_THRESHOLDS)
    assert {"gopher_short_doc", "gopher_below_alpha_threshold", "gopher_too_many_end_ellipsis"} <= flipped


def test_gopher_repetition_values_are_datatrove_s(texts):
    step = GopherRepetition()
    thresholds = {
        name: (name, "max")
        for name in ("dup_para_frac", "dup_para_char_frac", "dup_line_frac", "dup_line_char_frac")
    }
    thresholds |= {f"top_{n}_gram": ("top_n_grams", "max", n) for n, _ in step.top_n_grams}
    thresholds |= {f"duplicated_{n}_n_grams": ("dup_n_grams", "max", n) for n, _ in step.dup_n_grams}
    flipped = _flips(texts, step, dt.GopherRepetitionFilter, thresholds)
    assert {"dup_line_frac", "top_2_gram", "duplicated_5_n_grams"} <= flipped, flipped


def test_fineweb_values_are_datatrove_s(texts):
    flipped = _flips(texts, FineWebQuality(), dt.FineWebQualityFilter, FINEWEB_THRESHOLDS)
    assert {"line_punct_ratio", "char_dup_ratio"} <= flipped, flipped


def test_c4_sentence_count_is_datatrove_s(texts):
    flipped = _flips(
        texts, C4Quality(), dt.C4QualityFilter, {"too_few_sentences": ("min_num_sentences", "min")}
    )
    assert flipped == {"too_few_sentences"}


def test_where_datatrove_divides_by_zero_the_rules_measure_nothing():
    """With its word-count rule off, datatrove's Gopher quality filter fails on a text of no words; ours
    skips the ratios it cannot measure (docs/curation.md says so)."""
    kwargs = {"min_doc_words": None}
    for text in ("", " \n "):
        assert theirs(dt.GopherQualityFilter(**kwargs), text)[0] == "raises"
        kept, reason, _, outcome = ours(GopherQuality(**kwargs), text)
        assert (kept, reason) == (False, "gopher_enough_stop_words")
        assert "hash_word_ratio" not in outcome.values
