"""``llm-prep inspect`` / ``cat`` as library functions: summarize, validate and read a ``.bin/.idx``."""

from __future__ import annotations

import os

import numpy as np

from llmtools.errors import InputError, UsageError
from llmtools.formats.indexed import IndexedDatasetReader, strip_suffix
from llmtools.formats.sidecar import read_sidecar


def inspect_prefix(prefix: str | os.PathLike, validate: bool = True) -> dict:
    """Counts, dtype, token and document-length statistics; ``validate`` adds the O(tokens) checks.

    Raises InputError naming the file and byte offset for a bad magic, a truncated file or inconsistent
    pointers (the reader's own checks, on open), and with ``validate`` for token ids outside the
    sidecar's vocabulary or a sidecar whose counts disagree with the index.
    """
    reader = IndexedDatasetReader(prefix)
    sidecar = read_sidecar(prefix)
    lengths = reader.document_lengths()
    report: dict = {
        "prefix": reader.prefix,
        "bin": str(reader.bin_file),
        "idx": str(reader.idx_file),
        "bin_bytes": reader.bin_file.stat().st_size,
        "idx_bytes": reader.idx_file.stat().st_size,
        "dtype": reader.dtype.name,
        "dtype_code": reader.dtype_code,
        "documents": reader.num_documents,
        "sequences": reader.num_sequences,
        "tokens": reader.num_tokens,
        "empty_documents": int((lengths == 0).sum()),
        "multimodal": reader.sequence_modes is not None,
        "document_length": _stats(lengths),
        "valid": True,
        "validated": bool(validate),
    }
    tokens = reader.tokens()
    if (
        validate and tokens.size and np.issubdtype(reader.dtype, np.integer)
    ):  # O(tokens): part of the full check
        report["token_min"] = int(tokens.min())
        report["token_max"] = int(tokens.max())
        if report["token_min"] < 0:
            bad = int(np.argmax(tokens < 0))
            raise InputError(
                f"{reader.bin_file}@byte {bad * reader.dtype.itemsize}: token id {int(tokens[bad])} is negative"
            )
    if validate and tokens.size and not np.issubdtype(reader.dtype, np.integer):
        raise InputError(
            f"{reader.idx_file}: dtype {reader.dtype.name} (code {reader.dtype_code}): token ids are integers; "
            "a float dataset is not token data"
        )
    if sidecar is not None:
        tok = sidecar.get("tokenizer") or {}
        report["sidecar"] = {
            k: sidecar.get(k) for k in ("tool", "created", "json_key", "append_eod", "special_tokens")
        }
        report["tokenizer"] = tok
        vocab = tok.get("vocab_size")
        if validate and isinstance(vocab, int) and "token_max" in report and report["token_max"] >= vocab:
            bad = int(np.argmax(tokens >= vocab))
            raise InputError(
                f"{reader.bin_file}@byte {bad * reader.dtype.itemsize}: token id {int(tokens[bad])} "
                f"is outside the vocabulary of the sidecar's tokenizer ({vocab})"
            )
        counts = sidecar.get("counts") or {}
        if validate and counts.get("tokens") not in (None, reader.num_tokens):
            raise InputError(
                f"{strip_suffix(prefix)}.json: sidecar says {counts['tokens']} tokens, the .idx has {reader.num_tokens}"
            )
    return report


def _stats(lengths: np.ndarray) -> dict:
    if lengths.size == 0:
        return {"min": 0, "max": 0, "mean": 0.0, "median": 0.0, "p5": 0.0, "p95": 0.0}
    p5, p50, p95 = np.percentile(lengths, [5, 50, 95])
    return {
        "min": int(lengths.min()),
        "max": int(lengths.max()),
        "mean": round(float(lengths.mean()), 2),
        "median": float(p50),
        "p5": float(p5),
        "p95": float(p95),
    }


def format_report(report: dict) -> str:
    dl = report["document_length"]
    lines = [
        f"prefix        {report['prefix']}",
        f"dtype         {report['dtype']} (code {report['dtype_code']})",
        f"documents     {report['documents']:,} ({report['empty_documents']:,} empty)",
        f"sequences     {report['sequences']:,}",
        f"tokens        {report['tokens']:,}",
        f"doc length    min {dl['min']:,}  p5 {dl['p5']:,.0f}  median {dl['median']:,.0f}  mean {dl['mean']:,.1f}  "
        f"p95 {dl['p95']:,.0f}  max {dl['max']:,}",
        f"files         .bin {report['bin_bytes']:,} bytes, .idx {report['idx_bytes']:,} bytes",
    ]
    if "token_max" in report:
        lines.append(f"token ids     {report['token_min']}..{report['token_max']}")
    tok = report.get("tokenizer")
    if tok:
        lines.append(
            f"tokenizer     {tok.get('kind')} {tok.get('name')} (vocab {tok.get('vocab_size')}, eod {tok.get('eod_id')}, {tok.get('hash', '')[:19]}…)"
        )
    else:
        lines.append("tokenizer     unknown (no sidecar: made by Megatron or another tool)")
    lines.append(
        "valid         yes (index and .bin consistent, token ids checked)"
        if report["validated"]
        else "valid         index and .bin consistent (token ids not checked: --no-validate)"
    )
    return "\n".join(lines)


def parse_docs(spec: str, n: int) -> range:
    """``0:5``, ``7``, ``-3:``, ``:10``, ``0:100:10`` -> a range of document numbers within ``n``."""
    text = spec.strip()
    try:
        if ":" not in text:
            i = int(text)
            if not -n <= i < n:
                raise UsageError(f"--docs: document {i} out of range (0..{n - 1})")
            i %= n
            return range(i, i + 1)
        parts = [int(p) if p.strip() else None for p in text.split(":")]
    except ValueError:
        raise UsageError(f"--docs: expected N or START:STOP[:STEP], got {spec!r}") from None
    if len(parts) > 3:
        raise UsageError(f"--docs: expected N or START:STOP[:STEP], got {spec!r}")
    if len(parts) == 3 and parts[2] == 0:
        raise UsageError("--docs: step must not be zero")
    return range(n)[slice(*parts)]


def iter_documents(prefix: str | os.PathLike, docs: str | None = None):
    """(document number, token array) for the documents selected by ``docs`` (default: all)."""
    reader = IndexedDatasetReader(prefix)
    selected = parse_docs(docs, reader.num_documents) if docs else range(reader.num_documents)
    for j in selected:
        yield j, reader.document(j)
