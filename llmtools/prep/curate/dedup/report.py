"""What the clusters stage writes: each input's removals, the clusters file and the run's stats.

The run's stats (``OUT/stats.json``, format ``llmtools.dedup-stats`` version 1) add to the curation stats
of each output (written by the apply stage) what only the whole run knows::

    {"format": "llmtools.dedup-stats", "version": 1, "tool", "config", "explain",
     "sources": {NAME: {"inputs", "documents", "kept", "removed", "exact_duplicates", "near_duplicates",
                        "bytes", "bytes_removed", "characters", "characters_removed", "skipped"}},
     "across_sources": [{"removed_from", "kept_in", "documents", "bytes", "characters"}],  # ordered pairs
     "pairs": {"band_000": N, ..., "exact": N},   # candidate pairs each band found
     "clusters": {"count", "documents", "largest"}}

A removed document counts as an exact duplicate when its normalised text is the kept member's, else as a
near duplicate; a document shared by two sources is counted once, as removed from the later-ranked one and
kept in the first, and shows in ``across_sources`` as that pair."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llmtools import __version__
from llmtools.formats import jsonfile
from llmtools.fsutil import atomic_group
from llmtools.prep.curate.dedup.buckets import PAIR_DTYPE
from llmtools.prep.curate.dedup.clusters import EXACT, NEAR, Clustering, removals
from llmtools.prep.curate.dedup.layout import (
    Plan,
    kept_for_path,
    pair_units,
    pairs_path,
    remove_path,
    sig_dir,
)

STATS_FORMAT = "llmtools.dedup-stats"
STATS_VERSION = 1
KIND_NAMES = {EXACT: "exact", NEAR: "near"}


def load_docs(out: Path, file: int) -> np.ndarray:
    return np.load(sig_dir(out, file) / "docs.npy", mmap_mode="r", allow_pickle=False)


def load_input_record(out: Path, file: int) -> dict:
    return jsonfile.read_json_object(sig_dir(out, file) / "input.json", "dedup input record", ours=True)


def _fragments(plan: Plan) -> list[str]:
    """Per input, the start of a member's JSON object, up to its line number (written once, not per member:
    a cluster file of 10**7 members is written in seconds)."""
    out = []
    for file, path in enumerate(plan.paths):
        head = jsonfile.dumps({"source": plan.sources[plan.source_of[file]], "path": path, "line": 0})
        out.append(head[: -len("0}")])
    return out


def write_cluster_outputs(out: Path, plan: Plan, result: Clustering) -> dict:
    """Removals per input, OUT/clusters.jsonl and OUT/stats.json, renamed into place together."""
    files = range(len(plan.paths))
    docs = {f: load_docs(out, f) for f in files}
    by_file = removals(plan, result)
    stats = run_stats(out, plan, result, docs, by_file)
    with atomic_group() as group:
        for file, table in by_file.items():
            np.save(group.path(remove_path(out, file), suffix=".npy"), table, allow_pickle=False)
        for file, table in kept_for(plan, docs, by_file).items():
            np.save(group.path(kept_for_path(out, file), suffix=".npy"), table, allow_pickle=False)
        with open(group.path(out / "clusters.jsonl"), "w", encoding="utf-8") as handle:
            _write_clusters(handle, plan, result, docs)
        with open(group.path(out / "stats.json"), "w", encoding="utf-8") as handle:
            handle.write(jsonfile.dumps(stats, indent=1) + "\n")
    return stats


def kept_for(plan: Plan, docs: dict, by_file: dict) -> dict[int, np.ndarray]:
    """Per input that kept the copy of a document another source lost: per source, the documents it lost
    so and their characters (the apply stage writes them into that input's curation stats)."""
    out: dict[int, np.ndarray] = {}
    source_of = np.asarray(plan.source_of, dtype=np.int64)
    for file, removed in by_file.items():
        rank = int(source_of[file])
        kept_file = removed["kept_file"].astype(np.int64)
        other = source_of[kept_file] != rank
        if not other.any():
            continue
        chars = docs[file]["nchars"][removed["doc"][other]].astype(np.int64)
        for kept in np.unique(kept_file[other]).tolist():
            mask = kept_file[other] == kept
            table = out.setdefault(kept, np.zeros((len(plan.sources), 2), dtype=np.int64))
            table[rank, 0] += int(mask.sum())
            table[rank, 1] += int(chars[mask].sum())
    return out


WRITE_BLOCK = 1 << 20
"""Members turned into text at once: bounds the clusters file's strings in memory to ~100 MB."""


def _write_clusters(handle, plan: Plan, result: Clustering, docs: dict) -> None:
    """One line per cluster, in cluster-id order: its members (input order) and the kept one:
    {"cluster": ID, "size": N, "kept": MEMBER, "members": [MEMBER, ...]}, a removed member with its "kind"."""
    n = len(result.nodes)
    if not n:
        return
    files, doc_index = result.files, result.docs
    lines = np.zeros(n, dtype=np.int64)
    for file in np.unique(files).tolist():
        mask = files == file
        lines[mask] = docs[file]["line"][doc_index[mask]]
    head = _fragments(plan)
    tails = {0: "}", EXACT: ', "kind": "exact"}', NEAR: ', "kind": "near"}'}
    order = np.argsort(result.cluster, kind="stable")  # by cluster, members in input order
    starts = np.flatnonzero(np.concatenate(([True], np.diff(result.cluster[order]) != 0)))
    ends = np.append(starts[1:], n)
    at = 0
    while at < len(starts):
        # whole clusters, about WRITE_BLOCK members (one larger cluster alone is written whole)
        stop = max(at + 1, int(np.searchsorted(starts, starts[at] + WRITE_BLOCK, side="right")))
        lo, hi = int(starts[at]), int(ends[stop - 1])
        block = order[lo:hi]
        kinds = np.where(result.removed[block], result.kind[block], 0).tolist()
        member = [
            f"{head[f]}{line}{tails[k]}"
            for f, line, k in zip(files[block].tolist(), lines[block].tolist(), kinds, strict=True)
        ]
        for start, end in zip(starts[at:stop].tolist(), ends[at:stop].tolist(), strict=True):
            first = int(order[start])
            kept = int(result.kept[first])
            handle.write(
                f'{{"cluster": {int(result.cluster[first])}, "size": {end - start}, '
                f'"kept": {head[int(files[kept])]}{int(lines[kept])}}}, '
                f'"members": [{", ".join(member[start - lo : end - lo])}]}}\n'
            )
        at = stop


def run_stats(out: Path, plan: Plan, result: Clustering, docs: dict, by_file: dict) -> dict:
    names = plan.sources
    sources = {
        name: dict.fromkeys(
            (
                "inputs",
                "documents",
                "kept",
                "removed",
                "exact_duplicates",
                "near_duplicates",
                "bytes",
                "bytes_removed",
                "characters",
                "characters_removed",
            ),
            0,
        )
        | {"skipped": {}}
        for name in names
    }
    across = {(a, b): {"documents": 0, "bytes": 0, "characters": 0} for a in names for b in names}
    for file, table in docs.items():
        entry = sources[names[plan.source_of[file]]]
        entry["inputs"] += 1
        entry["documents"] += len(table)
        entry["bytes"] += int(table["nbytes"].sum())
        entry["characters"] += int(table["nchars"].sum())
        for kind, count in load_input_record(out, file)["skipped"].items():
            entry["skipped"][kind] = entry["skipped"].get(kind, 0) + int(count)
    for file, removed in by_file.items():
        name = names[plan.source_of[file]]
        entry = sources[name]
        nbytes = docs[file]["nbytes"][removed["doc"]].astype(np.int64)
        entry["removed"] += len(removed)
        entry["exact_duplicates"] += int((removed["kind"] == EXACT).sum())
        entry["near_duplicates"] += int((removed["kind"] == NEAR).sum())
        entry["bytes_removed"] += int(nbytes.sum())
        nchars = docs[file]["nchars"][removed["doc"]].astype(np.int64)
        entry["characters_removed"] += int(nchars.sum())
        kept_source = np.asarray(plan.source_of, dtype=np.int64)[removed["kept_file"].astype(np.int64)]
        for rank in np.unique(kept_source).tolist():
            mask = kept_source == rank
            cell = across[(name, names[rank])]
            cell["documents"] += int(mask.sum())
            cell["bytes"] += int(nbytes[mask].sum())
            cell["characters"] += int(nchars[mask].sum())
    for entry in sources.values():
        entry["kept"] = entry["documents"] - entry["removed"]
        entry["skipped"] = dict(sorted(entry["skipped"].items()))
    sizes = np.bincount(result.cluster) if len(result.cluster) else np.zeros(0, dtype=np.int64)
    config = plan.config
    return {
        "format": STATS_FORMAT,
        "version": STATS_VERSION,
        "tool": f"llmtools {__version__}",
        "config": config.record(),
        "explain": config.explain(),
        "sources": sources,
        "across_sources": [{"removed_from": a, "kept_in": b, **cell} for (a, b), cell in across.items()],
        "pairs": {
            pairs_path(out, unit, config).stem: pairs_path(out, unit, config).stat().st_size
            // PAIR_DTYPE.itemsize
            for unit in pair_units(config)
        },
        "clusters": {
            "count": len(sizes),
            "documents": int(sizes.sum()),
            "largest": int(sizes.max()) if len(sizes) else 0,
        },
    }
