"""The training data source: a blend of GPT datasets read straight from memory-mapped ``.bin`` files.

``BlendedGPTDataset.from_mix("mix.json", split="train")`` reopens a plan written by llm-mix (its index
cache, or rebuilt when the cache is gone); ``from_prefixes(...)`` builds one in code. Sample ``i`` is
``seq_length + 1`` token ids: blend position ``i`` -> (source, sample of that source) -> shuffled
sample -> (document-index position, offset) pairs -> token runs of the source's ``.bin``. A sample
inside one document is a zero-copy view of the memory map; one that spans documents is concatenated.
Everything is a pure function of the plan, so every rank, and every resumed run, sees the same
samples.

``MicroBatchSampler`` walks the blend in order from a consumed-sample count and hands each rank its
share of every micro-batch (Megatron's pretraining sampler): resuming from ``consumed_samples``
continues exactly where the interrupted run stopped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmtools import _native
from llmtools.data import mix as mixlib
from llmtools.data import mix_cache, plan_check
from llmtools.data.splits import DEFAULT_SPLIT, SPLITS
from llmtools.errors import InputError, UsageError
from llmtools.formats.indexed import IndexedDatasetReader, strip_suffix
from llmtools.formats.mix import MixFile


@dataclass
class _Part:
    """One source's arrays for one split, in the form the hot path wants."""

    reader: IndexedDatasetReader
    tokens: np.ndarray  # the whole .bin, flat (zero-copy)
    pointers: np.ndarray  # byte offset of each sequence in the .bin (the memory-mapped index)
    lengths: np.ndarray  # int32 tokens of each sequence
    itemsize: int
    kind: int  # dtype code for the compiled gather: 2 uint16, 4 int32, 0 none (Python path)
    document_index: np.ndarray
    sample_index: np.ndarray
    shuffle_index: np.ndarray

    # Pickled (DataLoader workers under spawn) by prefix: the memory map is reopened, never copied.
    def __getstate__(self) -> dict:
        return {
            "prefix": self.reader.prefix,
            "document_index": self.document_index,
            "sample_index": self.sample_index,
            "shuffle_index": self.shuffle_index,
        }

    def __setstate__(self, state: dict) -> None:
        fresh = _part(
            IndexedDatasetReader(state["prefix"]),
            state["document_index"],
            state["sample_index"],
            state["shuffle_index"],
        )
        self.__dict__.update(fresh.__dict__)


