"""Recognising what llmtools wrote, so ``--force`` replaces our earlier outputs and nothing else.

Every output carries a mark of its maker, where its format has room for one:

==========================================  ===========================================================
output                                      recognised by
==========================================  ===========================================================
``.bin`` / ``.idx`` dataset pairs           their sidecar ``PREFIX.json`` (``format: llmtools.*``)
JSON files (sidecars, ``mix.json``, ...)    a top-level ``format`` starting with ``llmtools.`` (JSON Lines:
                                            in the first record, as ``quarantine.jsonl``)
folders (HF exports and models, universal   an ``llmtools.json`` or a checkpoint ``meta.json`` inside
checkpoints, LoRA adapters, import-hf)      (``format: llmtools.*``); an empty folder holds nothing to lose
run folders (``llm-train -o``) and          ``config.yaml`` headed ``# written by llm-train``,
their entries (``metrics.jsonl``, ...)      checkpoints with our ``meta.json``, our ``reference/`` or
                                            ``quarantine.jsonl``
``.safetensors``                            ``__metadata__["producer"]`` of the header
``.png`` (``llm-log plot``)                 the PNG text chunk ``Software: llmtools ...``
anything else (``tokenizer.json``,          a marker ``NAME.llmtools.json`` beside it that names the file
sample-corpus JSONL, sidecar-less           with its size and sha256: an edited file is no longer ours
``hf2bin`` outputs)
==========================================  ===========================================================

:func:`not_ours` says why a path is not one of ours (None when it is); the decision of what a command may
replace is :func:`llmtools.cli.claim.claim`'s.
"""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

from llmtools import __version__
from llmtools.errors import UsageError
from llmtools.formats import jsonfile
from llmtools.fsutil import write_text_atomic

PRODUCER = "llmtools"
MARKER_SUFFIX = ".llmtools.json"
MARKER_FORMAT = "llmtools.output"
FOLDER_MARKER = "llmtools.json"
RUN_CONFIG_HEADER = "# written by llm-train"
# What `llm-train -o RUN --force` removes to start over (the rest of a run folder is left alone): its
# files, the earlier configs kept on resume (config.<step>.yaml, ds_config.<step>.json), its folders.
RUN_FILES = (
    "metrics.jsonl", "config.yaml", "ds_config.json", "quarantine.jsonl", "curves.png", "trackers.json"
)
RUN_KEPT = ("config.*.yaml", "ds_config.*.json")
# reference: a preference run's reference pass; wandb, mlruns: the trackers' offline runs
RUN_FOLDERS = ("checkpoints", "tensorboard", "reference", "wandb", "mlruns")
# The marker of a stored reference pass: llmtools.formats.reference.META_FILE, spelled here so that
# recognising outputs does not load numpy (a test keeps the two equal).
REFERENCE_META = "reference.json"
_DATASET_SUFFIXES = (".bin", ".idx")
_HASHED_UP_TO = 1 << 30


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def marker_path(path: str | os.PathLike) -> Path:
    """``tokenizer.json`` -> ``tokenizer.json.llmtools.json`` beside it."""
    path = Path(path)
    return path.with_name(path.name + MARKER_SUFFIX)


def write_marker(path: str | os.PathLike, kind: str, **info) -> Path:
    """Record that llmtools wrote ``path`` (call once it is complete); returns the marker's path."""
    path = Path(path)
    record = {
        "format": MARKER_FORMAT,
        "kind": kind,
        "tool": f"llmtools {__version__}",
        "file": path.name,
        "size": path.stat().st_size,
        "sha256": _sha256(path) if path.stat().st_size <= _HASHED_UP_TO else None,  # see _marked
        **info,
    }
    marker = marker_path(path)
    write_text_atomic(marker, jsonfile.dumps(record, indent=2) + "\n")
    return marker


def _json_format(path: Path) -> str | None:
    try:
        if path.stat().st_size > 64 << 20:  # none of our JSON files is this large
            return None
        data = jsonfile.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = data.get("format") if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def _jsonl_format(path: Path) -> str | None:
    """The ``format`` of a JSON Lines file's first record (ours each carry one), or None."""
    try:
        with open(path, "rb") as handle:
            first = handle.readline(1 << 20)
        data = jsonfile.loads(first)
    except (OSError, ValueError):
        return None
    value = data.get("format") if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def _is_ours_json(path: Path) -> bool:
    return (_json_format(path) or "").startswith("llmtools.")


def _marked(path: Path) -> bool:
    """Its marker names it, with its size and (up to 1 GB, beyond which hashing costs more than it is
    worth here) its sha256."""
    marker = marker_path(path)
    if not marker.is_file() or _json_format(marker) != MARKER_FORMAT:
        return False
    record = jsonfile.loads(marker.read_text(encoding="utf-8"), ours=True)
    size = path.stat().st_size
    if record.get("file") != path.name or record.get("size") != size:
        return False
    return size > _HASHED_UP_TO or record.get("sha256") == _sha256(path)


