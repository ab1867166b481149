"""The sidecar ``PREFIX.json`` next to a ``.bin/.idx`` pair: what the Megatron format cannot record.

Schema: ``schemas/sidecar.schema.json``. Files that Megatron wrote have no sidecar; readers treat
that as "unknown provenance", never as an error.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from llmtools.formats.indexed import strip_suffix
from llmtools.formats.jsonfile import read_json_object
from llmtools.fsutil import write_text_atomic

SCHEMA_VERSION = 1


def sidecar_path(prefix: str | os.PathLike) -> Path:
    return Path(f"{strip_suffix(prefix)}.json")


def read_sidecar(prefix: str | os.PathLike) -> dict | None:
    path = sidecar_path(prefix)
    if not path.exists():
        return None
    return read_json_object(path, "sidecar JSON file")


def write_sidecar(prefix: str | os.PathLike, data: dict) -> Path:
    path = sidecar_path(prefix)
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")
    return path
