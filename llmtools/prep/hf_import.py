"""A local Hugging Face dataset as input to ``json2bin``: text columns to tokenize, or token ids as they are.

What is read, and how (offline, batch by batch, memory flat), is :mod:`llmtools.prep.hf_open`. Two uses:

* :class:`HFDocumentSource` is a :class:`llmtools.prep.sources.DocumentSource` over text columns, for
  the json2bin pipeline (same tokenization, error handling and sidecar as JSONL).
* :func:`import_token_ids` writes a column of token-id lists (``input_ids``) straight to a
  ``.bin/.idx`` pair without re-tokenizing: offsets and values go from Arrow buffers to the writer.
  A ``sequence_lengths`` column (written by ``llm-export hf`` for sentence-split sources) restores
  the sequence boundaries, so JSONL -> bin -> HF -> bin gives byte-identical files.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from llmtools.errors import InputError, UsageError
from llmtools.formats.indexed import dtype_for_vocab
from llmtools.formats.output_marks import check_output_prefix
from llmtools.formats.sidecar import build_sidecar
from llmtools.prep.dataset_output import DatasetOutput
from llmtools.prep.hf_open import BATCH_ROWS, ArrowSource, open_hf
from llmtools.prep.json2bin import Json2BinConfig, json2bin
from llmtools.prep.sources import BadRecord, DocBatch
from llmtools.progress import Progress
from llmtools.tokenize import load_tokenizer


# --------------------------------------------------------------------------------------------------
# Text columns -> the json2bin pipeline
# --------------------------------------------------------------------------------------------------
def file_inputs(files: Sequence[Path]) -> list[dict]:
    """Sidecar ``inputs`` entries (path, size, sha256) for the files a dataset was read from."""
    out = []
    for f in files:
        digest = hashlib.sha256()
        with open(f, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
        out.append({"path": str(f), "size": f.stat().st_size, "sha256": digest.hexdigest()})
    return out


class HFDocumentSource:
    """:class:`~llmtools.prep.sources.DocumentSource` over the text columns of a local HF dataset.

    ``keys`` are the columns to read (``--json-keys``). A null value is a bad record of kind
    ``not_a_string`` (skipped or fatal, as json2bin decides); a column that is not text at all is an
    input error before anything is written.
    """

    def __init__(self, path: str | os.PathLike, keys: Sequence[str] = ("text",), split: str | None = None,
                 batch_rows: int = BATCH_ROWS) -> None:  # fmt: skip
        import pyarrow as pa

        self.table = open_hf(path, split)
        self.keys = list(keys)
        self.table.check_columns(self.keys)
        for key in self.keys:
            kind = self.table.schema.field(key).type
            if not (
                pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)
            ):
                hint = (
                    " (token ids: they are imported as they are, without a tokenizer)"
                    if _is_id_list(kind)
                    else ""
                )
                raise InputError(f"{self.table.name}: column {key!r} is {kind}, not text{hint}")
        self.batch_rows = batch_rows
        self.skipped: dict[str, int] = {}
        self.total_bytes = self.table.column_bytes(self.keys)

    def batches(self) -> Iterator[DocBatch]:
        row = 0
        for batch in self.table.batches(self.keys, self.batch_rows):
            n = batch.num_rows
            texts: dict[str, list[str]] = {}
            bad: list[BadRecord] = []
            for key in self.keys:
                column = batch.column(key)
                texts[key] = column.to_pylist()
                if column.null_count:
                    for i in np.flatnonzero(np.asarray(column.is_null())):
                        bad.append(
                            BadRecord(
                                "not_a_string",
                                f"{self.table.name}: row {row + int(i)}: column {key!r} is null",
                                row + int(i) + 1,
                            )
                        )
            lines = list(range(row + 1, row + n + 1))
            if bad:
                texts, lines = _drop_rows(texts, lines, {b.line for b in bad})
            nbytes = int(sum(batch.column(k).nbytes for k in self.keys))
            yield DocBatch(texts, self.table.name, lines, bad, nbytes)
            row += n

    def inputs(self) -> list[dict]:
        return file_inputs(self.table.files)


def _drop_rows(texts: dict[str, list], lines: list[int], drop: set[int]):
    keep = [i for i, line in enumerate(lines) if line not in drop]
    return {k: [v[i] for i in keep] for k, v in texts.items()}, [lines[i] for i in keep]


def _is_id_list(kind) -> bool:
    import pyarrow as pa

    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return pa.types.is_integer(kind.value_type)
    return False


# --------------------------------------------------------------------------------------------------
# Token-id columns -> .bin/.idx without re-tokenizing
# --------------------------------------------------------------------------------------------------
@dataclass
class TokenImportConfig:
    source: str
    output_prefix: str
    """Written as ``{output_prefix}_{column}_document.{bin,idx,json}`` (json2bin's naming)."""
    column: str = "input_ids"
    split: str | None = None
    tokenizer: str | None = None
    append_eod: bool = False
    force: bool = False
    progress: bool | None = None  # False: silent; otherwise a bar on a terminal, plain lines elsewhere

    def __post_init__(self) -> None:
        if not self.column:
            raise UsageError("--json-keys: give the column of token ids (for example input_ids)")

    @property
    def prefix(self) -> str:
        return f"{self.output_prefix}_{self.column}_document"

    def output(self) -> DatasetOutput:
        """The ``.bin/.idx`` pair and its sidecar, or markers when the tokenizer is unknown."""
        return DatasetOutput([self.prefix], force=self.force, markable=True)


@dataclass
class TokenImportResult:
    prefix: str
    documents: int = 0
    tokens: int = 0
    dtype: str = ""
    files: list[str] = field(default_factory=list)


def is_token_column(path: str | os.PathLike, column: str, split: str | None = None) -> bool:
    """True when ``column`` of the dataset holds lists of integers (already tokenized)."""
    table = open_hf(path, split)
    table.check_columns([column])
    return _is_id_list(table.schema.field(column).type)


def import_token_ids(config: TokenImportConfig) -> TokenImportResult:
    """Write the token-id lists of ``config.column`` as a Megatron ``.bin/.idx`` pair (+ sidecar)."""
    table = open_hf(config.source, config.split)
    table.check_columns([config.column])
    kind = table.schema.field(config.column).type
    if not _is_id_list(kind):
        raise InputError(f"{table.name}: column {config.column!r} is {kind}, not lists of token ids")
    with config.output() as output:
        return _import_token_ids(config, table, kind, output)


def _import_token_ids(config: TokenImportConfig, table, kind, output: DatasetOutput) -> TokenImportResult:
    import pyarrow as pa  # heavy: only once there is a column to read

    prefix = config.prefix
    original = ((table.manifest or {}).get("source") or {}).get("sidecar") or {}
    tokenizer = None
    if config.tokenizer:
        tokenizer = load_tokenizer(config.tokenizer)
        identity = tokenizer.identity()
    else:
        identity = original.get("tokenizer")
    vocab = (identity or {}).get("vocab_size")
    dtype = _output_dtype(vocab, table, kind)
    eod = (identity or {}).get("eod_id")
    if config.append_eod and eod is None:
        raise UsageError("--append-eod: the end-of-document id is unknown; give --tokenizer")
    with_sentences = "sequence_lengths" in table.schema.names
    columns = [config.column] + (["sequence_lengths"] if with_sentences else [])

    result = TokenImportResult(prefix, dtype=np.dtype(dtype).name)
    bar = Progress(table.num_rows, "hf2bin", unit="doc", enabled=config.progress is not False)
    row = empty = 0
    try:
        writer = output.open(prefix, dtype)
        for batch in table.batches(columns):
            values, lengths = _flat_ids(batch.column(config.column), table.name, config.column, row)
            _check_ids(values, lengths, vocab, dtype, table.name, row)
            if config.append_eod:
                values, lengths = _append_eod(values, lengths, eod)
            if with_sentences:
                _add_with_sentences(
                    writer, values, lengths, batch.column("sequence_lengths"), table.name, row
                )
            else:
                writer.add_documents(values, lengths)
            result.documents += int(lengths.size)
            empty += int(np.count_nonzero(lengths == 0))
            result.tokens += int(values.size)
            row += batch.num_rows
            bar.update(batch.num_rows)
        # The sidecar schema needs a tokenizer identity; without one the output is what Megatron makes:
        # a .bin/.idx pair of unknown provenance, which every reader accepts.
        if identity:
            output.set_sidecar(
                prefix,
                build_sidecar(
                    tokenizer=identity,
                    dtype=dtype,
                    inputs=file_inputs(table.files),
                    documents=result.documents,
                    sequences=writer.num_sequences,
                    tokens=result.tokens,
                    json_key=config.column,
                    append_eod=config.append_eod or original.get("append_eod", False),
                    special_tokens=original.get("special_tokens", "auto"),
                    empty_documents=empty,
                ),
            )
        result.files = [str(path) for path in output.commit()]
    except pa.ArrowInvalid as error:
        raise InputError(f"{table.name}: corrupt data near row {row} ({error})") from None
    finally:
        bar.close()
    output.mark("hf2bin", source=str(config.source), column=config.column)  # what --force may replace
    return result


def _check_ids(
    values: np.ndarray, lengths: np.ndarray, vocab: int | None, dtype, name: str, row: int
) -> None:
    """Every id an integer in ``[0, vocab)``, or without a vocabulary in the output dtype's range: a
    negative id or one of 2**40 is refused at its row, never wrapped into a valid-looking id."""
    if not values.size:
        return
    if values.dtype.kind not in "iu":
        raise InputError(f"{name}: row {row}: token ids must be integers, the column holds {values.dtype}")
    limit = vocab if vocab else int(np.iinfo(dtype).max) + 1
    if int(values.max()) < limit and int(values.min()) >= 0:
        return
    bad = int(np.argmax((values >= limit) | (values < 0)))
    at = row + int(np.searchsorted(np.cumsum(lengths), bad, side="right"))
    range_ = (
        f"the vocabulary (size {vocab})" if vocab else f"what {np.dtype(dtype).name} holds (0..{limit - 1})"
    )
    raise InputError(f"{name}: row {at}: token id {int(values[bad])} is outside {range_}")


def _output_dtype(vocab: int | None, table: ArrowSource, kind) -> np.dtype:
    """Megatron's rule when the vocabulary is known; else the original .bin dtype or the column's."""
    if vocab:
        return dtype_for_vocab(vocab)
    original = ((table.manifest or {}).get("source") or {}).get("dtype")
    if original in ("uint16", "int32"):
        return np.dtype(original)
    width = np.dtype(kind.value_type.to_pandas_dtype())
    return np.dtype(np.uint16) if width.itemsize <= 2 else np.dtype(np.int32)


def _flat_ids(column, name: str, key: str, row: int) -> tuple[np.ndarray, np.ndarray]:
    """(values, per-row lengths) of a list column, from its Arrow buffers (no Python lists)."""
    import pyarrow as pa

    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    values_parts, length_parts = [], []
    for chunk in chunks:
        if chunk.null_count:
            bad = int(np.argmax(np.asarray(chunk.is_null())))
            raise InputError(f"{name}: row {row + bad}: column {key!r} is null")
        if pa.types.is_fixed_size_list(chunk.type):
            size = chunk.type.list_size
            lengths = np.full(len(chunk), size, dtype=np.int64)
        else:
            offsets = chunk.offsets.to_numpy().astype(np.int64)
            lengths = np.diff(offsets)
        values = chunk.flatten()
        if values.null_count:
            raise InputError(f"{name}: near row {row}: column {key!r} holds a null token id")
        values_parts.append(values.to_numpy(zero_copy_only=False))
        length_parts.append(lengths)
        row += len(chunk)
    if len(values_parts) == 1:
        return values_parts[0], length_parts[0]
    return np.concatenate(values_parts) if values_parts else np.empty(0, np.int64), np.concatenate(
        length_parts
    ) if length_parts else np.empty(0, np.int64)


def _append_eod(values: np.ndarray, lengths: np.ndarray, eod: int) -> tuple[np.ndarray, np.ndarray]:
    """Append ``eod`` to every non-empty document (Megatron's ``--append-eod``), vectorized."""
    ends = np.cumsum(lengths)
    positions = ends[lengths > 0]
    return np.insert(values, positions, eod), lengths + (lengths > 0)


def _add_with_sentences(writer, values, lengths, sentences, name: str, row: int) -> None:
    flat, per_doc = _flat_ids(sentences, name, "sequence_lengths", row)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    sent_starts = np.concatenate([[0], np.cumsum(per_doc)])
    for i in range(lengths.size):
        parts = flat[sent_starts[i] : sent_starts[i + 1]]
        if int(parts.sum()) != int(lengths[i]):
            raise InputError(
                f"{name}: row {row + i}: sequence_lengths sum to {int(parts.sum())}, not the {int(lengths[i])} tokens"
            )
        writer.add_document(values[starts[i] : starts[i + 1]], parts)


# --------------------------------------------------------------------------------------------------
# hf2bin: both kinds of columns, one call
# --------------------------------------------------------------------------------------------------
@dataclass
class Hf2BinConfig:
    """``llm-prep hf2bin``: a local HF dataset -> ``{output_prefix}_{column}_document.{bin,idx,json}``."""

    source: str
    output_prefix: str
    json_keys: Sequence[str] | None = None
    """Columns to convert; default ``text``, or ``input_ids`` when there is no ``text`` column."""
    split: str | None = None
    tokenizer: str | None = None
    """Needed for text columns; for token-id columns it sets the vocabulary (dtype) and the sidecar."""
    append_eod: bool = False
    workers: int | None = None
    backend: str = "auto"
    special_tokens: str = "auto"
    skip_bad: bool = False
    force: bool = False
    progress: bool | None = None

    def __post_init__(self) -> None:
        check_output_prefix(self.output_prefix, "--output")
        if self.json_keys is not None:
            self.json_keys = tuple(self.json_keys)
            if not self.json_keys or any(not k for k in self.json_keys):
                raise UsageError("--json-keys: give at least one non-empty column name")
            if len(set(self.json_keys)) != len(self.json_keys):
                raise UsageError(f"--json-keys: duplicate column in {list(self.json_keys)}")


@dataclass
class Hf2BinResult:
    paths: list[str] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)
    documents: int = 0
    tokens: dict[str, int] = field(default_factory=dict)
    tokenized: list[str] = field(default_factory=list)
    copied: list[str] = field(default_factory=list)
    summary: str = ""

    def to_dict(self) -> dict:
        return {"prefixes": self.prefixes, "paths": self.paths, "documents": self.documents, "tokens": self.tokens,
                "tokenized_columns": self.tokenized, "token_id_columns": self.copied}  # fmt: skip


