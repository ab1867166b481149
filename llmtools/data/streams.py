"""Each source of a run is a stream: its samples in one fixed order, read from a cursor.

In Megatron's blend, source *i*'s *k*-th draw is sample ``k`` of source *i*'s own shuffled GPT index,
so a run's data position is one cursor per source. This module fixes what "source *i*'s samples in
order" means for a whole run, including after its mix changes:

- **segment 0** is the GPT index Megatron builds for the source in the first plan (or stage) that
  draws from it: ``first_samples`` samples asked for (None: one epoch, Megatron's rule for a blend
  without weights), with that plan's seed. A static plan therefore reads exactly Megatron's arrays.
- when a run draws more than segment 0 holds, **one-epoch segments** follow: segment ``e`` is a fresh
  GPT index over exactly one epoch of the source's split, shuffled with :func:`segment_seed`. Segment
  0 ends where its last epoch ends (Megatron's index spans whole epochs), so every later epoch is read
  whole, in its own order: no sample repeats or is skipped until its epoch ends.

Position ``p`` of a stream is sample ``shuffle_index[p - start_e]`` of segment ``e``. A stream is a
pure function of its :class:`StreamSpec`, so a resumed run (on any world size, after any change of
mix) rebuilds the same one.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from llmtools.data.gpt_index import GPTIndices, build_gpt_indices
from llmtools.errors import InputError
from llmtools.formats.indexed import IndexedDatasetReader

SEGMENT_SEED_STEP = 0x9E3779B1
"""Seeds of one-epoch segments step by an odd 32-bit constant (the golden ratio's), so no two
segments of a stream, and no segment and a plan's usual seeds (1234, 42, ...), share a shuffle."""


MAX_EPOCHS = 100_000
"""No run reads a source this many times over: a cursor further in comes from an edited file."""


def segment_seed(seed: int, segment: int) -> int:
    """The shuffle seed of a stream's segment (segment 0 keeps the plan's seed)."""
    return (int(seed) + int(segment) * SEGMENT_SEED_STEP) % 2**32


@dataclass(frozen=True)
class StreamSpec:
    """Everything a source's stream depends on; recorded in every checkpoint's data ledger."""

    key: str
    """sha256 of the source's ``.idx``: a source is its content (a file replaced under the same path
    is another source)."""
    prefix: str
    """Absolute prefix where the source was read."""
    name: str
    """Short name for reports, metrics and plots (unique within a run)."""
    sequence_range: tuple[int, int]
    """The train split's sequences ``[beg, end)``."""
    seq_length: int
    seed: int
    first_samples: int | None
    """Samples segment 0 was built for (None: one epoch)."""
    tokens_per_epoch: int

    def to_json(self) -> dict:
        out = asdict(self)
        out["sequence_range"] = list(self.sequence_range)
        return out

    @classmethod
    def from_json(cls, data, where: str) -> StreamSpec:
        """A spec read from a file we did not just write: every field checked, errors name the key."""
        if not isinstance(data, dict):
            raise InputError(f"{where}: expected an object")
        out = {}
        for key, kinds in (
            ("key", str),
            ("prefix", str),
            ("name", str),
            ("seq_length", int),
            ("seed", int),
            ("tokens_per_epoch", int),
        ):
            value = data.get(key)
            if not isinstance(value, kinds) or isinstance(value, bool):
                raise InputError(f"{where}.{key}: missing or not a {kinds.__name__}")
            out[key] = value
        first = data.get("first_samples")
        if first is not None and (not isinstance(first, int) or isinstance(first, bool) or first < 1):
            raise InputError(f"{where}.first_samples: must be a positive integer or null")
        rng = data.get("sequence_range")
        if (
            not isinstance(rng, list)
            or len(rng) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in rng)
            or not 0 <= rng[0] < rng[1]
        ):
            raise InputError(f"{where}.sequence_range: expected [begin, end) with 0 <= begin < end")
        if out["seq_length"] < 1 or out["tokens_per_epoch"] < 2 or not 0 <= out["seed"] < 2**32:
            raise InputError(f"{where}: seq_length, tokens_per_epoch or seed out of range")
        return cls(sequence_range=(rng[0], rng[1]), first_samples=first, **out)

    def same_stream(self, other: StreamSpec) -> bool:
        """Whether both describe the same samples in the same order (where it was read aside)."""
        mine, theirs = asdict(self), asdict(other)
        for ignored in ("prefix", "name"):
            mine.pop(ignored), theirs.pop(ignored)
        return mine == theirs


