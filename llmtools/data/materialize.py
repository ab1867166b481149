"""The samples of a plan, in plan order, written as an indexed dataset of their own (``llm-mix
--materialize``): one ``seq_length + 1``-token document per sample, for tools that read a plain
``.bin/.idx`` and not a mix."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from llmtools.formats.fingerprint import sha256_file
from llmtools.formats.indexed import IndexedDatasetWriter, bin_path, idx_path, strip_suffix
from llmtools.formats.output_marks import write_marker
from llmtools.formats.sidecar import build_sidecar, commit_with_sidecars


def materialize(
    dataset,
    prefix: str | os.PathLike,
    mix_path: str | os.PathLike | None = None,
    chunk: int = 4096,
    mix_json: str | None = None,
    group=None,
) -> list[Path]:
    """Write the dataset's samples in plan order, one ``seq_length + 1``-token document each, as PREFIX.bin/.idx.

    A sidecar ``PREFIX.json`` records the tokenizer identity (when the plan has one) so that
    llm-prep inspect / cat and llm-export can decode it. With ``mix_json`` (the text of the mix.json at
    ``mix_path``, not written yet), that mix.json is written last, in the same step as the samples and
    the finished temporaries of ``group`` (an :class:`~llmtools.fsutil.AtomicGroup`: the index cache).
    """
    prefix = strip_suffix(prefix)
    dtypes = {p.tokens.dtype for p in dataset.parts}
    dtype = dtypes.pop() if len(dtypes) == 1 else np.dtype(np.int32)
    width = dataset.seq_length + 1
    n = len(dataset)
    inputs = []
    if mix_json is not None:
        data = mix_json.encode("utf-8")
        inputs.append({"path": str(mix_path), "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    elif mix_path is not None:
        mp = Path(mix_path)
        inputs.append({"path": str(mp), "size": mp.stat().st_size, "sha256": sha256_file(mp)})
    tok = dataset.tokenizer
    sidecar = build_sidecar(
        tokenizer=tok,
        dtype=dtype,
        inputs=inputs,
        documents=n,
        sequences=n,
        tokens=n * width,
        json_key=None,
        append_eod=False,
        materialized={
            "mix": str(mix_path) if mix_path else None,
            "split": dataset.split,
            "fingerprint": dataset.fingerprint,
            "seq_length": dataset.seq_length,
        },
    )
    with IndexedDatasetWriter(prefix, dtype) as writer:
        for lo in range(0, n, chunk):
            block = dataset.batch(np.arange(lo, min(n, lo + chunk), dtype=np.int64))
            writer.add_documents(
                block.reshape(-1).astype(dtype), np.full(block.shape[0], width, dtype=np.int64)
            )
        # Without a known tokenizer the file is like one Megatron wrote: no sidecar.
        last = {mix_path: mix_json} if mix_json is not None else None
        written = commit_with_sidecars([writer], {prefix: sidecar} if tok is not None else {}, last, group)
    sidecars = [p for p in written if mix_json is None or p != Path(mix_path)]
    if tok is None:  # ...but markers say llmtools wrote it (what --force may replace)
        for path in (bin_path(prefix), idx_path(prefix)):
            write_marker(path, "llm-mix --materialize", mix=str(mix_path) if mix_path else None)
    return [bin_path(prefix), idx_path(prefix), *sidecars]
