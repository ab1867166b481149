"""The shard files of an export: record batches into ``num_shards`` files of equal row counts, in
``datasets``' Arrow layout or as Parquet shards named as on the Hub. pyarrow is imported inside the
methods that open a shard.
"""

from __future__ import annotations

import os
from pathlib import Path


class ShardWriter:
    """Writes record batches into ``num_shards`` shards of equal row counts (as ``save_to_disk`` does),
    under temporary names, renamed to their final names by :meth:`finish`."""

    suffix = ""

    def __init__(self, folder: Path, schema, num_rows: int, num_shards: int, split: str) -> None:
        self.folder = folder
        self.schema = schema
        self.split = split
        self.rows_per_shard = max(1, -(-num_rows // max(1, num_shards)))
        self.shards: list[Path] = []
        self._writer = None
        self._rows = 0

    def write(self, batch) -> None:
        offset = 0
        while offset < batch.num_rows:
            if self._writer is None or self._rows >= self.rows_per_shard:
                self._close_shard()
                self._open_shard(self.folder / f"shard-{len(self.shards):05d}{self.suffix}.part")
                self._rows = 0
            take = min(batch.num_rows - offset, self.rows_per_shard - self._rows)
            part = batch if take == batch.num_rows else batch.slice(offset, take)  # zero-copy
            self._writer.write_batch(part)
            self._rows += take
            offset += take

    def _open_shard(self, path: Path) -> None:
        raise NotImplementedError

    def _close_shard(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._sink.close()  # the file under the writer (see _sink), opened by _open_shard
            self._writer = None

    def finish(self) -> list[Path]:
        if not self.shards:  # an empty source still gives a valid, empty dataset
            self._open_shard(self.folder / f"shard-00000{self.suffix}.part")
        self._close_shard()
        final = []
        for i, path in enumerate(self.shards):
            target = self.folder / self.final_name(i, len(self.shards))
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
            final.append(target)
        return final

    def final_name(self, i: int, n: int) -> str:
        raise NotImplementedError


def _sink(path: Path):
    """A file to write a shard into: pyarrow's own (no Python in the write path) when the path is UTF-8
    text, which is all pyarrow takes; a Python file otherwise (a path is any bytes the filesystem allows)."""
    import pyarrow as pa

    try:
        text = os.fsdecode(path)
        text.encode("utf-8")
    except UnicodeEncodeError:
        return open(path, "wb")  # noqa: SIM115 - closed in _close_shard
    return pa.OSFile(text, "wb")


class ArrowShardWriter(ShardWriter):
    """``datasets``' on-disk layout: Arrow streaming IPC files ``data-XXXXX-of-NNNNN.arrow``."""

    suffix = ".arrow"

    def _open_shard(self, path: Path) -> None:
        import pyarrow as pa

        self._sink = _sink(path)
        self._writer = pa.ipc.new_stream(self._sink, self.schema)
        self.shards.append(path)

    def final_name(self, i: int, n: int) -> str:
        return f"data-{i:05d}-of-{n:05d}.arrow"


class ParquetShardWriter(ShardWriter):
    """Parquet shards named as on the Hub (``data/train-00000-of-00002.parquet``)."""

    suffix = ".parquet"

    def _open_shard(self, path: Path) -> None:
        import pyarrow.parquet as pq

        # Parquet stores uint16 as 4-byte INT32: zstd wins back the space at ~2x the speed of the default
        # dictionary encoding (measured on token ids: 12M vs 7M tokens/s, same size).
        self._sink = _sink(path)
        self._writer = pq.ParquetWriter(self._sink, self.schema, compression="zstd", use_dictionary=False)
        self.shards.append(path)

    def final_name(self, i: int, n: int) -> str:
        return f"data/{self.split}-{i:05d}-of-{n:05d}.parquet"
