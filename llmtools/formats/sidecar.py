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


def commit_with_sidecars(writers, sidecars: dict, last: dict | None = None, group=None) -> list[Path]:
    """Commit finished :class:`~llmtools.formats.indexed.IndexedDatasetWriter` s and write their sidecars
    (``{prefix: record}``), then the text files of ``last`` (``{path: text}``, e.g. a mix.json that
    names them), as one step, with the finished temporaries of ``group`` (an :class:`AtomicGroup`): a
    signal cannot leave a ``.bin/.idx`` without its sidecar, or a file that names outputs which are not
    there. Each writer's index is written first (the slow part, still interruptible). Returns the
    sidecar paths, then the paths of ``last``."""
    from llmtools.interrupt import critical

    for writer in writers:
        writer.finish()
    with critical():
        if group is not None:
            group.commit()
        for writer in writers:
            writer.commit()
        written = [write_sidecar(prefix, record) for prefix, record in sidecars.items()]
        for path, text in (last or {}).items():
            write_text_atomic(path, text)
            written.append(Path(path))
        return written
