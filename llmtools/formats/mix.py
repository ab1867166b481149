"""``mix.json``: the sample plan llm-mix writes and the training dataset reads (no torch here).

Schema: ``schemas/mix.schema.json``. The index cache (``.npy`` files named by the plan's hash) sits
in one folder beside it, ``NAME.cache/`` for ``NAME.json`` (:func:`cache_folder_name`: one folder to see and
delete); ``cache.files`` lists the files relative to the mix.json's folder, so a mix.json written with its
files beside it (before the folder) reads as it always did. Here: the file's structure,
the cache's file names, and reading / writing the arrays, so a training run reopens a plan without
the planner. :mod:`llmtools.data.mix` gives the fields their meaning and rebuilds a missing cache.
"""

from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmtools.errors import InputError, where
from llmtools.formats import jsonfile
from llmtools.formats.fingerprint import sha256_file
from llmtools.formats.jsonfile import read_json_object
from llmtools.fsutil import atomic_file, inside, make_parents, sync_files, write_text_atomic

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
    data = read_json_object(path, "mix.json", ours=True)
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
            for key in _COMPONENT_COUNTS:
                _check_number(comp, key, int, path, f"splits.{name}.components[{j}].{key}")
            for key in _COMPONENT_WEIGHTS:
                _check_number(comp, key, (int, float), path, f"splits.{name}.components[{j}].{key}")
        if split.get("num_samples") is None:  # llm-mix always writes it; the arrays are checked against it
            raise InputError(f"{where(path, key=f'splits.{name}.num_samples')}: missing")
        _check_number(split, "num_samples", int, path, f"splits.{name}.num_samples")
        shares = split.get("blend_weights")
        if shares is not None and (
            not isinstance(shares, list) or not all(_is_number(w, (int, float)) for w in shares)
        ):
            raise InputError(f"{where(path, key=f'splits.{name}.blend_weights')}: expected a list of numbers")
    if not isinstance(data["cache"].get("hash"), str):
        raise InputError(f"{where(path, key='cache.hash')}: missing")
    return data


@dataclass(frozen=True)
class MixFile:
    """A mix.json read and structurally checked once: every reader of a plan takes this, not a path.

    ``data`` is the file's object as written (what the plan checks and the ledger compare field by
    field); the properties name the fields every reader needs.
    """

    path: Path
    data: dict

    @classmethod
    def read(cls, path: str | os.PathLike) -> MixFile:
        """:func:`read_mix`'s checks, once; :class:`InputError` naming the key otherwise."""
        return cls(Path(path), read_mix(path))

    @property
    def folder(self) -> Path:
        """Where the index cache lies (the mix.json's folder)."""
        return self.path.parent

    @property
    def seq_length(self) -> int:
        return self.data["seq_length"]

    @property
    def seed(self) -> int:
        return self.data["seed"]

    @property
    def sources(self) -> list[dict]:
        return self.data["sources"]

    @property
    def splits(self) -> dict[str, dict]:
        return self.data["splits"]

    @property
    def tokenizer(self) -> dict | None:
        return self.data.get("tokenizer")

    @property
    def identity(self) -> str:
        """The plan's hash (``cache.hash``), see :func:`plan_identity`."""
        return plan_identity(self.data)


# Numbers the plan checks compare with the arrays: of the right type (or absent) before any arithmetic.
_COMPONENT_COUNTS = ("samples_drawn", "target_samples", "built_samples", "index_samples", "epochs")
_COMPONENT_WEIGHTS = ("weight", "normalized_weight")


def _is_number(value, kind) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool) and value == value and value >= 0


def _check_number(record: dict, key: str, kind, path: Path, dotted: str) -> None:
    if record.get(key) is not None and not _is_number(record[key], kind):
        wanted = "an integer" if kind is int else "a number"
        raise InputError(f"{where(path, key=dotted)}: expected {wanted} >= 0, found {record[key]!r}")


def mix_text(data: dict) -> str:
    """What :func:`write_mix` writes (known before writing, e.g. to record its checksum elsewhere)."""
    return jsonfile.dumps(data, indent=2) + "\n"


def write_mix(path: str | os.PathLike, data: dict | str) -> Path:
    """Write atomically (temp name, rename); ``data`` as a dict or as :func:`mix_text` made it."""
    path = Path(path)
    write_text_atomic(path, data if isinstance(data, str) else mix_text(data))
    return path


# -- the index cache ----------------------------------------------------------------------------------
ARRAYS = ("document_index", "sample_index", "shuffle_index")
"""Each source's GPT index arrays in a split, beside the blend's ``dataset_index`` and
``dataset_sample_index``."""