def display_name(prefix: str, taken: set[str]) -> str:
    """A short unique name for a source: its file name, with parent folders added until unique."""
    parts = Path(prefix).parts
    for depth in range(1, len(parts) + 1):
        name = "/".join(parts[-depth:])
        if name not in taken:
            return name
    name, n = prefix, 2
    while f"{name}#{n}" in taken:
        n += 1
    return f"{name}#{n}"


@dataclass
class SourceStream:
    """One source's stream: its segments, built when first needed (see the module docstring)."""

    spec: StreamSpec
    reader: IndexedDatasetReader = field(repr=False)
    _segments: list[GPTIndices] = field(default_factory=list, repr=False)
    _starts: list[int] = field(default_factory=lambda: [0], repr=False)
    _inverse: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, spec: StreamSpec, reader: IndexedDatasetReader | None = None, first=None) -> SourceStream:
        """The stream of ``spec``; ``first`` is segment 0 when the caller has it already (a plan's cache)."""
        if reader is None:
            if not (os.path.exists(f"{spec.prefix}.idx") and os.path.exists(f"{spec.prefix}.bin")):
                raise InputError(f"{spec.prefix}: source {spec.name} not found (.bin/.idx missing)")
            reader = IndexedDatasetReader(spec.prefix)
        stream = cls(spec, reader)
        if first is not None:
            stream._add(first)
        return stream

    def _add(self, indices: GPTIndices) -> None:
        self._segments.append(indices)
        self._starts.append(self._starts[-1] + indices.num_samples)

    def segment(self, e: int) -> GPTIndices:
        while len(self._segments) <= e:
            k = len(self._segments)
            lengths = self.reader.sequence_lengths
            spec = self.spec
            samples = spec.first_samples if k == 0 else None
            self._add(
                build_gpt_indices(
                    lengths, spec.sequence_range, samples, spec.seq_length, segment_seed(spec.seed, k)
                )
            )
        return self._segments[e]

    def start(self, e: int) -> int:
        """Stream position of segment ``e``'s first sample."""
        while len(self._starts) <= e:
            self.segment(len(self._segments))
        return self._starts[e]

    @property
    def epoch_samples(self) -> int:
        """Samples in one epoch of the source's split (one-epoch segments hold about this many)."""
        return max(1, (self.spec.tokens_per_epoch - 1) // self.spec.seq_length)

    def split_documents(self) -> np.ndarray:
        """The ids of the documents the source's train split reads (a sequence range within them)."""
        beg, end = self.spec.sequence_range
        bounds = self.reader.document_indices
        first = int(np.searchsorted(bounds, beg, side="right")) - 1
        last = int(np.searchsorted(bounds, end - 1, side="right")) - 1
        return np.arange(max(first, 0), last + 1, dtype=np.int64)

    def check_position(self, position: int, where: str) -> None:
        """A cursor no run could have reached (more than :data:`MAX_EPOCHS` epochs in) is refused before
        a segment is built for it: each epoch costs an index in memory."""
        if position > MAX_EPOCHS * self.epoch_samples:
            raise InputError(
                f"{where}: source {self.spec.name}: position {position} is {position // self.epoch_samples} "
                f"epochs into the source (at most {MAX_EPOCHS}): not a position this run reached"
            )

    def ensure(self, positions: int) -> int:
        """Build segments until positions ``[0, positions)`` exist; the number of segments."""
        self.check_position(positions - 1, "the data")
        e = 0
        while True:
            self.segment(e)
            if self._starts[e + 1] >= positions:
                return e + 1
            e += 1

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(segment, sample within it) of each stream position (built as needed)."""
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size:
            self.ensure(int(positions.max()) + 1)
        starts = np.asarray(self._starts[:-1], dtype=np.int64)
        seg = np.searchsorted(starts, positions, side="right") - 1
        return seg, positions - starts[seg]

    def segment_of(self, position: int) -> int:
        self.ensure(position + 1)
        return bisect.bisect_right(self._starts, position) - 1

    def segment_end(self, e: int) -> int:
        self.segment(e)
        return self._starts[e + 1]

    # -- what a sample holds ---------------------------------------------------------------------
    def documents(self, position: int) -> list[dict]:
        """The documents sample ``position`` reads: document id, sequence id, token range [start, end)."""
        e = self.segment_of(position)
        seg = self.segment(e)
        k = int(seg.shuffle_index[position - self._starts[e]])
        (b, bo), (end, eo) = seg.sample_index[k : k + 2].tolist()
        doc_bounds = self.reader.document_indices
        out = []
        for x in range(b, end + 1):
            sequence = int(seg.document_index[x])
            length = int(self.reader.sequence_lengths[sequence])
            lo = bo if x == b else 0
            hi = eo + 1 if x == end else length
            document = int(np.searchsorted(doc_bounds, sequence, side="right")) - 1
            out.append({"document": document, "sequence": sequence, "start": lo, "end": hi})
        return out

    def sample_of(self, position: int) -> tuple[int, int]:
        """(segment, GPT sample id within it) at ``position``."""
        e = self.segment_of(position)
        return e, int(self.segment(e).shuffle_index[position - self._starts[e]])

    def bad_positions(self, documents, lo: int, hi: int) -> np.ndarray:
        """Sorted stream positions in ``[lo, hi)`` whose sample reads any token of ``documents``."""
        if hi <= lo or not documents:
            return np.empty(0, dtype=np.int64)
        bounds = self.reader.document_indices
        docs = np.asarray(sorted(set(int(d) for d in documents)), dtype=np.int64)
        docs = docs[(docs >= 0) & (docs < bounds.shape[0] - 1)]
        sequences = np.concatenate(
            [np.arange(bounds[d], bounds[d + 1], dtype=np.int64) for d in docs.tolist()]
            or [np.empty(0, np.int64)]
        )
        found = []
        self.ensure(hi)
        for e in range(self.segment_of(lo), self.segment_of(hi - 1) + 1):
            seg = self.segment(e)
            xs = np.flatnonzero(np.isin(seg.document_index, sequences))
            if xs.size == 0:
                continue
            starts = np.asarray(seg.sample_index[:, 0], dtype=np.int64)
            n = seg.num_samples
            # sample k reads document-index positions starts[k] .. starts[k + 1] (both included)
            first = np.searchsorted(starts[1 : n + 1], xs, side="left")
            last = np.searchsorted(starts[:n], xs, side="right") - 1
            ks = np.unique(
                np.concatenate(
                    [np.arange(a, b + 1) for a, b in zip(first.tolist(), last.tolist(), strict=True)]
                )
            )
            inverse = self._inverse.get(e)
            if inverse is None:
                inverse = np.empty(n, dtype=np.int64)
                inverse[np.asarray(seg.shuffle_index, dtype=np.int64)] = np.arange(n, dtype=np.int64)
                self._inverse[e] = inverse
            found.append(inverse[ks] + self._starts[e])
        if not found:
            return np.empty(0, dtype=np.int64)
        positions = np.unique(np.concatenate(found))
        return positions[(positions >= lo) & (positions < hi)]
