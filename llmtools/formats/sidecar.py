"""The sidecar ``PREFIX.json`` next to a ``.bin/.idx`` pair: what the Megatron format cannot record.

Schema: ``schemas/sidecar.schema.json``. Files that Megatron wrote have no sidecar; readers treat
that as "unknown provenance", never as an error. Every writer of ours builds the record with
:func:`build_sidecar`, so the fields, their order and their meaning are defined once.
"""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path
from typing import Any

import numpy as np

from llmtools import __version__
from llmtools.formats import jsonfile
from llmtools.formats.indexed import strip_suffix
from llmtools.formats.jsonfile import read_json_object
from llmtools.fsutil import critical, write_text_atomic

SCHEMA_VERSION = 1
FORMAT = "llmtools.indexed-sidecar"


def build_sidecar(
    *,
    tokenizer: dict | None,
    dtype,
    inputs: list[dict],
    documents: int,
    sequences: int,
    tokens: int,
    json_key: str | None,
    append_eod: bool,
    special_tokens: str | None = None,
    empty_documents: int = 0,
    skipped: dict[str, int] | None = None,
    **blocks: dict[str, Any] | None,
) -> dict[str, Any]:
    """The sidecar record of one ``.bin/.idx`` pair just written.

    ``tokenizer`` is the tokenizer's identity (``Tokenizer.identity()``), ``inputs`` the files read
    (path, size, sha256), the counts those of the writer. ``special_tokens`` is left out when the writer
    had no text to apply a policy to. ``blocks`` are a writer's own sections after the common ones
    (``sft``, ``materialized``).
    """
    record: dict[str, Any] = {
        "format": FORMAT,
        "version": SCHEMA_VERSION,
        "tool": f"llmtools {__version__}",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "tokenizer": tokenizer,
        "json_key": json_key,
        "append_eod": bool(append_eod),
        "dtype": np.dtype(dtype).name,
    }
    if special_tokens is not None:
        record["special_tokens"] = special_tokens
    record["inputs"] = inputs
    record["counts"] = {
        "documents": int(documents),
        "sequences": int(sequences),
        "tokens": int(tokens),
        "empty_documents": int(empty_documents),
        "skipped": dict(sorted((skipped or {}).items())),
    }
    record.update(blocks)
    return record


def sidecar_path(prefix: str | os.PathLike) -> Path:
    return Path(f"{strip_suffix(prefix)}.json")


def read_sidecar(prefix: str | os.PathLike) -> dict | None:
    path = sidecar_path(prefix)
    if not path.exists():
        return None
    return read_json_object(path, "sidecar JSON file", ours=True)


def write_sidecar(prefix: str | os.PathLike, data: dict) -> Path:
    path = sidecar_path(prefix)
    write_text_atomic(path, jsonfile.dumps(data, indent=2, sort_keys=False) + "\n")
    return path


def commit_with_sidecars(writers, sidecars: dict, last: dict | None = None, group=None) -> list[Path]:
    """Commit finished :class:`~llmtools.formats.indexed.IndexedDatasetWriter` s and write their sidecars
    (``{prefix: record}``), then the text files of ``last`` (``{path: text}``, e.g. a mix.json that
    names them), as one step, with the finished temporaries of ``group`` (an :class:`AtomicGroup`): a
    signal cannot leave a ``.bin/.idx`` without its sidecar, or a file that names outputs which are not
    there. Each writer's index is written first (the slow part, still interruptible). Returns the
    sidecar paths, then the paths of ``last``."""
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
