"""Duplicates a blend holds twice, from the dedup provenance of its sources' sidecars.

``llm-prep dedup`` run over several sources records, in each output's curation stats (carried into the
sidecar by ``json2bin --provenance``), the run it belongs to, its source's name, and the documents it
shared with each other source of the run, and which source kept them. Two sources of a blend whose
provenance names the same run were deduplicated together: the documents they shared are in one of them
only, and nothing is said. Otherwise:

* a source that kept N documents whose copies the run removed from source NAME, blended with a source
  deduplicated as NAME in another run that did not remove them (no row of it says they were kept in
  the first): the N documents are in the blend twice — warned, with the count;
* two sources deduplicated in different runs, neither of which removed the other's copies: the duplicates
  across them were never looked for — warned, the amount unknown.

A warning, not a refusal as for identical content: drawing some documents twice may be meant (a source
upweighted on purpose), listing the same dataset twice never is.
"""

from __future__ import annotations

from collections import defaultdict


def _blocks(sidecar: dict | None) -> list[dict]:
    """The dedup blocks of a sidecar's curation record that have their shape (others are skipped: the
    curation table of --explain says when a record is not one this llmtools reads)."""
    from llmtools.formats.curation_stats import check_dedup

    out = []
    for stage in (sidecar or {}).get("curation") or []:
        if not isinstance(stage, dict) or stage.get("command") != "dedup" or "dedup" not in stage:
            continue
        try:
            out.append(check_dedup(stage["dedup"], stage["documents"]["removed"]))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def overlap_warnings(sources: list) -> list[str]:
    """Per pair of sources of the blend (``source.prefix``, ``source.sidecar``) whose dedup runs left
    duplicates of each other in: one warning, with the count when the provenance gives it."""
    blocks = {i: b for i, s in enumerate(sources) if (b := _blocks(s.sidecar))}
    warnings = []
    ids = sorted(blocks)
    for at, i in enumerate(ids):
        for j in ids[at + 1 :]:
            if {b["run"] for b in blocks[i]} & {b["run"] for b in blocks[j]}:
                continue  # deduplicated together (or parts of one source): the overlap was removed
            counted = _left_in(sources, blocks, i, j) + _left_in(sources, blocks, j, i)
            if counted:
                warnings += counted
            elif not _looked_at(blocks[i], blocks[j]) and not _looked_at(blocks[j], blocks[i]):
                warnings.append(
                    f"{sources[j].prefix}: deduplicated in another run than {sources[i].prefix}: the "
                    "duplicates across them were not removed (how many is unknown; `llm-prep dedup --source "
                    "NAME=FILES` for both removes them)"
                )
    return warnings


def _names(blocks: list[dict]) -> set[str]:
    return {b["source"] for b in blocks}


def _looked_at(mine: list[dict], theirs: list[dict]) -> bool:
    """Whether a run of `mine` measured its overlap with a source named as one of `theirs`."""
    names = _names(theirs)
    return any(row["with"] in names for b in mine for row in b["shared"])


def _left_in(sources: list, blocks: dict, kept: int, other: int) -> list[str]:
    """The documents source `kept` kept whose copies its run removed from a source of `other`'s name,
    when `other` comes from another run that did not remove them itself."""
    mine, theirs = blocks[kept], blocks[other]
    my_names = _names(mine)
    if any(row["with"] in my_names and row["kept_in"] == row["with"] for b in theirs for row in b["shared"]):
        return []  # `other`'s own run removed its copies of `kept`'s documents
    counted: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for b in mine:
        for row in b["shared"]:
            if row["kept_in"] == b["source"] and row["with"] in _names(theirs):
                counted[row["with"]][0] += row["documents"]
                counted[row["with"]][1] += row["characters"]
    a, b_ = sources[kept].prefix, sources[other].prefix
    return [
        f"{b_}: {docs:,} documents ({chars:,} characters) of the source {name} are duplicates of documents "
        f"in {a}: the dedup run of {a} removed them from {name}, but {b_} is {name} deduplicated in "
        "another run, without them removed; blend the outputs of one run (`llm-prep dedup --source`)"
        for name, (docs, chars) in counted.items()
        if docs
    ]
