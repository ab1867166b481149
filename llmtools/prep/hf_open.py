"""Opening a local Hugging Face dataset, offline, as pyarrow tables of chosen columns.

Every kind of input becomes an :class:`ArrowSource`: a ``save_to_disk`` folder (``Dataset`` or
``DatasetDict``), Parquet files (a file, a glob, a folder), Arrow IPC files (streaming ``.arrow`` shards or
files), or any other local folder ``datasets.load_dataset(folder)`` opens with ``HF_DATASETS_OFFLINE=1``.
Parquet and Arrow are read with pyarrow directly, batch by batch (no copy into the ``datasets`` cache).
What is read from them is handed on by :mod:`llmtools.prep.hf_import`.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmtools.errors import InputError
from llmtools.formats import jsonfile

MANIFEST_NAME = "llmtools.json"  # written by llm-export hf; carries the original sidecar
BATCH_ROWS = 1000
HF_SUFFIXES = (".parquet", ".arrow")


def looks_like_hf(path: str | os.PathLike) -> bool:
    """True for inputs json2bin should read as a Hugging Face dataset rather than JSONL."""
    text = str(path)
    if text.endswith(HF_SUFFIXES):
        return True
    return os.path.isdir(text)


# --------------------------------------------------------------------------------------------------
# Opening: every kind of input becomes an ArrowSource that yields pyarrow tables of chosen columns.
# --------------------------------------------------------------------------------------------------
@dataclass
class ArrowSource:
    """A readable table: its name (for messages), schema, row count, files, and a batch iterator."""

    name: str
    schema: object  # pyarrow.Schema
    num_rows: int | None
    files: list[Path]
    split: str | None
    manifest: dict | None = None
    _iter: object = field(default=None, repr=False)
    _bytes: object = field(default=None, repr=False)

    def check_columns(self, columns: Sequence[str]) -> None:
        have = list(self.schema.names)
        for column in columns:
            if column not in have:
                raise InputError(f"{self.name}: no column {column!r} (have {', '.join(have) or 'none'})")

    def column_bytes(self, columns: Sequence[str]) -> int | None:
        """Uncompressed Arrow size of ``columns`` (for a progress bar), when cheap to know."""
        return self._bytes(list(columns)) if self._bytes is not None else None

    def batches(self, columns: Sequence[str], batch_rows: int = BATCH_ROWS) -> Iterator:
        """pyarrow Tables/RecordBatches holding ``columns``, in row order."""
        self.check_columns(columns)
        return self._iter(list(columns), batch_rows)


def open_hf(path: str | os.PathLike, split: str | None = None) -> ArrowSource:
    """Open a local Hugging Face dataset (see the module docstring). ``split`` picks a split."""
    text = str(path)
    if glob.has_magic(text) and not os.path.exists(text):
        files = sorted(Path(p) for p in glob.glob(text, recursive=True) if os.path.isfile(p))
        if not files:
            raise InputError(f"{text}: no file matches this pattern")
        return _open_files(text, files, split)
    p = Path(text)
    if not p.exists():
        raise InputError(f"{p}: no such file or folder")
    if p.is_file():
        if p.suffix not in HF_SUFFIXES:
            raise InputError(
                f"{p}: not a Hugging Face dataset (expected .parquet/.arrow files or a dataset folder)"
            )
        return _open_files(text, [p], split)
    if (p / "dataset_dict.json").exists() or (p / "state.json").exists():
        return _open_saved(p, split)
    if _is_llmtools_export(p):  # llm-export hf --format parquet: data/{split}-*.parquet
        parquet = sorted(p.glob(f"data/{split or '*'}-*.parquet"))
        if not parquet:
            raise InputError(f"{p}: no Parquet shards for split {split!r} under {p / 'data'}")
        return _open_files(str(p), parquet, split, manifest=_read_manifest(p))
    return _open_with_load_dataset(p, split)


def _is_llmtools_export(folder: Path) -> bool:
    return (folder / MANIFEST_NAME).exists()


def _read_manifest(folder: Path) -> dict | None:
    path = folder / MANIFEST_NAME
    if not path.exists():
        return None
    try:
        data = jsonfile.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: not valid JSON ({error})") from None
    return data if isinstance(data, dict) else None


def _open_files(name: str, files: list[Path], split: str | None, manifest: dict | None = None) -> ArrowSource:
    kinds = {f.suffix for f in files}
    if len(kinds) > 1 or not kinds <= set(HF_SUFFIXES):
        raise InputError(
            f"{name}: expected only .parquet or only .arrow files, found {', '.join(sorted(kinds))}"
        )
    if kinds == {".parquet"}:
        schema, rows = _parquet_schema(files)
        return ArrowSource(
            name, schema, rows, files, split, manifest, _parquet_iter(files), _parquet_bytes(files)
        )
    schema, rows = _arrow_schema(files)
    return ArrowSource(name, schema, rows, files, split, manifest, _arrow_iter(files))


def _parquet_schema(files: list[Path]):
    import pyarrow.parquet as pq

    schema, rows = None, 0
    for f in files:
        try:
            meta = pq.ParquetFile(f)
        except Exception as error:  # noqa: BLE001 - pyarrow raises several kinds for a corrupt file
            raise InputError(f"{f}: not a readable Parquet file ({error})") from None
        this = meta.schema_arrow
        if schema is None:
            schema = this
        elif not this.remove_metadata().equals(schema.remove_metadata()):
            raise InputError(f"{f}: its columns differ from {files[0]} ({this.names} vs {schema.names})")
        rows += meta.metadata.num_rows
    return schema, rows


def _parquet_bytes(files: list[Path]):
    def column_bytes(columns: list[str]) -> int:
        import pyarrow.parquet as pq

        total = 0
        for f in files:
            meta = pq.ParquetFile(f).metadata
            for g in range(meta.num_row_groups):
                group = meta.row_group(g)
                for c in range(group.num_columns):
                    chunk = group.column(c)
                    if chunk.path_in_schema.split(".")[0] in columns:
                        total += chunk.total_uncompressed_size
        return total

    return column_bytes


def _parquet_iter(files: list[Path]):
    def iterate(columns: list[str], batch_rows: int):
        import pyarrow.parquet as pq

        for f in files:
            try:
                yield from pq.ParquetFile(f).iter_batches(batch_size=batch_rows, columns=columns)
            except OSError as error:
                raise InputError(f"{f}: corrupt Parquet data ({error})") from None

    return iterate


def _open_ipc(path: Path):
    """An Arrow IPC reader: ``datasets`` writes the streaming format, others the file format."""
    import pyarrow as pa

    source = pa.OSFile(str(path), "rb")  # streamed, not mapped: memory stays flat on large shards
    try:
        return pa.ipc.open_stream(source)
    except (pa.ArrowException, OSError):
        source.seek(0)
        try:
            return pa.ipc.open_file(source)
        except (pa.ArrowException, OSError) as error:
            raise InputError(f"{path}: not an Arrow IPC file ({error})") from None


def _arrow_schema(files: list[Path]):
    schema = None
    for f in files:
        this = _open_ipc(f).schema
        if schema is None:
            schema = this
        elif not this.remove_metadata().equals(schema.remove_metadata()):
            raise InputError(f"{f}: its columns differ from {files[0]} ({this.names} vs {schema.names})")
    return schema, None


def _arrow_iter(files: list[Path]):
    def iterate(columns: list[str], batch_rows: int):
        import pyarrow as pa

        for f in files:
            reader = _open_ipc(f)
            try:
                if isinstance(reader, pa.ipc.RecordBatchFileReader):
                    batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
                else:
                    batches = iter(reader)
                for batch in batches:
                    yield batch.select(columns)
            except (pa.ArrowException, OSError) as error:
                raise InputError(f"{f}: corrupt Arrow data ({error})") from None

    return iterate


def _pick_split(name: str, splits: Sequence[str], split: str | None) -> str:
    splits = list(splits)
    if split is not None:
        if split not in splits:
            raise InputError(f"{name}: no split {split!r} (have {', '.join(splits) or 'none'}); use --split")
        return split
    if len(splits) == 1:
        return splits[0]
    if "train" in splits:
        return "train"
    raise InputError(f"{name}: several splits ({', '.join(splits)}); choose one with --split")


def _dataset_source(name: str, ds, split: str | None, manifest: dict | None) -> ArrowSource:
    files = [Path(f["filename"]) for f in ds.cache_files]

    def iterate(columns: list[str], batch_rows: int):
        yield from ds.select_columns(columns).with_format("arrow").iter(batch_size=batch_rows)

    def column_bytes(columns: list[str]) -> int:
        return int(sum(ds.data.column(c).nbytes for c in columns))

    return ArrowSource(name, ds.features.arrow_schema, len(ds), files, split, manifest, iterate, column_bytes)


def _open_saved(folder: Path, split: str | None) -> ArrowSource:
    """A ``save_to_disk`` folder, read straight from the Arrow files its ``state.json`` lists (streamed,
    not memory-mapped, so memory stays flat); ``load_from_disk`` only for the rare indexed layouts."""
    if (folder / "dataset_dict.json").exists():
        splits = _read_json(folder / "dataset_dict.json").get("splits") or []
        chosen = _pick_split(str(folder), splits, split)
        return _open_saved_dataset(folder / chosen, f"{folder}[{chosen}]", chosen)
    return _open_saved_dataset(folder, str(folder), split)


def _read_json(path: Path) -> dict:
    try:
        data = jsonfile.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: not a readable JSON file ({error})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object")
    return data


def _open_saved_dataset(folder: Path, name: str, split: str | None) -> ArrowSource:
    state = _read_json(folder / "state.json")
    own = state.get("_split")
    if split is not None and own is not None and split != own:
        raise InputError(f"{name}: no split {split!r} (this saved dataset is the {own!r} split)")
    entries = state.get("_data_files")
    if state.get("_indices_data_files") or not isinstance(entries, list):
        return _load_saved(folder, name, split or own)
    files = _listed_files(folder, entries)
    if not files:
        return _load_saved(folder, name, split or own)
    source = _open_files(name, files, split or own, manifest=_read_manifest(folder))
    expected = _recorded_rows(source.manifest, folder)
    if expected is not None:
        source._iter = _counted(source._iter, expected, folder / MANIFEST_NAME)
        if source.num_rows is None:  # Arrow streams do not say; the manifest does, and is checked above
            source.num_rows = expected
    return source


def _listed_files(folder: Path, entries: list) -> list[Path]:
    """The Arrow files ``state.json`` lists, verified against the folder: each a plain name of a file
    inside it, listed once, and every Arrow file there listed (a dropped one would lose its rows
    without a word, a repeated one double them, a path outside read someone else's file)."""
    state = folder / "state.json"
    files, seen = [], set()
    for k, entry in enumerate(entries):
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name:
            raise InputError(f'{state}[_data_files][{k}]: expected {{"filename": NAME}}, got {entry!r}')
        if name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
            raise InputError(f"{state}[_data_files][{k}]: {name!r} is not a file name inside {folder}")
        if name in seen:
            raise InputError(
                f"{state}[_data_files][{k}]: {name!r} is listed twice (its rows would count twice)"
            )
        seen.add(name)
        path = folder / name
        if path.is_symlink() or not path.is_file():
            raise InputError(
                f"{state}[_data_files][{k}]: lists {name}, which is missing (or not a plain file)"
            )
        files.append(path)
    counts = {int(m.group(2)) for m in map(_SHARD_NAME.search, seen) if m}
    if counts and counts != {len(files)}:
        raise InputError(
            f"{state}[_data_files]: lists {len(files)} file(s), but their names say {min(counts)} "
            "(data-I-of-N): a shard was dropped or added"
        )
    unlisted = sorted(p.name for p in folder.glob("*.arrow") if p.name not in seen)
    if files and unlisted:
        raise InputError(
            f"{state}[_data_files]: does not list {unlisted[0]}"
            f"{f' (and {len(unlisted) - 1} more)' if len(unlisted) > 1 else ''}, which is in the folder; "
            "the listing and the files disagree"
        )
    return files


def _recorded_rows(manifest: dict | None, folder: Path) -> int | None:
    """The row count an ``llm-export hf`` manifest records, when there is one (``datasets``' own
    ``dataset_info.json`` keeps the counts of the split it was loaded as, even after a ``select``)."""
    rows = (manifest or {}).get("rows")
    if rows is None:
        return None
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise InputError(f"{folder / MANIFEST_NAME}[rows]: {rows!r} is not a row count")
    return rows


_SHARD_NAME = re.compile(r"-(\d{5,})-of-(\d{5,})\.arrow$")


def _counted(iterate, expected: int, where: Path):
    """``iterate``, refusing at the end when the rows read are not the rows recorded."""

    def counted(columns: list[str], batch_rows: int):
        rows = 0
        for batch in iterate(columns, batch_rows):
            rows += batch.num_rows
            if rows > expected:
                break
            yield batch
        if rows != expected:
            raise InputError(
                f"{where}: records {expected} rows, but the listed files hold {'more' if rows > expected else rows}"
            )

    return counted


def _load_saved(folder: Path, name: str, split: str | None) -> ArrowSource:
    import datasets

    try:
        loaded = datasets.load_from_disk(str(folder))
    except Exception as error:  # noqa: BLE001 - datasets and pyarrow raise many kinds for a bad folder
        raise InputError(
            f"{folder}: not a readable save_to_disk folder ({type(error).__name__}: {error})"
        ) from None
    return _dataset_source(name, loaded, split, _read_manifest(folder))


def _open_with_load_dataset(folder: Path, split: str | None) -> ArrowSource:
    # A local folder: never reach the network. `datasets` reads this when first imported, so set it first.
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets

    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its own error lines: ours names the folder
    try:
        loaded = datasets.load_dataset(str(folder))
    except Exception as error:  # noqa: BLE001 - datasets raises many kinds for an unusable folder
        raise InputError(
            f"{folder}: datasets.load_dataset cannot open this folder offline ({type(error).__name__}: {error})"
        ) from None
    finally:
        datasets.logging.set_verbosity(verbosity)
    if isinstance(loaded, datasets.DatasetDict):
        chosen = _pick_split(str(folder), list(loaded), split)
        return _dataset_source(f"{folder}[{chosen}]", loaded[chosen], chosen, None)
    return _dataset_source(str(folder), loaded, split, None)
