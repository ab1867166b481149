"""`llm-prep dedup --explain --plan-tokens N --tasks T INPUT...`: the stages of a run over a corpus of N
tokens, scaled from what a run over the given inputs (a sample of that corpus) measured. Bytes are
those of the documents' text (a compressed input reads fewer from disk).

The sample is deduplicated for real, in a temporary folder, and its per-input figures are read off the
files the stages wrote: signature bytes and duplicate pairs per input byte, documents per input byte and
per input. Scaled to the corpus (N tokens times --bytes-per-token bytes, the sample's ratio when known
from a tokenizer), they give per stage the tasks that can work at once, the bytes each reads and writes,
and the memory of its largest buffer:

* signatures: one band of one input sorted in memory (its records, twice: the sort's copy);
* buckets: one band (or the exact hashes) per unit, so at most bands + 1 tasks; a range of
  ``RANGE_RECORDS`` records sorted together (twice), whatever the corpus;
* clusters: one task; about 180 bytes per duplicate pair (benchmarks/bench_dedup.py: 1.8 GB for 10M);
* apply: as signatures; the input streamed, nothing held but one document; it writes the kept bytes.

Written by clusters: the removal tables (the clusters file, one line per cluster, comes on top).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from llmtools.prep.curate.dedup.buckets import PAIR_DTYPE, RANGE_RECORDS
from llmtools.prep.curate.dedup.clusters import REMOVE_DTYPE
from llmtools.prep.curate.dedup.config import DedupConfig
from llmtools.prep.curate.dedup.layout import Source, pair_units, pairs_path, sig_dir
from llmtools.prep.curate.dedup.signatures import EXACT_DTYPE, band_dtype

CLUSTER_BYTES_PER_PAIR = 180
"""The clusters stage's peak memory per duplicate pair, measured (benchmarks/bench_dedup.py)."""


def measure(config: DedupConfig, sources: list[Source], skip_bad: bool) -> dict:
    """Dedup the sample in a temporary folder and read its figures off the stages' files."""
    from llmtools.prep.curate.dedup.run import open_run, run_dedup

    with tempfile.TemporaryDirectory(prefix="llmtools-dedup-plan-") as tmp:
        out = Path(tmp) / "run"
        plan = open_run(out, config, sources, skip_bad, force=False)
        result = run_dedup(out, plan, "all", progress=False)
        files = range(len(plan.paths))
        signatures = sum(p.stat().st_size for f in files for p in sig_dir(out, f).iterdir())
        pairs = (
            sum(pairs_path(out, u, config).stat().st_size for u in pair_units(config)) // PAIR_DTYPE.itemsize
        )
        stats = result.stats or {}
    sources_stats = list(stats.get("sources", {}).values())
    return {
        "inputs": len(plan.paths),
        "bytes": sum(s["bytes"] for s in sources_stats),  # of text: tokens are counted in text
        "documents": sum(s["documents"] for s in sources_stats),
        "removed": sum(s["removed"] for s in sources_stats),
        "bytes_removed": sum(s["bytes_removed"] for s in sources_stats),
        "signature_bytes": signatures,
        "pairs": pairs,
    }


def stage_plan(config: DedupConfig, measured: dict, tokens: int, tasks: int, bytes_per_token: float) -> dict:
    """Per stage: tasks, bytes read and written per task, memory per task, for a corpus of `tokens`."""
    total = tokens * bytes_per_token
    scale = total / max(measured["bytes"], 1)
    documents = measured["documents"] * scale
    per_input = measured["documents"] / max(measured["inputs"], 1)
    band = band_dtype(config).itemsize
    signatures = measured["signature_bytes"] * scale
    pairs = measured["pairs"] * scale
    units = len(pair_units(config))
    bucket_tasks = min(tasks, units)
    return {
        "corpus": {"tokens": tokens, "bytes": int(total), "documents": int(documents),
                   "removed": int(measured["removed"] * scale), "bytes_per_token": bytes_per_token},
        "sample": measured,
        "stages": {
            "signatures": {"tasks": tasks, "read_per_task": int(total / tasks),
                           "write_per_task": int(signatures / tasks),
                           "memory_per_task": int(2 * per_input * max(band, EXACT_DTYPE.itemsize))},
            "buckets": {"tasks": bucket_tasks, "units": units,
                        "read_per_task": int(signatures / units * -(-units // bucket_tasks)),
                        "write_per_task": int(pairs * PAIR_DTYPE.itemsize / bucket_tasks),
                        "memory_per_task": 2 * RANGE_RECORDS * max(band, EXACT_DTYPE.itemsize)},
            "clusters": {"tasks": 1, "read_per_task": int(pairs * PAIR_DTYPE.itemsize),
                         "write_per_task": int(measured["removed"] * scale * REMOVE_DTYPE.itemsize),
                         "memory_per_task": int(pairs * CLUSTER_BYTES_PER_PAIR)},
            "apply": {"tasks": tasks, "read_per_task": int(total / tasks),
                      "write_per_task": int((measured["bytes"] - measured["bytes_removed"]) * scale / tasks),
                      "memory_per_task": None},
        },
    }  # fmt: skip


def _size(n: float | None) -> str:
    if n is None:
        return "one document"
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return ""


def plan_text(record: dict) -> str:
    c, s = record["corpus"], record["sample"]
    lines = [
        f"corpus: {c['tokens']:,} tokens x {c['bytes_per_token']:g} bytes = {_size(c['bytes'])}, about "
        f"{c['documents']:,} documents, {c['removed']:,} of them removed "
        f"(scaled from the sample: {s['inputs']} inputs, {_size(s['bytes'])}, {s['documents']:,} documents, "
        f"{s['pairs']:,} duplicate pairs)",
        f"  {'stage':<11} {'tasks':>6} {'read/task':>12} {'write/task':>12} {'memory/task':>14}",
    ]
    for name, st in record["stages"].items():
        lines.append(
            f"  {name:<11} {st['tasks']:>6,} {_size(st['read_per_task']):>12} {_size(st['write_per_task']):>12} "
            f"{_size(st['memory_per_task']):>14}"
        )
    buckets = record["stages"]["buckets"]
    if buckets["tasks"] < record["stages"]["signatures"]["tasks"]:
        lines.append(f"  (buckets: {buckets['units']} units, one per band and one for exact hashes, so at most "
                     f"{buckets['units']} tasks)")  # fmt: skip
    return "\n".join(lines)
