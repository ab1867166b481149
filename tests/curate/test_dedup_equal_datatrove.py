"""`llm-prep dedup` decides as datatrove's MinHash pipeline does: the same signatures (bytes of each band
file), the same duplicate pairs (bytes), the same documents removed (datatrove's MinhashDedupSignature ->
Buckets -> Cluster -> Filter, run by its LocalPipelineExecutor) on a corpus of planted near duplicates at
known Jaccard similarities plus real text; exact dedup equals a plain hash set; the catch rate of the
planted pairs follows the LSH curve within sampling error."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from llmtools.prep.curate.dedup.config import DedupConfig, catch_probability, exact_normalise
from llmtools.prep.curate.dedup.layout import Source, make_plan, write_or_check_plan
from llmtools.prep.curate.dedup.run import run_dedup
from tests.curate.dedup_corpus import SIMILARITIES, write_corpus

pytest.importorskip("datatrove")
pytest.importorskip("spacy")
pytestmark = pytest.mark.slow  # datatrove's four stages and ours over ~1,000 documents
FILES = 3


def _datatrove(corpus: Path, work: Path) -> set[str]:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter

    config = MinhashConfig()
    runs = [
        ([JsonlReader(str(corpus)), MinhashDedupSignature(str(work / "sigs"), config=config)], FILES),
        ([MinhashDedupBuckets(str(work / "sigs"), str(work / "buckets"), config=config)], config.num_buckets),
        ([MinhashDedupCluster(str(work / "buckets"), str(work / "remove"), config=config)], 1),
        ([JsonlReader(str(corpus)), MinhashDedupFilter(str(work / "remove"),
                                                      exclusion_writer=JsonlWriter(str(work / "removed")))], FILES),
    ]  # fmt: skip
    for k, (pipeline, tasks) in enumerate(runs):
        LocalPipelineExecutor(pipeline, tasks=tasks, workers=1, logging_dir=str(work / f"logs{k}")).run()
    removed = set()
    for path in sorted((work / "removed").glob("*.jsonl.gz")):
        removed |= {json.loads(line)["id"] for line in gzip.open(path, "rt")}
    return removed


def _ours(corpus: Path, out: Path, config: DedupConfig) -> set[str]:
    plan = make_plan(config, [Source("corpus", (str(corpus / "*.jsonl"),))], skip_bad=False)
    write_or_check_plan(out, plan)
    run_dedup(out, plan, "all", progress=False)
    removed = set()
    for path in (out / "kept" / "corpus").glob("*.removed"):
        removed |= {json.loads(line)["id"] for line in path.read_text().splitlines()}
    return removed


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dedup")
    planted = write_corpus(root / "corpus", files=FILES, per_similarity=40)
    theirs = _datatrove(root / "corpus", root / "datatrove")
    ours = _ours(root / "corpus", root / "ours", DedupConfig())
    return root, planted, theirs, ours


def test_signatures_and_pairs_are_datatrove_bytes(runs):
    root, *_ = runs
    for rank in range(FILES):
        for band in range(14):
            theirs = (
                root / "datatrove" / "sigs" / f"bucket_{band:03d}" / f"{rank:05d}.minhash.sig"
            ).read_bytes()
            ours = (root / "ours" / "work" / "sig" / f"{rank:06d}" / f"band_{band:03d}.sig").read_bytes()
            assert len(theirs) > 0 and ours == theirs, (rank, band)
    for band in range(14):
        theirs = (root / "datatrove" / "buckets" / f"{band:05d}_00.dups").read_bytes()
        assert (root / "ours" / "work" / "pairs" / f"band_{band:03d}.pairs").read_bytes() == theirs, band


def test_removed_documents_are_datatrove_s(runs):
    """The same documents removed; exact dedup adds only the repeated texts too short for a shingle (two
    of each three copies) and changes nothing datatrove decided."""
    _, planted, theirs, ours = runs
    assert len(theirs) > 100
    short_removed = ours - theirs
    assert ours >= theirs
    assert short_removed <= set(planted["short"]) and len(short_removed) == 2 * len(planted["short"]) // 3


def test_exact_dedup_is_a_hash_set(tmp_path):
    corpus = tmp_path / "corpus"
    planted = write_corpus(corpus, files=FILES, per_similarity=2)
    seen, expected = set(), set()
    for path in sorted(corpus.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            doc = json.loads(line)
            key = exact_normalise(doc["text"])
            if key in seen:
                expected.add(doc["id"])
            seen.add(key)
    assert len(expected) == len(planted["exact"]) + 2 * len(planted["short"]) // 3
    assert _ours(corpus, tmp_path / "out", DedupConfig(near=False)) == expected


def _caught(planted, removed) -> dict[float, list[tuple[float, bool]]]:
    by = {s: [] for s in SIMILARITIES}
    for pair in planted["planted"]:
        by[pair["similarity"]].append((pair["jaccard"], pair["a"] in removed or pair["b"] in removed))
    return by


def test_recall_and_precision_per_similarity_equal_datatrove_and_follow_the_curve(runs):
    _, planted, theirs, ours = runs
    mine, reference = _caught(planted, ours), _caught(planted, theirs)
    planted_ids = {p[k] for p in planted["planted"] for k in ("a", "b")} | {x for _, x in planted["exact"]}
    planted_ids |= {r for r, _ in planted["exact"]} | set(planted["short"])
    for s in SIMILARITIES:
        recall = sum(c for _, c in mine[s]) / len(mine[s])
        assert recall == sum(c for _, c in reference[s]) / len(reference[s]), s
        # each pair is caught independently with probability 1-(1-J^r)^b (J its realised similarity): the
        # count's standard deviation is sqrt(sum p(1-p)); 4 of them (a two-sided 1 in 15,000 chance) plus
        # half a pair for the discreteness
        probabilities = [catch_probability(j, 14, 8) for j, _ in mine[s]]
        expected = sum(probabilities)
        sigma = math.sqrt(sum(p * (1 - p) for p in probabilities))
        caught = sum(c for _, c in mine[s])
        assert abs(caught - expected) <= 4 * sigma + 0.5, (s, caught, expected, sigma)
    # precision: what is removed is planted (no real text lost to a false match)
    assert ours <= planted_ids and theirs <= planted_ids
