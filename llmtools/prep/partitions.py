"""Megatron-LM's ``preprocess_data.py --partitions N`` document order, reproduced without its side files.

With N partitions Megatron deals the input lines round-robin into N files beside the input (line g,
counted across all input files, goes to partition g % N), tokenizes each into its own dataset, and
merges those in partition order. So the output holds documents 0, N, 2N, ..., then 1, N+1, ...
(``--keep-sequential-samples`` cuts contiguous blocks instead, which keeps the input order: nothing
to reorder then). :class:`PartitionedWriter` gives the same bytes: it deals the encoded documents into
N temporary datasets and merges them as Megatron's builder does; the temporaries live in one folder
beside the output, removed however the run ends.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np

from llmtools.formats.indexed import IndexedDatasetReader, IndexedDatasetWriter, bin_path, strip_suffix
from llmtools.fsutil import TMP_MARK


class PartitionedWriter:
    """An :class:`IndexedDatasetWriter` look-alike (context manager, ``add_documents``, counts) that
    writes its documents in Megatron's ``--partitions`` order."""

    def __init__(self, prefix, dtype, partitions: int, durable: bool = True) -> None:
        if partitions < 2:
            raise ValueError("PartitionedWriter needs at least 2 partitions")
        self.prefix = strip_suffix(prefix)
        self.dtype = np.dtype(dtype)
        self.partitions = partitions
        self.durable = durable
        self.num_sequences = self.num_documents = self.num_tokens = 0
        self._next = 0  # index of the next document over the whole input

    def __enter__(self) -> PartitionedWriter:
        final = bin_path(self.prefix)
        final.parent.mkdir(parents=True, exist_ok=True)
        self._folder = Path(tempfile.mkdtemp(prefix=f"{final.name}{TMP_MARK}partitions-", dir=final.parent))
        self._parts = []
        try:
            for p in range(self.partitions):
                self._parts.append(
                    IndexedDatasetWriter(self._folder / f"part{p}", self.dtype, durable=False).__enter__()
                )
        except BaseException:
            self._close_parts(True)
            shutil.rmtree(self._folder, ignore_errors=True)
            raise
        return self

    def add_documents(self, tokens, lengths) -> None:
        tokens, lengths = np.asarray(tokens), np.asarray(lengths, dtype=np.int64)
        part_of_doc = (self._next + np.arange(lengths.size)) % self.partitions
        part_of_token = np.repeat(part_of_doc, lengths)
        for p, writer in enumerate(self._parts):
            docs = part_of_doc == p
            if docs.any():
                writer.add_documents(tokens[part_of_token == p], lengths[docs])
        self._next += lengths.size

    def _close_parts(self, failed: bool) -> None:
        error = (RuntimeError, RuntimeError("aborted"), None) if failed else (None, None, None)
        for writer in self._parts:
            writer.__exit__(*error)

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self._close_parts(exc_type is not None)
            if exc_type is None:
                with IndexedDatasetWriter(self.prefix, self.dtype, durable=self.durable) as final:
                    for p in range(self.partitions):
                        final.add_index(IndexedDatasetReader(self._folder / f"part{p}"))
                self.num_sequences, self.num_documents = final.num_sequences, final.num_documents
                self.num_tokens = final.num_tokens
        finally:
            shutil.rmtree(self._folder, ignore_errors=True)
