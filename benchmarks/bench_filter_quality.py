#!/usr/bin/env python3
"""``llm-prep filter --recipe fineweb`` against datatrove's FineWeb filters, whole processes side by side.

The same web-like JSONL (``--docs`` documents built from real text in ../shared/data: OpenWebText
paragraphs, LAMBADA passages, Shakespeare speeches, with the boilerplate of crawled pages mixed in: menus,
cookie notices, share buttons, bullets, repeated lines) goes through

* ``llm-prep filter IN -o OUT --recipe fineweb``: read, Gopher repetition, Gopher quality, C4 quality
  (FineWeb's settings), FineWeb quality, write the kept documents, the removed records and the stats;
* datatrove: ``JsonlReader -> GopherRepetitionFilter -> GopherQualityFilter ->
  C4QualityFilter(filter_no_terminal_punct=False) -> FineWebQualityFilter -> JsonlWriter`` in one
  ``LocalPipelineExecutor`` task (no exclusion writers: less work on its side).

Reported: CPU seconds of each process (start-up included; documents per CPU second is documents per
second per core, whatever else the machine runs), wall seconds, and the ratios. The two kept outputs are
compared text for text. Both are pinned to one core (``taskset``) where the machine allows it.
Goal: ours >= 2x datatrove per core.

    python benchmarks/bench_filter_quality.py --docs 20000
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
DATA = Path(os.environ.get("LLMTOOLS_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))

DATATROVE = """
import sys
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.filters import (C4QualityFilter, FineWebQualityFilter, GopherQualityFilter,
                                        GopherRepetitionFilter)
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers import JsonlWriter
src, out, logs = sys.argv[1:4]
LocalPipelineExecutor(pipeline=[
    JsonlReader(src, glob_pattern="*.jsonl", doc_progress=False),
    GopherRepetitionFilter(),
    GopherQualityFilter(),
    C4QualityFilter(filter_no_terminal_punct=False),
    FineWebQualityFilter(),
    JsonlWriter(out, compression=None),
], tasks=1, workers=1, logging_dir=logs).run()
"""

BOILERPLATE = [
    "Home", "About us", "Contact", "Menu", "Share this:", "Click to share on Twitter (Opens in new window)",
    "This website uses cookies to improve your experience.", "Read our Privacy Policy and Terms of Use.",
    "Please enable JavaScript to view the comments.", "Posted in News | Leave a comment", "Related posts",
    "Next article »", "© 2019 All rights reserved.", "Sign up for our newsletter", "Tags: news, world, local",
]  # fmt: skip


def paragraphs() -> list[str]:
    """Real paragraphs: OpenWebText, LAMBADA, Shakespeare, C4."""
    out: list[str] = []
    web = DATA / "megatron-deepspeed-fixtures" / "openwebtext-1000.reconstructed.jsonl"
    for line in web.read_text(encoding="utf-8").splitlines():
        out += [p.strip() for p in json.loads(line)["text"].split("\n") if len(p.split()) > 3]
    for line in (DATA / "lambada" / "lambada_test.jsonl").read_text(encoding="utf-8").splitlines():
        out.append(json.loads(line)["text"].strip())
    for line in (DATA / "tinyshakespeare" / "input.jsonl").read_text(encoding="utf-8").splitlines():
        out.append(json.loads(line)["text"].strip())
    for path in sorted((DATA / "c4-samples").glob("c4-sample.*.json.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            out += [p for line in handle for p in json.loads(line)["text"].split("\n") if p.strip()]
    return [p for p in out if p]


def corpus(folder: Path, docs: int, seed: int = 0) -> Path:
    pool = paragraphs()
    rng = random.Random(seed)
    src = folder / "in"
    src.mkdir()
    with open(src / "web.jsonl", "w", encoding="utf-8") as handle:
        for number in range(docs):
            lines: list[str] = []
            if rng.random() < 0.5:
                lines += rng.sample(BOILERPLATE, rng.randint(1, 5))
            for _ in range(rng.choice([1, 1, 2, 3, 4, 6])):
                lines.append(rng.choice(pool))
                if rng.random() < 0.1:
                    lines.append("• " + rng.choice(pool)[:80])
            if rng.random() < 0.1:
                lines += rng.sample(lines, min(len(lines), 3))  # repeated lines
            if rng.random() < 0.4:
                lines += rng.sample(BOILERPLATE, rng.randint(1, 4))
            text = rng.choice(["\n", "\n\n"]).join(lines)
            handle.write(json.dumps({"text": text, "id": str(number)}, ensure_ascii=False) + "\n")
    return src / "web.jsonl"


def timed(argv: list, env=None) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one process."""
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([*pin, *map(str, argv)], capture_output=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr.decode()[-2000:])
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def kept_texts(path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        src = corpus(folder, args.docs)
        chars = sum(len(json.loads(line)["text"]) for line in src.read_text(encoding="utf-8").splitlines())
        ours_wall, ours_cpu = timed(
            [BIN / "llm-prep", "filter", src, "-o", folder / "ours.jsonl", "--recipe", "fineweb", "-q"]
        )
        env = {**os.environ, "DATATROVE_COLORIZE_LOGS": "0"}
        theirs_wall, theirs_cpu = timed(
            [sys.executable, "-c", DATATROVE, src.parent, folder / "dt", folder / "logs"], env
        )
        ours = kept_texts(folder / "ours.jsonl")
        theirs = kept_texts(next((folder / "dt").glob("*.jsonl")))
        print(json.dumps({
            "documents": args.docs, "characters": chars, "kept": len(ours), "same_kept_texts": ours == theirs,
            "ours_cpu_seconds": round(ours_cpu, 2), "datatrove_cpu_seconds": round(theirs_cpu, 2),
            "ours_docs_per_cpu_s": round(args.docs / ours_cpu), "datatrove_docs_per_cpu_s": round(args.docs / theirs_cpu),
            "speedup_per_core": round(theirs_cpu / ours_cpu, 2),
            "ours_wall_seconds": round(ours_wall, 2), "datatrove_wall_seconds": round(theirs_wall, 2),
            "speedup_wall": round(theirs_wall / ours_wall, 2),
        }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
