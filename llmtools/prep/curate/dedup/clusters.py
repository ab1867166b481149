"""Stage 3, one task: clusters from the duplicate pairs, and what each input loses.

The union-find is datatrove's `MinhashDedupCluster`: pairs read band after band in the order stage 2
wrote them (datatrove's), union by size, the first document's root winning a tie; the exact-duplicate
pairs come last, so they only join what MinHash left apart (texts too short to have shingles) and never
change a MinHash cluster's root. The kept member of a cluster is its root (datatrove keeps the root and
drops every other member); with several sources, the root is kept when it belongs to the first-ranked
source among the cluster's members, else that source's first member in input order.

Memory grows with the documents that have a duplicate (8 + 4 + 4 bytes each, plus numpy's work arrays),
never with the corpus: pairs are read from disk a block at a time."""

from __future__ import annotations

from array import array
from pathlib import Path

import numpy as np

from llmtools.errors import InputError
from llmtools.prep.curate.dedup.buckets import PAIR_DTYPE
from llmtools.prep.curate.dedup.layout import Plan, pair_units, pairs_path

BLOCK = 1 << 20
"""Pairs read from disk (and handed to the union-find as Python lists) at once."""
EXACT, NEAR = 1, 2
REMOVE_DTYPE = np.dtype(
    [("doc", "<u4"), ("kind", "u1"), ("cluster", "<u8"), ("kept_file", "<u4"), ("kept_doc", "<u4")]
)


def _blocks(path: Path):
    size = path.stat().st_size
    if size % PAIR_DTYPE.itemsize:
        raise InputError(f"{path}: {size} bytes, not a whole number of pairs (damaged?)")
    if size == 0:
        return
    pairs = np.memmap(path, dtype=PAIR_DTYPE, mode="r")
    for lo in range(0, len(pairs), BLOCK):
        block = np.asarray(pairs[lo : lo + BLOCK])
        yield (
            (block["f1"].astype(np.uint64) << np.uint64(32)) | block["d1"],
            (block["f2"].astype(np.uint64) << np.uint64(32)) | block["d2"],
        )


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """`np.unique` by sorting (numpy 2's hash-based unique is several times slower on 10**7 keys)."""
    values = np.sort(values)
    if len(values) > 1:
        values = values[np.concatenate(([True], values[1:] != values[:-1]))]
    return values


def _nodes(paths: list[Path]) -> np.ndarray:
    """Every document named by a pair, sorted (a node's key: input << 32 | document)."""
    parts = []
    for path in paths:
        for a, b in _blocks(path):
            parts.append(sorted_unique(np.concatenate([a, b])))
        if len(parts) > 1:
            parts = [sorted_unique(np.concatenate(parts))]
    return parts[0] if parts else np.empty(0, dtype=np.uint64)


class UnionFind:
    """datatrove's union-find on dense indices: union by size, path compression, `a`'s root on a tie."""

    def __init__(self, n: int) -> None:
        code = "i" if n < 2**31 else "q"  # 4 bytes a document wherever they suffice
        self.parent = array(code, range(n))
        self.size = array(code, [1]) * n

    def find(self, x: int) -> int:
        parent = self.parent
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    def union_all(self, a: list[int], b: list[int]) -> None:
        parent, size, find = self.parent, self.size, self.find
        for x, y in zip(a, b):  # noqa: B905 - same length
            ra = x if parent[x] == x else find(x)
            rb = y if parent[y] == y else find(y)
            if ra != rb:
                sa, sb = size[ra], size[rb]
                if sa < sb:
                    ra, rb = rb, ra
                parent[rb] = ra
                size[ra] = sa + sb

    def roots(self) -> np.ndarray:
        find = self.find
        return np.fromiter((find(x) for x in range(len(self.parent))), dtype=np.int64, count=len(self.parent))


class Clustering:
    """The result: for every node (sorted), its cluster id, kind and kept member; `removed` masks the nodes
    that are dropped."""

    def __init__(self, nodes, cluster, kept, removed, kind) -> None:
        self.nodes, self.cluster, self.kept, self.removed, self.kind = nodes, cluster, kept, removed, kind

    @property
    def files(self) -> np.ndarray:
        return (self.nodes >> np.uint64(32)).astype(np.int64)

    @property
    def docs(self) -> np.ndarray:
        return (self.nodes & np.uint64(0xFFFFFFFF)).astype(np.int64)


def cluster(out: Path, plan: Plan) -> Clustering:
    config = plan.config
    units = pair_units(config)
    paths = [pairs_path(out, u, config) for u in units]
    nodes = _nodes(paths)
    forest = UnionFind(len(nodes))
    exact_rep = np.arange(len(nodes), dtype=np.int64)
    for unit, path in zip(units, paths, strict=True):
        for a, b in _blocks(path):
            ia, ib = np.searchsorted(nodes, a), np.searchsorted(nodes, b)
            if unit == config.bands:
                exact_rep[ib] = ia  # a is the first of its group of identical texts
            forest.union_all(ia.tolist(), ib.tolist())
    roots = forest.roots()
    # cluster ids in the order of each cluster's first member, as datatrove numbers them
    root_values, first_member = np.unique(roots, return_index=True)  # the sorting path, not the hash one
    cluster_of_root = np.empty(len(nodes), dtype=np.int64)
    cluster_of_root[root_values[np.argsort(first_member, kind="stable")]] = np.arange(len(root_values))
    del root_values, first_member
    cluster_id = cluster_of_root[roots] if len(nodes) else np.empty(0, dtype=np.int64)
    del cluster_of_root
    kept = _kept(plan, nodes, roots, cluster_id, int(cluster_id.max()) + 1 if len(nodes) else 0)
    removed = kept != np.arange(len(nodes))
    kind = np.where(exact_rep == exact_rep[kept], EXACT, NEAR).astype(np.uint8)
    return Clustering(nodes, cluster_id, kept, removed, kind)


def _kept(plan: Plan, nodes, roots, cluster_id, clusters: int) -> np.ndarray:
    """The kept member (a node index) of each node's cluster (see the module)."""
    if len(plan.sources) == 1 or len(nodes) == 0:
        return roots
    source_of = np.asarray(plan.source_of, dtype=np.int64)
    rank = source_of[(nodes >> np.uint64(32)).astype(np.int64)]
    best = np.full(clusters, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(best, cluster_id, rank)
    choice = np.full(clusters, -1, dtype=np.int64)
    root_ok = rank[roots] == best[cluster_id]
    choice[cluster_id[root_ok]] = roots[root_ok]
    # else the first member (nodes are sorted) of the best source
    candidates = np.flatnonzero(rank == best[cluster_id])
    fallback = np.full(clusters, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(fallback, cluster_id[candidates], candidates)
    choice = np.where(choice >= 0, choice, fallback)
    return choice[cluster_id]


def removals(plan: Plan, result: Clustering) -> dict[int, np.ndarray]:
    """For each input with losses, its removed documents (sorted) with their kind, cluster and kept one."""
    index = np.flatnonzero(result.removed)
    files, docs = result.files, result.docs
    out: dict[int, np.ndarray] = {}
    if not len(index):
        return out
    by_file = index[np.argsort(files[index], kind="stable")]
    split = np.flatnonzero(np.diff(files[by_file])) + 1
    for group in np.split(by_file, split):
        table = np.empty(len(group), dtype=REMOVE_DTYPE)
        table["doc"] = docs[group]
        table["kind"] = result.kind[group]
        table["cluster"] = result.cluster[group]
        table["kept_file"] = files[result.kept[group]]
        table["kept_doc"] = docs[result.kept[group]]
        out[int(files[group[0]])] = table
    return out