def hf2bin_output(config: Hf2BinConfig, table: ArrowSource, keys: Sequence[str]) -> DatasetOutput:
    """What :func:`hf2bin` writes: json2bin's naming, one dataset per column (token-id columns without a
    known tokenizer get markers instead of a sidecar)."""
    prefixes = [f"{config.output_prefix}_{key}_document" for key in keys]
    return DatasetOutput(prefixes, force=config.force, markable=True)


def hf2bin_outputs(config: Hf2BinConfig) -> tuple[list[Path], list[Path]]:
    """(every file :func:`hf2bin` may write, the files it reads): for the CLI's output check."""
    table = open_hf(config.source, config.split)
    keys = list(config.json_keys) if config.json_keys else [_default_key(table)]
    return hf2bin_output(config, table, keys).claimed(), [Path(str(config.source)), *table.files]


def hf2bin(config: Hf2BinConfig) -> Hf2BinResult:
    """Text columns go through json2bin (same tokenization, checks and sidecar as JSONL); token-id
    columns are written as they are (:func:`import_token_ids` and :func:`json2bin` each commit their
    own datasets; this holds the lock of all of them and checks them first)."""
    table = open_hf(config.source, config.split)
    keys = list(config.json_keys) if config.json_keys else [_default_key(table)]
    table.check_columns(keys)
    ids = [k for k in keys if _is_id_list(table.schema.field(k).type)]
    texts = [k for k in keys if k not in ids]
    with hf2bin_output(config, table, keys) as output:
        return _hf2bin(config, output.prefixes, ids, texts)


