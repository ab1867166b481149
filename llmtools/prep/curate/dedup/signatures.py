"""Stage 1, one unit per input: each document's MinHash signature, one file per band in datatrove's
record layout (the band's hashes then the document's index, little-endian, sorted), and the hash of its
normalised text for exact duplicates. Records are appended to the unit's temporary folder as documents
stream by, then each band is sorted on its own: memory holds one band of one input at a time."""

from __future__ import annotations

import os
from array import array
from pathlib import Path

import numpy as np

from llmtools.formats import jsonfile
from llmtools.fsutil import atomic_dir
from llmtools.prep.curate.dedup.config import DedupConfig, exact_hash
from llmtools.prep.curate.dedup.layout import InputDocs, Plan, sig_dir
from llmtools.prep.curate.dedup.minhash import Signer

FLUSH = 2048
"""Documents whose records are buffered before they are appended to the band files."""


def band_dtype(config: DedupConfig) -> np.dtype:
    """datatrove's record: `<{rows}{Q|I}I`, packed."""
    word = "<u8" if config.precision == 64 else "<u4"
    return np.dtype([(f"h{i}", word) for i in range(config.rows)] + [("doc", "<u4")])


EXACT_DTYPE = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("doc", "<u4")])
DOCS_DTYPE = np.dtype([("line", "<u8"), ("nbytes", "<u8"), ("nchars", "<u8")])


def sort_records(records: np.ndarray) -> np.ndarray:
    """Sorted by every field in order (hashes, then the document): datatrove's order, the same bytes."""
    names = records.dtype.names
    return records[np.lexsort([records[name] for name in reversed(names)])]


def signatures_done(out: Path, file: int) -> bool:
    return (sig_dir(out, file) / "docs.npy").exists()


def compute_signatures(out: Path, plan: Plan, file: int, signer: Signer | None = None, progress=None) -> dict:
    """Write input `file`'s signature folder (replacing nothing: a folder already there is complete)."""
    config = plan.config
    signer = signer or (Signer(config) if config.near else None)
    dtype = band_dtype(config)
    docs = InputDocs(plan, file)
    with atomic_dir(sig_dir(out, file)) as tmp:
        band_files = [
            open(tmp / f"band_{b:03d}.sig", "wb") for b in range(config.bands if config.near else 0)
        ]  # noqa: SIM115
        exact_file = open(tmp / "exact.bin", "wb") if config.exact else None  # noqa: SIM115
        lines, sizes, chars = array("Q"), array("Q"), array("Q")
        sigs: list[np.ndarray] = []
        sig_docs: list[int] = []
        hashes: list[bytes] = []
        try:
            for doc in docs:
                lines.append(doc.line)
                sizes.append(len(doc.text.encode("utf-8")))
                chars.append(len(doc.text))
                if exact_file is not None:
                    hashes.append(exact_hash(doc.text))
                if signer is not None:
                    sig = signer(doc.text)
                    if sig is not None:
                        sigs.append(sig)
                        sig_docs.append(doc.index)
                if len(lines) % FLUSH == 0:
                    _flush(band_files, exact_file, sigs, sig_docs, hashes, len(lines), dtype)
                    if progress is not None:
                        progress.set_postfix(f"{plan.paths[file]}: {len(lines):,} docs")
            _flush(band_files, exact_file, sigs, sig_docs, hashes, len(lines), dtype)
        finally:
            for handle in band_files:
                handle.close()
            if exact_file is not None:
                exact_file.close()
        for b in range(len(band_files)):
            _sort_file(tmp / f"band_{b:03d}.sig", dtype)
        if exact_file is not None:
            _sort_file(tmp / "exact.bin", EXACT_DTYPE)
        record = {"input": docs.inputs[0] if docs.inputs else None, "skipped": docs.skipped}
        (tmp / "input.json").write_text(jsonfile.dumps(record) + "\n", encoding="utf-8")
        table = np.empty(len(lines), dtype=DOCS_DTYPE)
        table["line"] = np.frombuffer(lines, dtype=np.uint64) if lines else 0
        table["nbytes"] = np.frombuffer(sizes, dtype=np.uint64) if sizes else 0
        table["nchars"] = np.frombuffer(chars, dtype=np.uint64) if chars else 0
        np.save(tmp / "docs.npy", table, allow_pickle=False)
    return {"documents": len(lines), "skipped": docs.skipped}


def _flush(band_files, exact_file, sigs, sig_docs, hashes, ndocs, dtype) -> None:
    if sigs:
        block = np.stack(sigs)  # (docs, bands, rows)
        for b, handle in enumerate(band_files):
            records = np.empty(len(sigs), dtype=dtype)
            for i in range(block.shape[2]):
                records[f"h{i}"] = block[:, b, i]
            records["doc"] = sig_docs
            handle.write(records.tobytes())
    if exact_file is not None and hashes:
        raw = np.frombuffer(b"".join(hashes), dtype="<u8").reshape(-1, 2)
        records = np.empty(len(hashes), dtype=EXACT_DTYPE)
        records["hi"], records["lo"] = raw[:, 0], raw[:, 1]
        records["doc"] = np.arange(ndocs - len(hashes), ndocs, dtype=np.uint32)
        exact_file.write(records.tobytes())
    sigs.clear()
    sig_docs.clear()
    hashes.clear()


def _sort_file(path: Path, dtype: np.dtype) -> None:
    records = np.fromfile(path, dtype=dtype)
    sorted_ = sort_records(records)
    del records
    with open(path, "wb") as handle:
        handle.write(sorted_.tobytes())
        handle.flush()
        os.fsync(handle.fileno())