def safetensors_producer(path: Path) -> str | None:
    """``__metadata__["producer"]`` of a safetensors file's header, or None."""
    try:
        with open(path, "rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            if size > 100 << 20:
                return None
            header = jsonfile.loads(handle.read(size))
    except (OSError, ValueError, struct.error):
        return None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta.get("producer") if isinstance(meta, dict) else None


def png_software(path: Path) -> str | None:
    """The ``Software`` text chunk of a PNG (matplotlib writes its own name there unless told), or None."""
    try:
        with open(path, "rb") as handle:
            if handle.read(8) != b"\x89PNG\r\n\x1a\n":
                return None
            while True:
                head = handle.read(8)
                if len(head) < 8:
                    return None
                length, kind = struct.unpack(">I4s", head)
                if kind in (b"IDAT", b"IEND"):
                    return None
                body = handle.read(length)
                handle.read(4)  # CRC
                if kind == b"tEXt" and b"\0" in body:
                    key, value = body.split(b"\0", 1)
                    if key == b"Software":
                        return value.decode("latin-1")
    except (OSError, struct.error):
        return None


def _run_folder(path: Path) -> bool:
    config = path / "config.yaml"
    if config.is_file():
        with open(config, encoding="utf-8", errors="replace") as handle:
            if handle.readline().startswith(RUN_CONFIG_HEADER):
                return True
    if (_json_format(path / "reference" / REFERENCE_META) or "").startswith("llmtools."):
        return True  # a preference run stopped after its reference pass, before any checkpoint
    if (_jsonl_format(path / "quarantine.jsonl") or "").startswith("llmtools."):
        return True  # a run stopped by its health gate before any checkpoint
    checkpoints = path / "checkpoints"
    return checkpoints.is_dir() and any(
        _json_format(meta) == "llmtools.checkpoint" for meta in checkpoints.glob("step_*/meta.json")
    )


def _is_run_entry(name: str) -> bool:
    import fnmatch

    return name in RUN_FILES or name in RUN_FOLDERS or any(fnmatch.fnmatch(name, p) for p in RUN_KEPT)


def run_folder_entries(run_dir: str | os.PathLike) -> list[Path]:
    """The entries of a run folder that ``llm-train --force`` removes (those that exist)."""
    run_dir = Path(run_dir)
    found = [run_dir / name for name in (*RUN_FILES, *RUN_FOLDERS) if os.path.lexists(run_dir / name)]
    for pattern in RUN_KEPT:
        found += sorted(run_dir.glob(pattern))
    return found


RUN_KIND = "llmtools.run"
RUN_ENTRY_KIND = "llmtools.run-entry"
RUN_CHECKPOINT_KIND = "llmtools.run-checkpoint"
RUN_PARTS = frozenset({RUN_KIND, RUN_ENTRY_KIND, RUN_CHECKPOINT_KIND})  # what only llm-train replaces


def kind_of(path: str | os.PathLike) -> str | None:
    """What kind of output of ours ``path`` is, for ``--force``'s same-kind rule: a training run folder
    (:data:`RUN_KIND`), an entry of one (:data:`RUN_ENTRY_KIND`), a checkpoint of a run
    (:data:`RUN_CHECKPOINT_KIND`), else the ``format`` its mark records (``llmtools.hf-export``,
    ``llmtools.checkpoint``, ...); None when there is no mark to tell."""
    path = Path(path)
    if path.is_symlink() or not path.exists():
        return None
    if _is_run_entry(path.name) and _run_folder(path.parent):
        return RUN_ENTRY_KIND
    if path.is_dir():
        if _run_folder(path):
            return RUN_KIND
        if _json_format(path / "meta.json") == "llmtools.checkpoint":
            in_run = path.parent.name == "checkpoints" and _run_folder(path.parent.parent)
            return RUN_CHECKPOINT_KIND if in_run else "llmtools.checkpoint"
        return _json_format(path / FOLDER_MARKER)
    if path.suffix == ".safetensors" and safetensors_producer(path) == PRODUCER:
        return "llmtools.safetensors"
    if path.suffix == ".json":
        return _json_format(path)
    return None


def not_ours(path: str | os.PathLike) -> str | None:
    """None when ``path`` is missing or something llmtools wrote; else why it is not (for a message)."""
    path = Path(path)
    if not os.path.lexists(path):
        return None
    if path.is_symlink():
        return "a symlink (llmtools never writes one)"
    if _is_run_entry(path.name) and _run_folder(path.parent):
        return None
    if path.is_dir():
        if not any(path.iterdir()):
            return None
        if _is_ours_json(path / FOLDER_MARKER) or _json_format(path / "meta.json") == "llmtools.checkpoint":
            return None
        if _run_folder(path):
            return None
        return f"a non-empty folder llmtools did not write (no {FOLDER_MARKER} or checkpoint meta.json in it)"
    if not path.is_file():
        return "not a regular file"
    if path.suffix in _DATASET_SUFFIXES:
        sidecar = path.with_suffix(".json")
        if _is_ours_json(sidecar) or _marked(path):
            return None
        return (
            f"a dataset file without an llmtools sidecar ({sidecar.name}): Megatron or another tool made it"
        )
    if path.suffix == ".json" and _is_ours_json(path):
        return None
    if path.suffix == ".jsonl" and (_jsonl_format(path) or "").startswith("llmtools."):
        return None
    if path.suffix == ".safetensors" and safetensors_producer(path) == PRODUCER:
        return None
    if path.suffix == ".png" and (png_software(path) or "").startswith(PRODUCER):
        return None
    if _marked(path):
        return None
    if marker_path(path).is_file():
        return f"changed since llmtools wrote it (its {marker_path(path).name} no longer matches)"
    return "a file llmtools did not write"


def check_output_prefix(prefix: str, flag: str = "--output") -> None:
    """An output prefix names files (``PREFIX_text_document.bin``), never a folder: ``-o .``, ``-o ..`` or
    ``-o data/`` would write hidden ``._text_document.*`` files or names that end in the folder's own."""
    text = os.fsdecode(prefix)
    if not text:
        raise UsageError(f"{flag}: an output prefix is required")
    if text.endswith(("/", os.sep)) or os.path.basename(text) in (".", ".."):
        raise UsageError(
            f"{flag} {text}: is a folder; give a prefix inside it (e.g. {os.path.join(text, 'name')})"
        )
