"""The index as the command makes and opens it: written through the outputs' one skeleton (lock, marker,
atomic rename), or built in memory for one run."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from llmtools.prep.dataset_output import DatasetOutput
from llmtools.progress import Progress

from . import index as ngram_index
from .sources import EvalSource, open_sources

KIND = "llmtools.ngram-index"


def index_output(path: str, force: bool) -> DatasetOutput:
    return DatasetOutput(files={path: {"kind": KIND}}, force=force, clear_stale=True)


def _eval_bytes(sources: list[EvalSource]) -> int:
    return sum(source.path.stat().st_size for source in sources)


def write_index(sources: list[EvalSource], n: int, path: str | os.PathLike, progress: bool = True) -> dict:
    """Build the index of ``sources`` and write it to ``path`` (a temporary of the caller's); its header."""
    bar = Progress(_eval_bytes(sources), "n-gram index", unit="B", enabled=progress)
    try:
        header, key, check, task = ngram_index.build(sources, n, progress=lambda chars: bar.update(chars))
    finally:
        bar.close()
    with open(path, "wb") as handle:
        ngram_index.write_to(handle, header, key, check, task)
    return header


@dataclass
class IndexResult:
    paths: list[Path]
    header: dict
    seconds: float

    def summary(self) -> str:
        size = sum(p.stat().st_size for p in self.paths)
        tasks = self.header["tasks"]
        return (
            f"{len(tasks):,} tasks, {sum(t['texts'] for t in tasks):,} texts, {self.header['entries']:,} entries "
            f"(each task's distinct {self.header['n']}-grams); {size / 1e6:.1f} MB in {self.seconds:.2f} s"
        )

    def to_dict(self) -> dict:
        return {
            "paths": [str(p) for p in self.paths],
            "seconds": round(self.seconds, 4),
            "header": self.header,
        }


@contextlib.contextmanager
def open_index(
    path: str | None, evals: list[str], n: int, key: str | None, progress: bool = True
) -> Iterator[tuple[ngram_index.NgramIndex, dict]]:
    """The index to look up in: the file ``path``, or one built from ``evals`` into a temporary folder
    removed afterwards. Also what the stats record of it: its file, n, and per task name and sha256."""
    with contextlib.ExitStack() as stack:
        if path is None:
            sources = open_sources(evals, key)
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="llmtools-ngrams-"))
            path = str(Path(folder) / "eval.ngrams")
            write_index(sources, n, path, progress)
            where = None
        else:
            where = path
        index = ngram_index.NgramIndex(path)
        stack.callback(index.close)
        tasks = [
            {"name": t["name"], "sha256": t.get("sha256"), "distinct": t["distinct"]}
            for t in index.header["tasks"]
        ]
        yield (
            index,
            {"index": where, "n": index.n, "normalization": index.header["normalization"], "tasks": tasks},
        )
