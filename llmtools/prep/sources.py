"""Document sources: the first step of the json2bin pipeline (read -> encode -> write).

A :class:`DocumentSource` yields *work items* in input order. A work item is small and picklable,
and its :meth:`WorkItem.parse` turns it into a :class:`DocBatch` (the texts per json key plus where
each document came from). Parsing runs inside the encoder's worker processes, so a source can hand
out raw bytes (JSONL) and let the workers do the JSON decoding in parallel, while a source that
already holds texts (a Hugging Face dataset, Parquet) yields :class:`DocBatch` objects directly,
whose ``parse`` returns themselves.

Bad records (malformed JSON, a missing key, ...) are reported as :class:`BadRecord` with a kind
(the key of the sidecar's ``counts.skipped``) and a ``file:line: what is wrong`` message.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from llmtools.errors import InputError


@dataclass
class BadRecord:
    kind: str  # malformed_json, not_an_object, missing_key, not_a_string, invalid_utf8, truncated_line, ...
    message: str  # "file:line: what is wrong"
    line: int = 0


class FlatTexts:
    """Texts as one UTF-8 buffer plus offsets (text i is ``data[offsets[i]:offsets[i + 1]]``): what the
    JSONL fast path produces and gigatoken encodes, with no Python object per document. Sized and
    iterable like the ``list[str]`` it stands for."""

    __slots__ = ("data", "offsets")

    def __init__(self, data, offsets) -> None:
        self.data = data  # numpy uint8
        self.offsets = offsets  # numpy int64, len(texts) + 1 entries, starting at 0

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> str:
        i = range(len(self))[i]  # negative indices, and IndexError past the end, as a list has them
        return self.data[self.offsets[i] : self.offsets[i + 1]].tobytes().decode("utf-8")

    def __iter__(self) -> Iterator[str]:
        return iter(self.tolist())

    def tolist(self) -> list[str]:
        raw, ends = self.data.tobytes(), self.offsets.tolist()
        return [raw[a:b].decode("utf-8") for a, b in zip(ends, ends[1:])]  # noqa: B905

    @staticmethod
    def concat(parts: Sequence[FlatTexts]) -> FlatTexts:
        import numpy as np

        if len(parts) == 1:
            return parts[0]
        data = np.concatenate([p.data for p in parts])
        shifts = np.cumsum([0] + [int(p.offsets[-1]) for p in parts[:-1]])
        offsets = np.concatenate([[0]] + [p.offsets[1:] + s for p, s in zip(parts, shifts)])  # noqa: B905
        return FlatTexts(data, offsets.astype(np.int64, copy=False))


def join_texts(parts: Sequence) -> list[str] | FlatTexts:
    """Several batches' texts for one key as one sequence (flat when they all are)."""
    if all(isinstance(p, FlatTexts) for p in parts):
        return FlatTexts.concat(parts)
    if len(parts) == 1:
        return parts[0]
    return [t for p in parts for t in p]


@dataclass
class DocBatch:
    """Documents ready to encode: ``texts[key][i]`` is document i's text for json key ``key``
    (a list of str, or :class:`FlatTexts`)."""

    texts: dict[str, list[str] | FlatTexts]
    source: str = ""
    lines: list[int] = field(default_factory=list)  # line (or row) number of each document, 1-based
    bad: list[BadRecord] = field(default_factory=list)
    nbytes: int = 0  # input bytes this batch covers (for MB/s)
    blank_lines: int = 0

    def __len__(self) -> int:
        return len(self.lines) if self.lines else (len(next(iter(self.texts.values()))) if self.texts else 0)

    def parse(self, keys: Sequence[str], skip_bad: bool = False, flat: bool = False) -> DocBatch:
        missing = [k for k in keys if k not in self.texts]
        if missing:
            raise InputError(f"{self.source}: no column {missing[0]!r} (have {', '.join(self.texts)})")
        return self


@runtime_checkable
class WorkItem(Protocol):
    def parse(self, keys: Sequence[str], skip_bad: bool = False, flat: bool = False) -> DocBatch:
        """Runs in a worker process. With ``skip_bad=False`` it may stop at the first bad record.
        ``flat=True`` allows :class:`FlatTexts` in the result (it is a hint, not a promise)."""
        ...


@runtime_checkable
class DocumentSource(Protocol):
    """Anything json2bin can read: yields work items in order, then describes its inputs."""

    def batches(self) -> Iterator[WorkItem]: ...

    def inputs(self) -> list[dict]:
        """For the sidecar, after iteration: ``[{"path", "size", "sha256"}, ...]``."""
        ...

    @property
    def skipped(self) -> dict[str, int]:
        """File-level problems skipped with ``skip_bad`` (e.g. ``{"empty_file": 1}``)."""
        ...

    @property
    def total_bytes(self) -> int | None:
        """Input size for a progress bar, when known in advance (None: unknown, e.g. stdin, .gz)."""
        ...


class ListSource:
    """Documents already in memory (tests, small programs): one DocBatch per ``batch_size`` texts."""

    def __init__(
        self, texts: dict[str, list[str]] | list[str], name: str = "<memory>", batch_size: int = 1024
    ) -> None:
        self.texts = (
            {"text": list(texts)} if isinstance(texts, list) else {k: list(v) for k, v in texts.items()}
        )
        self.name = name
        self.batch_size = batch_size
        self.skipped: dict[str, int] = {}
        self.total_bytes = None

    def batches(self) -> Iterator[DocBatch]:
        n = len(next(iter(self.texts.values()))) if self.texts else 0
        for lo in range(0, n, self.batch_size):
            hi = min(n, lo + self.batch_size)
            part = {k: v[lo:hi] for k, v in self.texts.items()}
            nbytes = sum(len(t.encode("utf-8")) for v in part.values() for t in v)
            yield DocBatch(part, self.name, list(range(lo + 1, hi + 1)), nbytes=nbytes)

    def inputs(self) -> list[dict]:
        return []
