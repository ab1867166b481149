#!/usr/bin/env python3
"""``llm-prep filter`` against datatrove, whole processes side by side, one core each.

The same JSONL (the sample corpus' stories with e-mail and IP addresses mixed in, repeated to
``--docs`` documents) goes through

* ``llm-prep filter IN -o OUT --pii email,ip --min-chars 50``: read, length bound, PII, write kept and
  removed documents and the stats;
* datatrove: ``JsonlReader -> LambdaFilter(len >= 50) -> PIIFormatter -> JsonlWriter`` in one
  ``LocalPipelineExecutor`` task (its exclusion writer is left out: less work on its side).

Reported: wall seconds of each process (start-up included), documents per second, and the ratio. Both are
pinned to one core (``taskset``) where the machine allows it. Goal: ours >= 2x datatrove per core.

    python benchmarks/bench_filter.py --docs 100000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent

DATATROVE = """
import sys
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.filters import LambdaFilter
from datatrove.pipeline.formatters import PIIFormatter
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers import JsonlWriter
src, out, logs = sys.argv[1:4]
LocalPipelineExecutor(pipeline=[
    JsonlReader(src, glob_pattern="*.jsonl", doc_progress=False),
    LambdaFilter(lambda doc: len(doc.text) >= 50),
    PIIFormatter(),
    JsonlWriter(out, compression=None),
], tasks=1, workers=1, logging_dir=logs).run()
"""


def corpus(folder: Path, docs: int) -> Path:
    subprocess.run([BIN / "llm-prep", "sample-corpus", "-o", folder / "raw", "--docs", "2000", "--style", "stories"],
                   check=True, capture_output=True)  # fmt: skip
    stories = [json.loads(x)["text"] for x in (folder / "raw" / "stories.jsonl").read_text().splitlines()]
    rng = random.Random(0)
    src = folder / "in"
    src.mkdir()
    with open(src / "corpus.jsonl", "w", encoding="utf-8") as handle:
        for i in range(docs):
            text = stories[i % len(stories)]
            if rng.random() < 0.3:
                text += f" Write to user{i}@mail.example.net or 8.{i % 250}.{rng.randint(0, 255)}.1."
            if rng.random() < 0.05:
                text = text[:30]
            handle.write(json.dumps({"text": text, "id": str(i)}) + "\n")
    return src / "corpus.jsonl"


def timed(argv: list, env=None) -> float:
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    start = time.perf_counter()
    proc = subprocess.run([*pin, *map(str, argv)], capture_output=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr.decode()[-2000:])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=50_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        src = corpus(folder, args.docs)
        ours = timed([BIN / "llm-prep", "filter", src, "-o", folder / "ours.jsonl", "--pii", "email,ip",
                      "--min-chars", "50", "-q"])  # fmt: skip
        env = {**os.environ, "DATATROVE_COLORIZE_LOGS": "0"}
        theirs = timed([sys.executable, "-c", DATATROVE, src.parent, folder / "dt", folder / "logs"], env)
        kept = sum(1 for _ in open(folder / "ours.jsonl", "rb"))
        print(json.dumps({
            "documents": args.docs, "kept": kept,
            "ours_seconds": round(ours, 2), "datatrove_seconds": round(theirs, 2),
            "ours_docs_per_s": round(args.docs / ours), "datatrove_docs_per_s": round(args.docs / theirs),
            "speedup": round(theirs / ours, 2),
        }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
