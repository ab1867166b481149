"""Stage 4, one unit per input: its kept documents, byte for byte as read, with the removed ones' records
and the curation stats of the output beside them (:mod:`llmtools.formats.curation_stats`, command
``dedup``, rules ``dedup.exact`` and ``dedup.near``)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from llmtools.errors import InputError
from llmtools.formats import jsonfile
from llmtools.formats.curation_stats import build_stats
from llmtools.fsutil import atomic_group
from llmtools.prep.curate.dedup.clusters import EXACT, REMOVE_DTYPE
from llmtools.prep.curate.dedup.layout import InputDocs, Plan, kept_for_path, remove_path
from llmtools.prep.curate.dedup.report import KIND_NAMES, load_docs

RULES = {EXACT: "dedup.exact", 2: "dedup.near"}
REMOVED_SUFFIX = ".removed"
STATS_SUFFIX = ".stats.json"


def kept_path(out: Path, plan: Plan, file: int) -> Path:
    return out / "kept" / plan.sources[plan.source_of[file]] / plan.label(file)


def apply_done(out: Path, plan: Plan, file: int) -> bool:
    return Path(f"{kept_path(out, plan, file)}{STATS_SUFFIX}").exists()


def _removals(out: Path, plan: Plan, file: int, documents: int) -> np.ndarray:
    path = remove_path(out, file)
    if not path.exists():
        return np.empty(0, dtype=REMOVE_DTYPE)
    table = np.load(path, allow_pickle=False)
    if table.dtype != REMOVE_DTYPE or table.ndim != 1:
        raise InputError(f"{path}: not a removal table of this llmtools (damaged?)")
    docs = table["doc"].astype(np.int64)
    if len(docs) and (np.any(np.diff(docs) <= 0) or docs[-1] >= documents):
        raise InputError(f"{path}: document indices out of order or past the input's {documents} (damaged?)")
    return table


def _kept_for(out: Path, plan: Plan, file: int) -> np.ndarray:
    path = kept_for_path(out, file)
    if not path.exists():
        return np.zeros((len(plan.sources), 2), dtype=np.int64)
    table = np.load(path, allow_pickle=False)
    if table.dtype != np.int64 or table.shape != (len(plan.sources), 2) or (table < 0).any():
        raise InputError(f"{path}: not a table of documents kept for other sources (damaged?)")
    return table


def shared_rows(plan: Plan, file: int, lost: dict[int, list[int]], kept_for: np.ndarray) -> list[dict]:
    """The output's overlap with each other source of the run: the documents (and characters) removed
    here whose copy another source kept (``kept_in`` that source), and those another source lost because
    this output kept their copy (``kept_in`` this one)."""
    name = plan.sources[plan.source_of[file]]
    rows = []
    for rank, other in enumerate(plan.sources):
        if other == name:
            continue
        if rank in lost:
            documents, characters = lost[rank]
            rows.append({"with": other, "kept_in": other, "documents": documents, "characters": characters})
        if kept_for[rank, 0]:
            rows.append({"with": other, "kept_in": name, "documents": int(kept_for[rank, 0]),
                         "characters": int(kept_for[rank, 1])})  # fmt: skip
    return rows


def apply_file(out: Path, plan: Plan, file: int) -> dict:
    """Write input `file`'s kept, removed and stats files together; returns the stats."""
    table = load_docs(out, file)
    removals = _removals(out, plan, file, len(table))
    drop = dict(zip(removals["doc"].tolist(), range(len(removals)), strict=True))
    kept_lines = {}
    target = kept_path(out, plan, file)
    removed_target = Path(f"{target}{REMOVED_SUFFIX}")
    stats_target = Path(f"{target}{STATS_SUFFIX}")
    counts = {"in": 0, "kept": 0, "removed": 0, "changed": 0}
    chars = {"in": 0, "kept": 0, "removed": 0}
    rules: dict[str, dict[str, int]] = {}
    lost: dict[int, list[int]] = {}  # per other source that kept the copy: documents, characters
    digest, size = hashlib.sha256(), 0
    docs = InputDocs(plan, file)
    with atomic_group() as group:
        with open(group.path(target), "wb") as kept, open(group.path(removed_target), "wb") as removed:
            for doc in docs:
                if doc.index >= len(table) or int(table["line"][doc.index]) != doc.line:
                    raise InputError(
                        f"{plan.paths[file]}:{doc.line}: not the document the signatures stage read there "
                        "(the input changed since; run again from the start)"
                    )
                n = len(doc.text)
                counts["in"] += 1
                chars["in"] += n
                at = drop.get(doc.index)
                if at is None:
                    line = doc.row + b"\n"
                    kept.write(line)
                    digest.update(line)
                    size += len(line)
                    counts["kept"] += 1
                    chars["kept"] += n
                    continue
                entry = removals[at]
                rule = RULES[int(entry["kind"])]
                counts["removed"] += 1
                chars["removed"] += n
                cell = rules.setdefault(rule, {"documents": 0, "characters": 0})
                cell["documents"] += 1
                cell["characters"] += n
                kept_file, kept_doc = int(entry["kept_file"]), int(entry["kept_doc"])
                if plan.source_of[kept_file] != plan.source_of[file]:
                    cell = lost.setdefault(plan.source_of[kept_file], [0, 0])
                    cell[0] += 1
                    cell[1] += n
                kept_line = kept_lines.get(kept_file)
                if kept_line is None:
                    kept_line = kept_lines[kept_file] = load_docs(out, kept_file)["line"]
                record = {"source": plan.paths[file], "line": doc.line}
                if "id" in doc.obj:
                    record["id"] = doc.obj["id"]
                record.update(step="dedup", rule=rule, values={
                    "kind": KIND_NAMES[int(entry["kind"])],
                    "cluster": int(entry["cluster"]),
                    "kept": {"source": plan.sources[plan.source_of[kept_file]], "path": plan.paths[kept_file],
                             "line": int(kept_line[kept_doc])},
                })  # fmt: skip
                removed.write(jsonfile.dumps(record).encode("utf-8") + b"\n")
        if counts["in"] != len(table):
            raise InputError(
                f"{plan.paths[file]}: {counts['in']} documents now, {len(table)} when signed (it changed)"
            )
        stats = build_stats(
            command="dedup",
            steps=[{"name": "dedup", "params": plan.config.record()}],
            inputs=docs.inputs,
            shard=None,
            output={"path": str(target), "bytes": size, "sha256": digest.hexdigest()},
            removed=str(removed_target),
            documents=counts,
            characters=chars,
            skipped=docs.skipped,
            rules=rules,
            changes={},
            dedup={"run": plan.identity, "source": plan.sources[plan.source_of[file]],
                   "shared": shared_rows(plan, file, lost, _kept_for(out, plan, file))},
        )  # fmt: skip
        with open(group.path(stats_target), "w", encoding="utf-8") as handle:
            handle.write(jsonfile.dumps(stats, indent=1) + "\n")
    return stats