def cache_folder_name(mix_path: str | os.PathLike) -> str:
    """``mix.cache`` for ``mix.json``: the folder beside a mix.json that holds its index cache."""
    name = Path(mix_path).name
    return (name[: -len(".json")] if name.endswith(".json") and name != ".json" else name) + ".cache"


def cache_names(plan_hash: str, split: str, components: int) -> dict[str, str]:
    """Array key (``dataset_index``, ``{k}.sample_index``, ...) -> ``.npy`` file name, for one split whose
    blend has ``components`` sources."""
    names = {
        "dataset_index": f"{plan_hash}-{split}-dataset_index.npy",
        "dataset_sample_index": f"{plan_hash}-{split}-dataset_sample_index.npy",
    }
    for k in range(components):
        for what in ARRAYS:
            names[f"{k}.{what}"] = f"{plan_hash}-{split}-{k}-{what}.npy"
    return names


def write_arrays(
    folder: Path, names: dict[str, str], arrays: dict[str, np.ndarray], durable: bool = True, group=None
) -> list[Path]:
    """Write ``arrays[key]`` to ``folder / names[key]`` (each atomically, no pickles); their paths. With
    ``group`` (an :class:`~llmtools.fsutil.AtomicGroup`) they go to temporaries it commits together later."""
    make_parents(folder)
    written = []
    for key, array in arrays.items():
        path = folder / names[key]
        if group is not None:
            with open(group.path(path), "wb") as handle:
                np.save(handle, np.ascontiguousarray(array), allow_pickle=False)
        else:
            with atomic_file(path, "wb", durable=False) as handle:  # made durable together below
                np.save(handle, np.ascontiguousarray(array), allow_pickle=False)
        written.append(path)
    if durable and group is None:  # one filesystem sync, not an fsync per file (the group syncs its own)
        sync_files(written, folder)
    return written


def cache_digests(
    folder: Path, files: dict[str, dict[str, str]], staged: dict[Path, Path] | None = None
) -> dict[str, dict[str, dict]]:
    """``cache.digests`` of a mix.json: size and sha256 of every cached array file, per split and key.
    ``staged`` maps a file's final path to the temporary that holds it until it is renamed."""
    staged = staged or {}

    def read(name: str) -> Path:
        return staged.get(folder / name, folder / name)

    return {
        split: {key: {"size": read(name).stat().st_size, "sha256": sha256_file(read(name))}
                for key, name in names.items()}
        for split, names in files.items()
    }  # fmt: skip


def plan_identity(mix: dict) -> str:
    """What names a plan: the hash of everything its arrays depend on (sources' index checksums, weights,
    seed, lengths, split). Two mix.json with the same identity yield the same samples in the same order."""
    return str(mix["cache"]["hash"])


_READ_WHOLE = 8 << 20  # cached arrays up to this size are read into memory; larger ones are memory-mapped


def load_split_arrays(mix: dict, path: Path, split: str) -> dict[str, np.ndarray] | None:
    """Memory-map one split's cached arrays; None when any file is missing or unreadable.

    Files that are there must be the ones llm-mix wrote: same size and sha256 as ``cache.digests``
    records (an index array left from another plan under the same name is refused, naming it), and
    inside the mix's folder (a name read from the file never leads outside it).
    """
    files = (mix["cache"].get("files") or {}).get(split)
    if not isinstance(files, dict):
        return None
    digests = (mix["cache"].get("digests") or {}).get(split) or {}
    arrays = {}
    folder = str(path.parent)
    for key, name in files.items():
        file = str(inside(folder, name, f"{path}[cache.files.{split}.{key}]"))
        try:
            size = os.path.getsize(file)
        except OSError:
            return None
        recorded = digests.get(key)
        try:
            if size <= _READ_WHOLE:  # small: one read serves the checksum and the array
                with open(file, "rb") as handle:
                    data = handle.read()
                digest = hashlib.sha256(data).hexdigest() if isinstance(recorded, dict) else None
                array = np.load(io.BytesIO(data), allow_pickle=False)
            else:
                digest = sha256_file(file) if isinstance(recorded, dict) else None
                array = np.load(file, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError):
            return None
        if isinstance(recorded, dict) and (size != recorded.get("size") or digest != recorded.get("sha256")):
            raise InputError(
                f"{file}: not the index array {path} was made with (its size or sha256 differs from "
                f"cache.digests.{split}[{key}]: left from another plan?); remove it to have it rebuilt, or "
                "run llm-mix again"
            )
        arrays[key] = array
    return arrays
