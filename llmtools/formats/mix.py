"""``mix.json``: the sample plan llm-mix writes and the training dataset reads (no torch here).

Schema: ``schemas/mix.schema.json``. The index cache (``.npy`` files named by the plan's hash) sits
in the same folder; ``cache.files`` lists them relative to that folder. Only structure is checked
here; :mod:`llmtools.data.mix` gives the fields their meaning.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from llmtools.errors import InputError, where
from llmtools.formats.jsonfile import read_json_object
from llmtools.fsutil import write_text_atomic

FORMAT = "llmtools.mix"
VERSION = 1
SPLIT_NAMES = ("train", "valid", "test")
MIN_SEQ_LENGTH = 2
"""The shortest sample (in model inputs) llm-mix plans, llm-train trains on and a mix.json may record:
with one input token per sample the model never attends to a context, it learns token bigrams."""

_REQUIRED = {
    "format": str,
    "version": int,
    "seq_length": int,
    "seed": int,
    "sources": list,
    "splits": dict,
    "cache": dict,
}


def read_mix(path: str | os.PathLike) -> dict:
    """Load and structurally check a mix.json; :class:`InputError` naming the key otherwise."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file (make one with llm-mix)")
    data = read_json_object(path, "mix.json")
    if data.get("format") != FORMAT:
        raise InputError(f"{where(path, key='format')}: expected {FORMAT!r}, found {data.get('format')!r}")
    for key, kind in _REQUIRED.items():
        if key not in data:
            raise InputError(f"{where(path, key=key)}: missing")
        if not isinstance(data[key], kind) or (kind is int and isinstance(data[key], bool)):
            raise InputError(
                f"{where(path, key=key)}: expected {kind.__name__}, found {type(data[key]).__name__}"
            )
    if data["version"] != VERSION:
        raise InputError(
            f"{where(path, key='version')}: unsupported version {data['version']} (this is {VERSION})"
        )
    if data["seq_length"] < MIN_SEQ_LENGTH:
        raise InputError(
            f"{where(path, key='seq_length')}: must be >= {MIN_SEQ_LENGTH}, found {data['seq_length']}"
        )
    for i, source in enumerate(data["sources"]):
        if not isinstance(source, dict) or not isinstance(source.get("prefix"), str):
            raise InputError(f"{where(path, key=f'sources[{i}].prefix')}: missing or not a string")
    for name, split in data["splits"].items():
        if name not in SPLIT_NAMES:
            raise InputError(f"{where(path, key=f'splits.{name}')}: unknown split (train, valid, test)")
        if not isinstance(split, dict) or not isinstance(split.get("components"), list):
            raise InputError(f"{where(path, key=f'splits.{name}.components')}: missing or not a list")
        for j, comp in enumerate(split["components"]):
            if not isinstance(comp, dict) or not isinstance(comp.get("source"), int):
                raise InputError(f"{where(path, key=f'splits.{name}.components[{j}].source')}: missing")
            if not 0 <= comp["source"] < len(data["sources"]):
                raise InputError(f"{where(path, key=f'splits.{name}.components[{j}].source')}: out of range")
    if not isinstance(data["cache"].get("hash"), str):
        raise InputError(f"{where(path, key='cache.hash')}: missing")
    return data


def write_mix(path: str | os.PathLike, data: dict) -> Path:
    """Write atomically (temp name, rename)."""
    path = Path(path)
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")
    return path