class BlendedGPTDataset:
    """Samples of ``seq_length + 1`` tokens in plan order (see the module docstring)."""

    def __init__(
        self,
        parts: list[_Part],
        dataset_index: np.ndarray,
        dataset_sample_index: np.ndarray,
        seq_length: int,
        *,
        tokenizer: dict | None = None,
        vocab_size: int | None = None,
        fingerprint: str = "",
        split: str = "train",
        source: str = "",
    ) -> None:
        self.parts = parts
        self.dataset_index = np.asarray(dataset_index).view(np.ndarray)
        self.dataset_sample_index = np.asarray(dataset_sample_index).view(np.ndarray)
        self.seq_length = int(seq_length)
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.fingerprint = fingerprint
        self.split = split
        self.source = source
        self._length = int(dataset_index.shape[0])
        dtypes = {p.tokens.dtype for p in parts}
        self.dtype = dtypes.pop() if len(dtypes) == 1 else np.dtype(np.int64)

    # -- construction --------------------------------------------------------------------------------
    @classmethod
    def from_mix(cls, mix: MixFile | str | os.PathLike, split: str = "train") -> BlendedGPTDataset:
        """Open one split of a ``mix.json`` (read once into a :class:`MixFile`, or already read): its cached
        indices, rebuilt and written back when missing (:func:`llmtools.data.mix_cache.load_split`)."""
        if split not in SPLITS:
            raise UsageError(f"split {split!r}: use one of {', '.join(SPLITS)}")
        if not isinstance(mix, MixFile):
            mix = MixFile.read(mix)
        if split not in mix.splits:
            raise InputError(
                f"{mix.path}: the plan has no {split} split (it has {', '.join(mix.splits) or 'none'})"
            )
        return cls.from_arrays(mix, split, mix_cache.load_split(mix, split))

    @classmethod
    def from_arrays(cls, mix: MixFile, split: str, arrays: dict[str, np.ndarray]) -> BlendedGPTDataset:
        """One split of ``mix`` over its index arrays (as :func:`~llmtools.data.mix_cache.load_split`
        returns them): checked against the sources, nothing written."""
        path = mix.path
        parts = []
        components = mix.splits[split]["components"]
        for k, comp in enumerate(components):
            described = mix.sources[comp["source"]]
            reader = _open_described(described, path)
            found = [
                arrays.get(f"{k}.{what}") for what in ("document_index", "sample_index", "shuffle_index")
            ]
            _check_part_arrays(reader, *found, mix.seq_length + 1, f"{path} (split {split}, source {k})")
            parts.append(_part(reader, *found))
        _check_blend_arrays(
            arrays.get("dataset_index"), arrays.get("dataset_sample_index"), parts, f"{path} (split {split})"
        )
        return cls(
            parts,
            arrays["dataset_index"],
            arrays["dataset_sample_index"],
            mix.seq_length,
            tokenizer=mix.tokenizer,
            vocab_size=_vocab_size(
                mix.tokenizer, [mix.sources[c["source"]].get("tokenizer") for c in components]
            ),
            fingerprint=f"{mix.identity}-{split}",
            split=split,
            source=str(path),
        )

    @classmethod
    def from_prefixes(
        cls,
        prefixes: Sequence[str],
        weights: Sequence[float] | None,
        seq_length: int,
        num_samples: int,
        seed: int = 1234,
        split: str = DEFAULT_SPLIT,
        cache_dir: str | os.PathLike | None = None,
        split_name: str = "train",
        allow_mixed_tokenizers: bool = False,
    ) -> BlendedGPTDataset:
        """Build a plan in code (``num_samples`` for ``split_name``); ``cache_dir`` keeps its ``.npy`` files."""
        plan = mixlib.plan_prefixes(
            prefixes,
            weights,
            seq_length,
            num_samples,
            seed=seed,
            split=split,
            split_name=split_name,
            allow_mixed_tokenizers=allow_mixed_tokenizers,
            cache_dir=cache_dir,
        )
        return cls.from_plan(plan, split_name, source=", ".join(map(str, prefixes)))

    @classmethod
    def from_plan(cls, plan, split: str = "train", source: str = "") -> BlendedGPTDataset:
        """The dataset of one split of an in-memory :class:`llmtools.data.mix.BuiltMix`."""
        if split not in plan.splits:
            raise InputError(
                f"{source or 'the plan'}: no {split} split (it has {', '.join(plan.splits) or 'none'})"
            )
        s = plan.splits[split]
        parts = [
            _part(
                plan.sources[c.source].reader,
                c.indices.document_index,
                c.indices.sample_index,
                c.indices.shuffle_index,
            )
            for c in s.components
        ]
        return cls(
            parts,
            s.dataset_index,
            s.dataset_sample_index,
            plan.config.seq_length,
            tokenizer=plan.tokenizer,
            vocab_size=_vocab_size(plan.tokenizer, [plan.sources[c.source].tokenizer for c in s.components]),
            fingerprint=f"{plan.hash}-{split}",
            split=split,
            source=source,
        )

    # -- access -------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._length

    def locate(self, i: int) -> tuple[int, int, int]:
        """(source part, sample within that source before shuffling, after shuffling) of blend position i."""
        if not -self._length <= i < self._length:
            raise IndexError(f"sample {i} out of range (0..{self._length - 1})")
        i = int(i) % self._length
        d = int(self.dataset_index[i])
        j = int(self.dataset_sample_index[i])
        return d, j, int(self.parts[d].shuffle_index[j])

    def _bounds(self, i) -> tuple[_Part, int, int, int, int]:
        """(part, b, bo, e, eo): sample i runs from document-index position b offset bo to e offset eo."""
        n = self._length
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range (0..{n - 1})")
        i = int(i)
        if i < 0:
            i += n
        p = self.parts[int(self.dataset_index[i])]
        k = int(p.shuffle_index[int(self.dataset_sample_index[i])])
        (b, bo), (e, eo) = p.sample_index[k : k + 2].tolist()
        return p, b, bo, e, eo

    def runs(self, i: int) -> tuple[int, list[tuple[int, int]]]:
        """(part, [(start in the part's flat tokens, length), ...]) making up sample i."""
        d = int(self.dataset_index[int(i)])
        p, b, bo, e, eo = self._bounds(i)
        doc, ptr, size, lengths = p.document_index, p.pointers, p.itemsize, p.lengths
        if b == e:
            return d, [(int(ptr[doc[b]]) // size + bo, eo - bo + 1)]
        seq = int(doc[b])
        out = [(int(ptr[seq]) // size + bo, int(lengths[seq]) - bo)]
        for x in range(b + 1, e):
            seq = int(doc[x])
            out.append((int(ptr[seq]) // size, int(lengths[seq])))
        out.append((int(ptr[doc[e]]) // size, eo + 1))
        return d, out

    def __getitem__(self, i: int) -> np.ndarray:
        """Sample i: ``seq_length + 1`` token ids (a read-only view of the .bin when in one document)."""
        p, b, bo, e, eo = self._bounds(i)
        doc, tokens, size = p.document_index, p.tokens, p.itemsize
        if b == e:  # the common case for long documents: no copy at all
            start = int(p.pointers[doc[b]]) // size + bo
            return tokens[start : start + eo - bo + 1]
        ptr, lengths = p.pointers, p.lengths
        seq = int(doc[b])
        start = int(ptr[seq]) // size
        parts = [tokens[start + bo : start + int(lengths[seq])]]
        for x in range(b + 1, e):
            seq = int(doc[x])
            start = int(ptr[seq]) // size
            parts.append(tokens[start : start + int(lengths[seq])])
        start = int(ptr[doc[e]]) // size
        parts.append(tokens[start : start + eo + 1])
        return np.concatenate(parts)

    def batch(self, indices) -> np.ndarray:
        """Samples ``indices`` stacked as int64, shape ``(len(indices), seq_length + 1)``.

        Resolved per source with vectorised index lookups, then copied by the compiled gather (or a
        Python loop over the samples when it is unavailable).
        """
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        width = self.seq_length + 1
        out = np.empty((indices.size, width), dtype=np.int64)
        if indices.size == 0:
            return out
        n = self._length
        if int(indices.min()) < -n or int(indices.max()) >= n:
            raise IndexError(f"sample index out of range (0..{n - 1})")
        indices = np.where(indices < 0, indices + n, indices)
        which = np.asarray(self.dataset_index[indices])
        samples = np.asarray(self.dataset_sample_index[indices])
        lib = _native.load()
        for d, p in enumerate(self.parts):
            rows = (
                np.flatnonzero(which == d) if len(self.parts) > 1 else np.arange(indices.size, dtype=np.int64)
            )
            if rows.size == 0:
                continue
            k = np.asarray(p.shuffle_index[samples[rows]], dtype=np.int64)
            bounds = np.empty((rows.size, 4), dtype=np.int64)
            bounds[:, 0:2] = p.sample_index[k]
            bounds[:, 2:4] = p.sample_index[k + 1]
            if lib is not None and p.kind:
                bad = lib.llm_gather_samples(
                    p.tokens.ctypes.data,
                    p.kind,
                    _native.ptr(p.pointers, _native._i64p),
                    _native.ptr(p.lengths, _native._i32p),
                    _native.ptr(p.document_index, _native._i32p),
                    _native.ptr(bounds, _native._i64p),
                    rows.size,
                    width,
                    _native.ptr(rows.astype(np.int64, copy=False), _native._i64p),
                    _native.ptr(out, _native._i64p),
                )
                if bad >= 0:
                    raise InputError(
                        f"{p.reader.idx_file}: sample {int(indices[rows[bad]])} does not add up (corrupt index?)"
                    )
                continue
            for r, (b, bo, e, eo) in zip(rows.tolist(), bounds.tolist(), strict=True):
                pos = 0
                for x in range(b, e + 1):
                    seq = int(p.document_index[x])
                    start = int(p.pointers[seq]) // p.itemsize + (bo if x == b else 0)
                    length = (eo + 1 if x == e else int(p.lengths[seq])) - (bo if x == b else 0)
                    out[r, pos : pos + length] = p.tokens[start : start + length]
                    pos += length
        return out

    def check_ids(self, batch: np.ndarray, indices) -> None:
        """Refuse token ids the plan's tokenizer does not have (a sidecar that does not describe its data):
        InputError naming the source, instead of an index error deep in the model. One max per batch."""
        if self.vocab_size is None or batch.size == 0 or int(batch.max()) < self.vocab_size:
            return
        row = int(np.argmax(batch.max(axis=1) >= self.vocab_size))
        sample = int(np.asarray(indices).reshape(-1)[row])
        part = self.parts[int(self.dataset_index[sample])]
        token = int(batch[row].max())
        raise InputError(
            f"{part.reader.bin_file}: token id {token} in sample {sample} of {self.source or 'the plan'} is outside "
            f"the {self.vocab_size} ids of the tokenizer its sidecar names: the sidecar does not describe this data"
        )

    def __iter__(self) -> Iterator[np.ndarray]:
        for i in range(self._length):
            yield self[i]

    def __repr__(self) -> str:
        return (
            f"BlendedGPTDataset({self.source!r}, split={self.split!r}, samples={self._length}, "
            f"seq_length={self.seq_length}, sources={len(self.parts)})"
        )


def _part(reader: IndexedDatasetReader, document_index, sample_index, shuffle_index) -> _Part:
    # Plain ndarray views: indexing an np.memmap element by element is several times slower.
    def plain(array, dtype=None):
        array = np.asarray(array).view(np.ndarray)
        return np.ascontiguousarray(array, dtype=dtype) if dtype is not None else array

    kind = {np.dtype(np.uint16): 2, np.dtype(np.int32): 4}.get(reader.dtype, 0)
    return _Part(
        reader,
        plain(reader.tokens()),
        plain(reader.sequence_pointers, np.int64),
        plain(reader.sequence_lengths, np.int32),
        reader.dtype.itemsize,
        kind,
        plain(document_index, np.int32),
        plain(sample_index),
        plain(shuffle_index),
    )


def _index_array(array, name: str, where: str, ndim: int = 1) -> np.ndarray:
    if not isinstance(array, np.ndarray) or array.ndim != ndim or not np.issubdtype(array.dtype, np.integer):
        raise InputError(
            f"{where}: cached {name} is missing or not a {ndim}-D integer array (corrupt cache?)"
        )
    return array


def _out_of(array: np.ndarray, low: int, high: int) -> bool:
    return bool(array.size) and (int(array.min()) < low or int(array.max()) >= high)


def _check_part_arrays(reader, document_index, sample_index, shuffle_index, width: int, where: str) -> None:
    """The cached indices of one source, checked against its (validated) index before any sample is read:
    every document id names a sequence, every sample bound lies inside its sequence and spans exactly
    ``width`` tokens, every shuffled sample exists. Vectorised, O(samples + documents drawn)."""
    doc = _index_array(document_index, "document_index", where)
    bounds = _index_array(sample_index, "sample_index", where, ndim=2)
    shuffle = _index_array(shuffle_index, "shuffle_index", where)
    if bounds.shape[1] != 2 or bounds.shape[0] < 1:
        raise InputError(f"{where}: cached sample_index has shape {bounds.shape}, expected (samples + 1, 2)")
    if _out_of(doc, 0, reader.num_sequences):
        raise InputError(f"{where}: cached document_index names sequences outside {reader.idx_file}")
    if _out_of(bounds[:, 0], 0, max(doc.size, 1)) or _out_of(shuffle, 0, bounds.shape[0] - 1):
        raise InputError(f"{where}: cached sample_index or shuffle_index out of range (corrupt cache?)")
    if doc.size == 0:
        if bounds.shape[0] > 1:
            raise InputError(f"{where}: cached samples but no documents (corrupt cache?)")
        return
    lengths = reader.sequence_lengths[doc].astype(np.int64)
    start = np.zeros(doc.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=start[1:])  # token position of each drawn document in the epoch stream
    row_docs, offsets = bounds[:, 0], bounds[:, 1]
    # Every bound is a token of its document (the first one may also be offset 0 of an empty document):
    # the inclusive end of a sample is read, so an offset at or past the length would read past it.
    inside_doc = (offsets >= 0) & (offsets < lengths[row_docs])
    inside_doc[0] |= offsets[0] == 0
    at = start[row_docs] + offsets
    if not inside_doc.all() or np.any(at[1:] - at[:-1] != width - 1):
        raise InputError(
            f"{where}: cached sample_index does not describe {width}-token samples (corrupt cache?)"
        )


def _check_blend_arrays(dataset_index, dataset_sample_index, parts: list, where: str) -> None:
    """The blend's cached arrays: each position names an existing source and one of its samples."""
    which = _index_array(dataset_index, "dataset_index", where)
    sample = _index_array(dataset_sample_index, "dataset_sample_index", where)
    if which.shape != sample.shape or _out_of(which, 0, len(parts)):
        raise InputError(
            f"{where}: cached dataset_index out of range or of the wrong length (corrupt cache?)"
        )
    for d, part in enumerate(parts):
        mine = sample[which == d] if len(parts) > 1 else sample
        if _out_of(mine, 0, part.shuffle_index.size):
            raise InputError(
                f"{where}: cached dataset_sample_index out of range for source {d} (corrupt cache?)"
            )


def _open_described(described: dict, mix_path: Path) -> IndexedDatasetReader:
    """Reopen a source named in a mix.json: its absolute path, else as given relative to the mix.json.

    Sources may lie outside the mix.json's folder (datasets live on shared storage, mixes beside runs);
    what a mix.json names is only ever opened as a validated ``.bin/.idx`` pair. A relative name is
    resolved inside the mix.json's folder, never above it.
    """
    candidates = [described["prefix"]]
    given = described.get("prefix_as_given")
    if isinstance(given, str) and given:
        if not Path(given).is_absolute() and ".." not in Path(given).parts:
            candidates.append(str(mix_path.parent / given))
        candidates.append(given)
    for prefix in candidates:
        prefix = strip_suffix(prefix)
        if Path(f"{prefix}.idx").exists() and Path(f"{prefix}.bin").exists():
            plan_check.check_source(
                described, prefix, mix_path
            )  # the files the plan was made from, before trusting them
            reader = IndexedDatasetReader(prefix)
            for key, have in (("sequences", reader.num_sequences), ("documents", reader.num_documents)):
                if key in described and described[key] != have:
                    raise InputError(
                        f"{mix_path}: source {prefix} changed since the plan was made ({key}: {described[key]} -> {have}); "
                        "run llm-mix again"
                    )
            return reader
    raise InputError(f"{mix_path}: source {described['prefix']} not found (.bin/.idx missing)")


def _vocab_size(tokenizer: dict | None, source_tokenizers: list) -> int | None:
    if isinstance(tokenizer, dict) and isinstance(tokenizer.get("vocab_size"), int):
        return tokenizer["vocab_size"]
    sizes = [
        t.get("vocab_size")
        for t in source_tokenizers
        if isinstance(t, dict) and isinstance(t.get("vocab_size"), int)
    ]
    return max(sizes) if sizes else None


class MicroBatchSampler:
    """Per-rank micro-batches of blend indices, from ``consumed_samples`` on (Megatron's pretraining sampler).

    The samples are taken in blend order. Each global batch ``[g*G, (g+1)*G)`` is cut into chunks of
    ``micro_batch * world_size``; rank ``r`` gets ``[r*m, (r+1)*m)`` of every chunk, so the ranks'
    shards partition each global batch. A chunk that would run past ``num_samples`` is dropped.
    """

    def __init__(
        self,
        num_samples: int,
        micro_batch: int,
        global_batch: int,
        rank: int,
        world_size: int,
        consumed_samples: int = 0,
    ) -> None:
        for name, value, low in (
            ("num_samples", num_samples, 0),
            ("micro_batch", micro_batch, 1),
            ("global_batch", global_batch, 1),
            ("world_size", world_size, 1),
            ("rank", rank, 0),
            ("consumed_samples", consumed_samples, 0),
        ):
            if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < low:
                raise UsageError(f"MicroBatchSampler: {name} must be an integer >= {low}, not {value!r}")
        if rank >= world_size:
            raise UsageError(f"MicroBatchSampler: rank {rank} is not below world_size {world_size}")
        if global_batch % (micro_batch * world_size):
            raise UsageError(
                f"global batch {global_batch} is not a multiple of micro batch {micro_batch} x world size {world_size}"
            )
        self.num_samples = int(num_samples)
        self.micro_batch = int(micro_batch)
        self.global_batch = int(global_batch)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.consumed_samples = int(consumed_samples)
        self.chunk = self.micro_batch * self.world_size

    def __len__(self) -> int:
        """Micro-batches this rank will yield."""
        return max(0, self.num_samples - self.consumed_samples) // self.chunk

    def __iter__(self) -> Iterator[list[int]]:
        lo = self.rank * self.micro_batch
        start = self.consumed_samples
        while start + self.chunk <= self.num_samples:
            first = start + lo
            yield list(range(first, first + self.micro_batch))
            start += self.chunk
