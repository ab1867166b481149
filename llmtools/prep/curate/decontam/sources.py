"""The evaluation texts whose n-grams are removed from training data, read from local files.

* a task file of ours (``*.jsonl``: multiple-choice or perplexity examples, the files ``llm-ckpt eval``
  and ``eval.tasks`` read, by the same reader, :func:`llmtools.formats.tasks.read_task_files`), or a
  folder of them (each ``*.jsonl`` in it one task). A perplexity example registers its ``text``; a
  multiple-choice example its ``context`` and its context followed by the right choice (what the model
  is scored on, so an n-gram that runs from the question into the answer counts too);
* plain JSON lines with ``key`` given: the string under that key of each line is one evaluation text;
* any other file: plain UTF-8 text, the whole file one evaluation text (read by lines, never whole).

Each source is one task, named after its file (without ``.jsonl``/``.json``/``.txt``); names must differ.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from llmtools.errors import InputError
from llmtools.formats import jsonfile
from llmtools.formats.tasks import MAX_LINE_BYTES, read_task_files, task_name
from llmtools.fsutil import sha256_file

MAX_TASKS = 65535  # a task's id is stored in 16 bits
_JSON_SUFFIXES = (".jsonl", ".json")


@dataclass
class EvalSource:
    """One task: where it came from and how to read its texts."""

    name: str
    path: Path
    kind: str  # task (multiple_choice or perplexity once read), jsonl or text
    key: str | None = None

    def describe(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "path": jsonfile.portable(os.fsdecode(self.path)),
            "bytes": self.path.stat().st_size,
            "sha256": sha256_file(self.path),
            **({"key": self.key} if self.key else {}),
        }

    def texts(self) -> Iterator[Iterator[str]]:
        """Each evaluation text as pieces cut at whitespace (so words never straddle two pieces)."""
        if self.kind == "task":
            # One task in memory at a time: the reader checks a whole file before it is used.
            (task,) = read_task_files([str(self.path)], where=str(self.path))
            self.kind = task.kind
            for item in task.examples:
                if task.kind == "perplexity":
                    yield iter((item["text"],))
                else:
                    yield iter((item["context"],))
                    yield iter((item["context"] + item["choices"][item["gold"]],))
        elif self.kind == "jsonl":
            yield from self._jsonl_texts()
        else:
            yield self._lines()

    def _jsonl_texts(self) -> Iterator[Iterator[str]]:
        for number, item in jsonfile.read_lines(
            self.path, max_line=MAX_LINE_BYTES, finite=True, strings=True
        ):
            if not isinstance(item, dict):
                raise InputError(f"{self.path}:{number}: expected a JSON object, got {type(item).__name__}")
            if self.key not in item:
                raise InputError(f"{self.path}:{number}: no key {self.key!r} (--key)")
            text = item[self.key]
            if not isinstance(text, str):
                raise InputError(
                    f"{self.path}:{number}: {self.key}: expected a string, got {type(text).__name__}"
                )
            yield iter((text,))

    def _lines(self) -> Iterator[str]:
        try:
            handle = open(self.path, "rb")  # noqa: SIM115 - closed in the finally below
        except OSError as error:
            raise InputError(f"{self.path}: cannot read ({error.strerror})") from None
        try:
            number = 0
            while True:
                raw = handle.readline(MAX_LINE_BYTES + 1)
                if not raw:
                    return
                number += 1
                if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                    raise InputError(f"{self.path}:{number}: a line longer than {MAX_LINE_BYTES:,} bytes")
                try:
                    yield raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise InputError(
                        f"{self.path}:{number}: invalid UTF-8 (byte 0x{raw[error.start]:02x} at column {error.start + 1})"
                    ) from None
        finally:
            handle.close()


def open_sources(specs: list[str], key: str | None = None) -> list[EvalSource]:
    """Every evaluation source named on the command line, checked before any n-gram is made."""
    if not specs:
        raise InputError("give at least one evaluation set (a task file, a folder of them, JSONL or text)")
    sources: list[EvalSource] = []
    for spec in specs:
        path = Path(spec)
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix == ".jsonl" and p.is_file())
            if not files:
                raise InputError(f"{path}: a task folder without task files (*.jsonl)")
            sources.extend(EvalSource(task_name(f), f, "task") for f in files)
        elif not path.is_file():
            raise InputError(f"{path}: no such evaluation file or folder")
        elif path.suffix in _JSON_SUFFIXES and key is None:
            sources.append(EvalSource(task_name(path), path, "task"))
        elif path.suffix in _JSON_SUFFIXES:
            sources.append(EvalSource(task_name(path), path, "jsonl", key=key))
        else:
            sources.append(EvalSource(path.name.removesuffix(".txt"), path, "text"))
    names: set[str] = set()
    for source in sources:
        if source.name in names:
            raise InputError(
                f"{source.path}: a second evaluation set named {source.name!r} (file names must differ)"
            )
        names.add(source.name)
    if len(sources) > MAX_TASKS:
        raise InputError(f"{len(sources):,} evaluation sets: at most {MAX_TASKS:,}")
    return sources
