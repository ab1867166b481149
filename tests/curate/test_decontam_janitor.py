"""Decontamination decides what lm-eval's Janitor decides: the same documents flagged, the same spans, the
same text after cutting, on generated tasks and planted evaluation text."""

from __future__ import annotations

import random

import pytest

from llmtools.prep.curate.decontam import index as ngram_index
from llmtools.prep.curate.decontam.match import CutRules, Matcher, cut
from llmtools.prep.curate.decontam.sources import open_sources
from llmtools.prep.curate.decontam.step import Decontaminate
from llmtools.prep.curate.step import Document

from .decontam_data import training_documents, write_tasks

janitor_module = pytest.importorskip("lm_eval.decontamination.janitor")


class SpyJanitor(janitor_module.Janitor):
    """lm-eval's Janitor, remembering the contaminated parts its python cleaner found."""

    def _split_chunks(self, dirty_string, dirty_parts):
        self.parts = [(start, end) for _, start, end in dirty_parts]
        return super()._split_chunks(dirty_string, self.parts and [(None, s, e) for s, e in self.parts])


def _setup(tmp_path, seed: int, n: int):
    rng = random.Random(seed)
    texts = write_tasks(tmp_path / "tasks", rng)
    header, key, check, task = ngram_index.build(open_sources([str(tmp_path / "tasks")]), n)
    ngram_index.save(tmp_path / "eval.ngrams", header, key, check, task)
    index = ngram_index.NgramIndex(tmp_path / "eval.ngrams")
    evals = [t for group in texts.values() for t in group]
    return rng, texts, index, evals


@pytest.mark.parametrize("seed,n", [(0, 13), (1, 8), (2, 5), (3, 1)])
def test_flags_and_spans_equal_janitor(tmp_path, seed, n):
    rng, texts, index, evals = _setup(tmp_path, seed, n)
    janitor = SpyJanitor(ngram_n=n)
    for text in evals:
        janitor.register_contaminant_python(text)
    distinct = {(int(k), int(c)) for k, c in zip(index.key, index.check, strict=True)}
    assert len(distinct) == len(janitor.dirt_ngrams)
    matcher = Matcher(index)
    flagged = 0
    for doc in training_documents(evals, rng, n, 300):
        janitor.clean_python(doc)
        hits = matcher.hits(doc)
        assert matcher.spans(doc, hits) == janitor.parts, doc
        assert all(h.ngram in janitor.dirt_ngrams for h in hits)
        flagged += bool(hits)
    assert flagged > 50 and (n == 1 or flagged < 300)  # both kinds present, so equality says something


@pytest.mark.parametrize(
    "rules",
    [
        CutRules(),
        CutRules(window=20, min_chunk=30, too_dirty=3),
        CutRules(window=0, min_chunk=0, too_dirty=1),
    ],
)
def test_cut_equals_janitor_clean(tmp_path, rules):
    n = 8
    rng, texts, index, evals = _setup(tmp_path, 7, n)
    janitor = SpyJanitor(
        ngram_n=n, window_to_remove=rules.window, minimum_slice_length=rules.min_chunk,
        too_dirty_cutoff=rules.too_dirty,
    )  # fmt: skip
    for text in evals:
        janitor.register_contaminant_python(text)
    step = Decontaminate(index, "cut", rules)
    outcomes = {"cut": 0, "dropped": 0}
    for doc in training_documents(evals, rng, n, 300):
        chunks = janitor.clean_python(doc)
        outcome = step(Document(doc))
        if not janitor.parts:
            assert outcome.drop is None and outcome.text is None
            continue
        pieces = cut(doc, step.matcher.spans(doc, step.matcher.hits(doc)), rules)
        assert (pieces or []) == chunks
        if chunks:
            assert outcome.drop is None and outcome.text == "".join(chunks)
            assert outcome.changes == len(janitor.parts)
            outcomes["cut"] += 1
        else:
            expected = "too_dirty" if len(janitor.parts) > rules.too_dirty else "nothing_left"
            assert outcome.drop == f"decontaminate.{expected}"
            outcomes["dropped"] += 1
    assert sum(outcomes.values()) == step.report()["hit"]["documents"]
    assert outcomes["dropped"] > 0
