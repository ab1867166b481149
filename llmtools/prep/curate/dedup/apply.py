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
from llmtools.prep.curate.dedup.layout import InputDocs, Plan, remove_path
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
        )
        with open(group.path(stats_target), "w", encoding="utf-8") as handle:
            handle.write(jsonfile.dumps(stats, indent=1) + "\n")
    return stats
