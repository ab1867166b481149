"""Downstream task files: local JSONL, one example per line, all of one kind.

* multiple choice: ``{"context": str, "choices": [str, ...], "gold": int}``;
* perplexity: ``{"text": str}``.

Read by the in-loop evaluation (``eval.tasks``, :mod:`llmtools.train.downstream`) and by ``llm-ckpt
eval`` (:mod:`llmtools.ckpt.harness`). Every file is untrusted: a line that is not an example of the
file's kind is an :class:`InputError` naming the file and line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from llmtools.errors import InputError
from llmtools.formats import jsonfile

KINDS = ("multiple_choice", "perplexity")
MAX_LINE_BYTES = 64 << 20
"""The longest example line read (a task file is read whole into memory)."""


@dataclass
class TaskFile:
    name: str  # the file's name without .jsonl / .json
    path: Path
    kind: str
    examples: list[dict] = field(default_factory=list)


def task_name(path: Path) -> str:
    return path.name.removesuffix(".jsonl").removesuffix(".json")


def read_task_files(paths: list[str], base: Path | None = None, where: str = "eval.tasks") -> list[TaskFile]:
    """Read and check every task file (relative paths against ``base``); names must differ."""
    tasks, names = [], set()
    for spec in paths:
        path = Path(spec) if base is None or Path(spec).is_absolute() else base / spec
        name = task_name(path)
        if name in names:
            raise InputError(f"{where}: two tasks named {name!r} (file names must differ)")
        names.add(name)
        if not path.is_file():
            raise InputError(f"{where}: {path}: no such task file")
        task = TaskFile(name, path, "")
        # The bounded parser, strict: lm-eval reads the same file again with a JSON reader that takes
        # neither NaN nor Infinity, and a lone surrogate cannot be tokenized.
        try:
            for number, item in jsonfile.read_lines(path, max_line=MAX_LINE_BYTES, finite=True, strings=True):
                at = f"{path}:{number}"
                kind = example_kind(item, at)
                if task.kind and kind != task.kind:
                    raise InputError(f"{at}: a {kind} example in a {task.kind} task (one kind per file)")
                task.kind = kind
                task.examples.append(item)
        except jsonfile.BadLine as error:
            if error.kind != "malformed_json":
                raise
            what = error.what.removeprefix("malformed JSON: ")
            raise InputError(f"{error.place}: not JSON ({what})") from None
        if not task.examples:
            raise InputError(f"{where}: {path}: no examples")
        tasks.append(task)
    return tasks


def example_kind(item, where: str) -> str:
    """``multiple_choice`` or ``perplexity``; an InputError for anything else."""
    if not isinstance(item, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(item).__name__}")
    if "text" in item and "choices" not in item:
        if not isinstance(item["text"], str) or not item["text"]:
            raise InputError(f"{where}: text: expected a non-empty string")
        return "perplexity"
    context, choices, gold = item.get("context"), item.get("choices"), item.get("gold")
    if not isinstance(context, str):
        raise InputError(f"{where}: context: expected a string (or text, for a perplexity task)")
    if (
        not isinstance(choices, list)
        or len(choices) < 2
        or not all(isinstance(c, str) and c for c in choices)
    ):
        raise InputError(f"{where}: choices: expected a list of at least 2 non-empty strings")
    if not isinstance(gold, int) or isinstance(gold, bool) or not 0 <= gold < len(choices):
        raise InputError(f"{where}: gold: expected the index of the right choice (0..{len(choices) - 1})")
    return "multiple_choice"