def _hf2bin(config: Hf2BinConfig, prefixes: list[str], ids: list[str], texts: list[str]) -> Hf2BinResult:
    if texts and not config.tokenizer:
        raise UsageError(f"--tokenizer: needed to tokenize the text column {texts[0]!r}")
    result = Hf2BinResult(prefixes=prefixes, tokenized=texts, copied=ids)
    progress = config.progress
    for key in ids:
        done = import_token_ids(TokenImportConfig(
            config.source, config.output_prefix, column=key, split=config.split, tokenizer=config.tokenizer,
            append_eod=config.append_eod, force=config.force,
            progress=progress))  # fmt: skip
        result.paths += done.files
        result.documents = done.documents
        result.tokens[key] = done.tokens
    if texts:
        source = HFDocumentSource(config.source, texts, config.split)
        j2b = Json2BinConfig(tokenizer=config.tokenizer, output_prefix=config.output_prefix, json_keys=texts,
                             append_eod=config.append_eod, workers=config.workers, backend=config.backend,
                             special_tokens=config.special_tokens, skip_bad=config.skip_bad, force=config.force,
                             progress=progress)  # fmt: skip
        done = json2bin(source=source, config=j2b)
        result.paths += done.paths
        result.documents = done.documents
        result.tokens.update(done.tokens)
        result.summary = done.summary()
    if not result.summary:
        result.summary = f"{result.documents:,} documents, {sum(result.tokens.values()):,} tokens (token ids copied, not re-tokenized)"
    if ids and not any(p.endswith(".json") for p in result.paths):
        result.summary += "; no sidecar written: the tokenizer is unknown (give --tokenizer to record it)"
    return result


def _default_key(table: ArrowSource) -> str:
    for key in ("text", "input_ids"):
        if key in table.schema.names:
            return key
    raise InputError(
        f"{table.name}: no 'text' or 'input_ids' column (have {', '.join(table.schema.names)}); use --json-keys"
    )
