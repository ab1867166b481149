"""Files the commands read at run time, shipped inside the package: model presets (``models``),
DeepSpeed configs (``deepspeed``) and the JSON Schemas of every file format (``schemas``).

They live once, in the repository's ``configs/models``, ``configs/deepspeed`` and ``schemas`` folders;
``llmtools/resources/<kind>`` are links to them, which a build follows (package data in
pyproject.toml): a wheel carries the files, an editable install reads them in place. ``LLMTOOLS_MODEL_PRESETS`` points the model
presets at another folder.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

KINDS = ("models", "deepspeed", "schemas")


def resource_dir(kind: str) -> Path:
    """The folder holding one kind of shipped file (a real folder: wheels install unzipped)."""
    if kind not in KINDS:
        raise ValueError(f"unknown resource kind {kind!r} (one of {', '.join(KINDS)})")
    if kind == "models" and os.environ.get("LLMTOOLS_MODEL_PRESETS"):
        return Path(os.environ["LLMTOOLS_MODEL_PRESETS"])
    return Path(str(resources.files("llmtools.resources") / kind))


def names(kind: str, suffix: str) -> list[str]:
    """The shipped files of one kind, by name without the suffix."""
    return sorted(p.stem for p in resource_dir(kind).glob(f"*{suffix}"))
