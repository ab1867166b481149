"""The clusters stage on hand-made pairs: datatrove's MinhashDedupCluster removes the same documents from
the same pair files (union by size, ties to the first pair's root), and with ranked sources the copy in
the first-ranked source stays even where the union-find's root lies in another."""

from __future__ import annotations

import numpy as np
import pytest

from llmtools.prep.curate.dedup.buckets import PAIR_DTYPE
from llmtools.prep.curate.dedup.clusters import cluster
from llmtools.prep.curate.dedup.config import DedupConfig
from llmtools.prep.curate.dedup.layout import Plan, pairs_path

BANDS = [
    [(1, 0, 1, 1), (1, 1, 1, 2), (0, 5, 0, 6), (0, 7, 0, 8)],  # {B0 B1 B2}: root B0; {A5 A6}; {A7 A8}
    [(0, 0, 1, 2), (0, 6, 0, 8)],  # A0 joins the bigger set (B0 stays root); a tie: A5's root stays
]


def _run_folder(tmp_path, sources: list[str], source_of: list[int]) -> Plan:
    config = DedupConfig(bands=2, rows=1, exact=False)
    plan = Plan(config, sources, ["a.jsonl", "b.jsonl"], [0, 0], source_of)
    for band, pairs in enumerate(BANDS):
        table = np.array(pairs, dtype="<u4").view(PAIR_DTYPE).reshape(-1)
        path = pairs_path(tmp_path, band, config)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(table.tobytes())
    return plan


def _removed(result) -> set[tuple[int, int]]:
    return set(zip(result.files[result.removed].tolist(), result.docs[result.removed].tolist(), strict=True))


def test_one_source_removes_what_datatrove_removes(tmp_path):
    pytest.importorskip("datatrove")
    from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupCluster

    plan = _run_folder(tmp_path / "ours", ["corpus"], [0, 0])
    ours = _removed(cluster(tmp_path / "ours", plan))
    dups = tmp_path / "dups"
    dups.mkdir()
    for band in range(2):
        (dups / f"{band:05d}_00.dups").write_bytes(
            pairs_path(tmp_path / "ours", band, plan.config).read_bytes()
        )
    MinhashDedupCluster(str(dups), str(tmp_path / "remove"), config=MinhashConfig(num_buckets=2)).run()
    theirs = set()
    for rank in range(2):
        path = tmp_path / "remove" / f"{rank:06d}.remove"
        theirs |= {(rank, int(d)) for d in np.fromfile(path, dtype="<u4")} if path.exists() else set()
    assert ours == theirs == {(1, 1), (1, 2), (0, 0), (0, 6), (0, 7), (0, 8)}


def test_the_first_ranked_source_keeps_its_copy(tmp_path):
    plan = _run_folder(tmp_path, ["first", "second"], [0, 1])
    result = cluster(tmp_path, plan)
    assert _removed(result) == {(1, 0), (1, 1), (1, 2), (0, 6), (0, 7), (0, 8)}  # A0 kept in place of B0
    assert result.cluster.tolist() == [0, 1, 1, 1, 1, 0, 0, 0]  # ids by first member: A0's cluster, A5's
