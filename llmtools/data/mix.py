"""Sample plans: which sample of which source the blend yields at each position, as Megatron-LM would.

:func:`build_plan` turns a :class:`MixConfig` (prefixes, weights, sequence length, sample counts, seed,
split or per-split blends) into a :class:`MixPlan` holding, per split, each source's GPT indices
(:mod:`llmtools.data.gpt_index`) and the blend's dataset / dataset-sample index
(:mod:`llmtools.data.blend`), following megatron-core 0.16's ``BlendedMegatronDatasetBuilder``:

- weights given: normalised; each source is indexed for ``ceil(ceil(size*w)*(1+surplus))`` samples
  and the blend has ``sum(ceil(size*w))`` samples (the 2025-02 and later semantics);
- no weights, several prefixes: each source is one epoch of its split, the weights are those
  lengths, the blend has ``min(size, sum)`` samples;
- one prefix, no weights: the source's own GPT indices for exactly ``size`` samples.

A source with weight 0 is left out of the blend (Megatron refuses it) with a warning.

A **mixture schedule** (``MixConfig.stages``, ``llm-mix --stage UNTIL WEIGHTS``) blends the train split
in stages (:mod:`llmtools.data.stages`): each stage is Megatron's blend of its own weights over its
range, and every source continues its stream (:mod:`llmtools.data.streams`) across stages. A schedule of
one stage is the static plan of the same weights, array for array.

:func:`save_plan` writes ``mix.json`` and the index cache (``.npy`` files beside it named by the plan's
hash, each written atomically); :func:`load_split` reopens one split, rebuilding the arrays when the
cache is missing.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from llmtools import __version__
from llmtools.data.blend import (
    DEFAULT_SURPLUS,
    blend_weights,
    build_blending_indices,
    check_weights,
    normalize_weights,
    samples_per_dataset,
)
from llmtools.data.gpt_index import GPTIndices, build_gpt_indices
from llmtools.data.splits import DEFAULT_SPLIT, SPLITS, parse_split, split_matrix, split_range
from llmtools.data.stages import Stage, StageSpec, resolve_ranges
from llmtools.data.stages import build as build_stages
from llmtools.data.streams import SourceStream, StreamSpec, display_name
from llmtools.errors import InputError, RuntimeFailure, UsageError
from llmtools.formats.fingerprint import fingerprint
from llmtools.formats.indexed import IndexedDatasetReader, strip_suffix
from llmtools.formats.mix import (
    FORMAT,
    MIN_SEQ_LENGTH,
    VERSION,
    MixFile,
    cache_digests,
    cache_names,
    mix_text,
    write_arrays,
)
from llmtools.formats.sidecar import read_sidecar
from llmtools.fsutil import atomic_group

MEGATRON_SEMANTICS = (
    "megatron-core 0.16 (core_v0.16.1): per-dataset samples ceil(ceil(size*w)*(1+surplus)), "
    "blend length sum(ceil(size*w)) (the 2025-02 and later surplus)"
)
DEFAULT_SEED = 1234
DEFAULT_MAX_EPOCHS = 4.0


# -- configuration -------------------------------------------------------------------------------
@dataclass
class Blend:
    """One blend: prefixes and their weights (None = weigh by size, as Megatron does)."""

    prefixes: list[str]
    weights: list[float] | None = None
    flag: str = field(default="--weights", compare=False, repr=False)  # named in error messages

    def __post_init__(self) -> None:
        if not self.prefixes:
            raise UsageError("no data: give at least one PREFIX (or --data-path)")
        if self.weights is not None:
            if len(self.weights) != len(self.prefixes):
                raise UsageError(
                    f"{self.flag}: {len(self.weights)} weight(s) for {len(self.prefixes)} source(s); "
                    "give one weight per PREFIX"
                )
            self.weights = check_weights(self.weights, self.flag)


@dataclass
class MixConfig:
    """What llm-mix is asked for; checks itself and names the flag at fault."""

    blend: Blend | None
    seq_length: int
    num_samples: int | None = None
    tokens: int | None = None
    valid_samples: int = 0
    test_samples: int = 0
    seed: int = DEFAULT_SEED
    split: str = DEFAULT_SPLIT
    blend_per_split: dict[str, Blend] | None = None
    surplus: float = DEFAULT_SURPLUS
    allow_mixed_tokenizers: bool = False
    max_epochs: float = DEFAULT_MAX_EPOCHS
    stages: list[StageSpec] | None = None
    """A mixture schedule for the train split (one weight per train prefix in each stage)."""
    global_batch_size: int | None = None
    """Turns stage boundaries given in steps into samples."""

    def __post_init__(self) -> None:
        _positive_int(self.seq_length, "--seq-length")
        if self.seq_length < MIN_SEQ_LENGTH:
            raise UsageError(f"--seq-length must be at least {MIN_SEQ_LENGTH}")
        if (self.num_samples is None) == (self.tokens is None):
            raise UsageError("give exactly one of --num-samples N or --tokens T")
        if self.tokens is not None:
            _positive_int(self.tokens, "--tokens")
            self.num_samples = -(-int(self.tokens) // int(self.seq_length))
        _positive_int(self.num_samples, "--num-samples")
        for flag, value in (("--valid-samples", self.valid_samples), ("--test-samples", self.test_samples)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UsageError(f"{flag} must be a non-negative integer, not {value!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed < 2**32:
            raise UsageError(f"--seed must be an integer in [0, 2**32), not {self.seed!r}")
        if not (isinstance(self.surplus, float | int) and 0 <= self.surplus < 10):
            raise UsageError(f"--surplus must be a number in [0, 10), not {self.surplus!r}")
        if (self.blend is None) == (self.blend_per_split is None):
            raise UsageError(
                "give either PREFIX.../--data-path or per-split blends (--train-data-path ...), not both"
            )
        if self.blend_per_split is not None:
            unknown = set(self.blend_per_split) - set(SPLITS)
            if unknown:
                raise UsageError(f"unknown split(s) {sorted(unknown)}; use train, valid, test")
            if "train" not in self.blend_per_split:
                raise UsageError("per-split blends need a train blend (--train-data-path)")
        else:
            self.split_vector = parse_split(self.split)
        if self.global_batch_size is not None:
            _positive_int(self.global_batch_size, "--global-batch-size")
        if self.stages is not None:
            self._check_stages()

    def _check_stages(self) -> None:
        train = self.blend if self.blend is not None else self.blend_per_split["train"]
        if not self.stages:
            raise UsageError("--stage: an empty schedule")
        for k, stage in enumerate(self.stages):
            if len(stage.weights) != len(train.prefixes):
                raise UsageError(
                    f"--stage {k + 1} ({stage.until.text()}): {len(stage.weights)} weight(s) for "
                    f"{len(train.prefixes)} source(s); give one weight per PREFIX (0 leaves one out)"
                )
            check_weights(stage.weights, f"--stage {k + 1} ({stage.until.text()})")
        if any(s.until.unit == "step" or s.start.unit == "step" for s in self.stages) and (
            self.global_batch_size is None
        ):
            raise UsageError("--stage in steps needs --global-batch-size N (the samples of one step)")
        # ranges in samples: overlaps, gaps and a schedule that ends early are refused here
        self.stage_ranges = resolve_ranges(
            self.stages, int(self.num_samples), self.seq_length, self.global_batch_size, "--stage {n}"
        )

    @property
    def sizes(self) -> dict[str, int]:
        return {"train": int(self.num_samples), "valid": self.valid_samples, "test": self.test_samples}


def _positive_int(value, flag: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise UsageError(f"{flag} must be a positive integer, not {value!r}")


# -- sources ----------------------------------------------------------------------------------------
@dataclass
class Source:
    """One ``.bin/.idx`` prefix on disk and what its index and sidecar say."""

    prefix: str  # as given
    path: str  # absolute prefix
    reader: IndexedDatasetReader = field(repr=False)
    sidecar: dict | None = field(repr=False)
    idx_sha256: str
    files: dict = field(
        default_factory=dict, repr=False
    )  # fingerprints of .idx and .bin (formats.fingerprint)

    @property
    def tokenizer(self) -> dict | None:
        tok = (self.sidecar or {}).get("tokenizer")
        return tok if isinstance(tok, dict) else None

    def describe(self) -> dict:
        return {
            "prefix": self.path,
            "prefix_as_given": self.prefix,
            "documents": int(self.reader.num_documents),
            "sequences": int(self.reader.num_sequences),
            "tokens": int(self.reader.num_tokens),
            "dtype": str(self.reader.dtype),
            "idx_sha256": self.idx_sha256,
            "files": self.files,
            "sidecar": self.sidecar is not None,
            "tokenizer": self.tokenizer,
        }


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def open_source(prefix: str, base: Path | None = None) -> Source:
    """Open and check one prefix (missing, corrupt, empty are :class:`InputError`)."""
    given = strip_suffix(prefix)
    candidates = [Path(given)]
    if base is not None and not Path(given).is_absolute():
        candidates.append(base / given)
    chosen = next(
        (c for c in candidates if Path(f"{c}.idx").exists() and Path(f"{c}.bin").exists()), candidates[0]
    )
    if not Path(f"{chosen}.idx").exists() and not Path(f"{chosen}.bin").exists():
        raise InputError(f"{given}: no such dataset (expected {given}.bin and {given}.idx)")
    reader = IndexedDatasetReader(chosen)  # validated on open
    if reader.num_tokens == 0:
        raise InputError(
            f"{reader.idx_file}: the dataset is empty (0 tokens in {reader.num_documents} documents)"
        )
    sidecar = read_sidecar(chosen)
    idx_sha256 = file_sha256(reader.idx_file)
    idx_stat = os.stat(reader.idx_file)
    files = {  # what a run checks on open: the index by stat and checksum, the tokens by stat and samples
        "idx": {"size": idx_stat.st_size, "mtime_ns": idx_stat.st_mtime_ns, "sha256": idx_sha256},
        "bin": fingerprint(reader.bin_file, sampled=True),
    }
    return Source(given, os.path.abspath(str(chosen)), reader, sidecar, idx_sha256, files)


def check_tokenizers(sources: list[Source], allow_mixed: bool) -> tuple[dict | None, list[str]]:
    """The common tokenizer identity (or None) and notes; mixed tokenizers are an error unless allowed."""
    notes: list[str] = []
    seen: dict[str, tuple[dict, str]] = {}
    for source in sources:
        tok = source.tokenizer
        if tok is None:
            why = "no sidecar" if source.sidecar is None else "its sidecar names no tokenizer"
            notes.append(f"{source.prefix}: {why} (e.g. written by Megatron); its tokenizer is not checked")
            continue
        key = str(tok.get("hash") or json.dumps(tok, sort_keys=True))
        seen.setdefault(key, (tok, source.prefix))
    if len(seen) > 1:
        described = "; ".join(
            f"{prefix}: {tok.get('name') or tok.get('source') or '?'} ({tok.get('hash', 'no hash')})"
            for tok, prefix in seen.values()
        )
        if not allow_mixed:
            raise InputError(
                f"sources were tokenized with different tokenizers: {described} "
                "(--allow-mixed-tokenizers to blend them anyway)"
            )
        notes.append(f"mixed tokenizers allowed: {described}")
        return None, notes
    return (next(iter(seen.values()))[0] if seen else None), notes


# -- the plan ---------------------------------------------------------------------------------------
@dataclass
class Component:
    """One source's part in one split's blend."""

    source: int
    weight: float | None  # as given (None: weighed by size)
    normalized_weight: float
    split_range: tuple[int, int]
    target_samples: int | None  # ceil(size*w): what the blend may draw
    built_samples: int | None  # what the GPT index was asked for (None: one epoch)
    indices: GPTIndices | None = field(default=None, repr=False)
    drawn: int = 0
    segment: int = 0
    """Which segment of the source's stream (staged plans read past segment 0 into one-epoch ones)."""


@dataclass
class SplitPlan:
    name: str
    requested: int
    size: int
    blend_weights: list[float]
    components: list[Component]
    dataset_index: np.ndarray | None = field(default=None, repr=False)
    dataset_sample_index: np.ndarray | None = field(default=None, repr=False)
    stages: list[StagePlan] | None = None


@dataclass
class StagePlan:
    """One stage of a staged train split, with what it drew."""

    spec: StageSpec
    stage: Stage
    sources: list[int]  # plan source of each of stage.keys
    drawn: list[int]  # samples drawn from each in the stage
    ends: list[int]  # stream position of each after the stage


@dataclass
class MixPlan:
    config: MixConfig
    sources: list[Source]
    splits: dict[str, SplitPlan]
    tokenizer: dict | None
    notes: list[str]
    warnings: list[str]
    hash: str


def _identity(
    config: MixConfig,
    sources: list[Source],
    blends: dict[str, tuple[Blend, tuple | None]],
    semantics: str | None = None,
) -> str:
    """Hash of everything the arrays depend on (not paths: moved data keeps its cache). ``semantics``: the
    blending rules a mix.json recorded (default: this version's)."""
    positions = {s.prefix: i for i, s in reversed(list(enumerate(sources)))}  # first one wins, as before
    ident = {
        "semantics": semantics or MEGATRON_SEMANTICS,
        "sources": [{"idx_sha256": s.idx_sha256, "dtype": str(s.reader.dtype)} for s in sources],
        "seq_length": config.seq_length,
        "seed": config.seed,
        "surplus": config.surplus,
        "sizes": config.sizes,
        "blends": {
            name: {
                "sources": [_index_of(sources, p, positions) for p in b.prefixes],
                "weights": b.weights,
                "bookend": list(bk) if bk else None,
            }
            for name, (b, bk) in blends.items()
        },
    }
    if config.stages is not None:  # absent otherwise, so static plans keep their hash
        ident["stages"] = [stage.to_json() for stage in config.stages]
        ident["global_batch_size"] = config.global_batch_size
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def _index_of(sources: list[Source], prefix: str, positions: dict[str, int] | None = None) -> int:
    given = strip_suffix(prefix)
    if positions is not None:
        return positions[given]
    for i, s in enumerate(sources):
        if s.prefix == given:
            return i
    raise KeyError(prefix)


def _split_blends(config: MixConfig) -> dict[str, tuple[Blend, tuple | None]]:
    """Per split: the blend and the book-end of each source's sequences that it reads."""
    if config.blend_per_split is not None:
        out = {name: (blend, (0.0, 1.0)) for name, blend in config.blend_per_split.items()}
    else:
        matrix = split_matrix(config.split_vector)
        out = {name: (config.blend, matrix[i]) for i, name in enumerate(SPLITS)}
    if config.stages is not None:
        # Evaluation data is not scheduled: without --weights, valid and test take the last stage's
        # weights (what the model ends on).
        for name in ("valid", "test"):
            blend, bookend = out.get(name, (None, None))
            if blend is not None and blend.weights is None and blend is out["train"][0]:
                out[name] = (
                    Blend(list(blend.prefixes), list(config.stages[-1].weights), blend.flag),
                    bookend,
                )
    return out


def build_plan(
    config: MixConfig, base: Path | None = None, with_arrays: bool = True, only: str | None = None
) -> MixPlan:
    """Open the sources, check them, and compute every index of every split (or of split ``only``)."""
    blends = _split_blends(config)
    sources: list[Source] = []
    opened: set[str] = set()
    by_abs: dict[str, int] = {}
    for blend, _ in blends.values():
        for prefix in blend.prefixes:
            given = strip_suffix(prefix)
            if given in opened:  # a set: blends of thousands of sources
                continue
            source = open_source(given, base)
            if source.path in by_abs:
                raise UsageError(
                    f"{given}: the same dataset is given twice ({sources[by_abs[source.path]].prefix})"
                )
            by_abs[source.path] = len(sources)
            opened.add(given)
            sources.append(source)
    tokenizer, notes = check_tokenizers(sources, config.allow_mixed_tokenizers)
    warnings: list[str] = []
    splits: dict[str, SplitPlan] = {}
    per_split = config.blend_per_split is not None
    for name in SPLITS:
        size = config.sizes[name]
        blend, bookend = blends.get(name, (None, None))
        if only is None and size > 0 and blend is None:
            raise UsageError(f"--{name}-samples {size} but no --{name}-data-path blend for it")
        if only is None and size > 0 and bookend is None:
            raise UsageError(
                f"--{name}-samples {size} but --split {config.split} gives the {name} split no data"
            )
        if only is None and name != "train" and size == 0 and per_split and blend is not None:
            raise UsageError(f"--{name}-data-path given but --{name}-samples is 0; give --{name}-samples N")
        if blend is None or bookend is None or size == 0 or (only is not None and name != only):
            continue
        if name == "train" and config.stages is not None:
            splits[name] = _plan_staged(size, blend, bookend, sources, config, with_arrays)
            continue
        splits[name] = _plan_split(
            name, size, blend, bookend, sources, config, warnings, with_arrays, per_split
        )
    if "train" not in splits and only is None:
        raise UsageError(f"--split {config.split}: the train split is empty")
    plan = MixPlan(config, sources, splits, tokenizer, notes, warnings, _identity(config, sources, blends))
    if with_arrays:
        warnings.extend(_warnings(plan))
    return plan


def _plan_split(
    name: str,
    size: int,
    blend: Blend,
    bookend,
    sources: list[Source],
    config: MixConfig,
    warnings: list[str],
    with_arrays: bool,
    per_split: bool = False,
) -> SplitPlan:
    positions = {s.prefix: i for i, s in reversed(list(enumerate(sources)))}  # first one wins
    ids = [_index_of(sources, p, positions) for p in blend.prefixes]
    _refuse_the_same_content(sources, ids, name)
    weights = blend.weights
    components: list[Component] = []
    if weights is not None:
        kept = [(i, w) for i, w in zip(ids, weights, strict=True) if w > 0]
        for i, w in zip(ids, weights, strict=True):
            if w == 0:
                warnings.append(f"{sources[i].prefix}: weight 0, left out of the {name} blend")
        norm = normalize_weights([w for _, w in kept])
        targets, built = samples_per_dataset(norm, size, config.surplus)
        for (i, w), nw, t, b in zip(kept, norm, targets, built, strict=True):
            components.append(Component(i, w, nw, _range(sources[i], bookend, name), t, b))
    else:
        for i in ids:
            components.append(Component(i, None, 0.0, _range(sources[i], bookend, name), None, None))
    # Megatron reads a lone prefix directly (no blend, no surplus): without a weight in a global blend,
    # and always in a per-split blend.
    single = len(components) == 1 and (weights is None or per_split)
    if single:
        components[0].built_samples = size
        components[0].target_samples = size
        components[0].normalized_weight = 1.0
    from llmtools.progress import Progress

    # One step per source: its document, sample and shuffle indices (the long part for big sources).
    with Progress(len(components), f"mix {name} indices", unit="source") as bar:
        for comp in components:
            comp.indices = _gpt(sources[comp.source], comp, config, name)
            bar.update(1)
    if single:
        total, bw = size, [1.0]
    elif weights is None:
        lengths = [c.indices.num_samples for c in components]
        bw = normalize_weights(lengths)
        for c, nw in zip(components, bw, strict=True):
            c.normalized_weight = nw
            c.target_samples = c.indices.num_samples
        total = min(size, sum(lengths))
        if total < size:
            warnings.append(
                f"{name}: without weights each source gives one epoch (Megatron's rule): {total} samples, "
                f"fewer than the {size} requested; give weights to repeat data"
            )
    else:
        total = sum(c.target_samples for c in components)
        bw = blend_weights([c.normalized_weight for c in components])
    plan = SplitPlan(name, size, total, bw, components)
    if with_arrays:
        if single:
            plan.dataset_index = np.zeros(total, dtype=np.int16)
            plan.dataset_sample_index = np.arange(total, dtype=np.int64)
        else:
            plan.dataset_index, plan.dataset_sample_index = build_blending_indices(bw, total)
        counts = np.bincount(plan.dataset_index, minlength=len(components))
        for c, drawn in zip(components, counts.tolist(), strict=True):
            c.drawn = drawn
            if drawn > c.indices.num_samples:
                raise RuntimeFailure(
                    f"{name} blend draws {drawn} samples from {sources[c.source].prefix}, more than the "
                    f"{c.indices.num_samples} its index holds; raise --surplus (now {config.surplus})"
                )
    return plan


def source_names(sources: list[Source]) -> list[str]:
    """A short unique name per source (reports, metrics, the run's data ledger)."""
    taken: set[str] = set()
    names = []
    for source in sources:
        name = display_name(source.path, taken)
        taken.add(name)
        names.append(name)
    return names


def _refuse_the_same_data_twice(sources: list[Source], used: list[int], keys: list[str]) -> None:
    """A schedule continues each source by its content (the .idx digest): two prefixes holding the same
    data would be one stream drawn under two weights."""
    seen: dict[str, int] = {}
    for i in used:
        first = seen.setdefault(keys[i], i)
        if first != i:
            raise InputError(
                f"{sources[i].prefix}: the same data as {sources[first].prefix} (identical .idx): a mixture "
                "schedule follows each source by its content, so it cannot be listed twice; give it one "
                "weight (the sum) per stage"
            )


def content_key(source: Source) -> tuple[str, str | None]:
    """(the bytes: .idx digest, .bin size and sampled digest; what made them, from the sidecar: tokenizer
    hash, the inputs' digests, key and options, or None without a sidecar)."""
    data = {k: v for k, v in (source.files.get("bin") or {}).items() if k != "mtime_ns"}
    data_key = json.dumps([source.idx_sha256, data], sort_keys=True)
    if source.sidecar is None:
        return data_key, None
    side = source.sidecar
    made_from = {
        "tokenizer": (source.tokenizer or {}).get("hash"),
        "inputs": [i.get("sha256") for i in side.get("inputs") or [] if isinstance(i, dict)],
        **{k: side.get(k) for k in ("json_key", "append_eod", "special_tokens", "dtype", "shard")},
    }
    return data_key, json.dumps(made_from, sort_keys=True, default=str)


def _refuse_the_same_content(sources: list[Source], ids: list[int], split: str) -> None:
    """Two prefixes with the same content would be blended as two sources: samples repeat and the
    ledger names one source under two names. Refused (a prefix copied under a second name is a mistake
    in the list): list it once, with one weight, the sum. The same bytes are the same content unless
    both sidecars say they were made from different inputs or with another tokenizer."""
    seen: dict[str, list[tuple[int, str | None]]] = {}
    for i in dict.fromkeys(ids):
        data_key, made = content_key(sources[i])
        for first, other in seen.get(data_key, []):
            if made is None or other is None or made == other:
                raise InputError(
                    f"{sources[i].prefix}: the same data as {sources[first].prefix} in the {split} blend "
                    "(identical .idx and .bin, from the same inputs and tokenizer); list it once, with one "
                    "weight (the sum)"
                )
        seen.setdefault(data_key, []).append((i, made))


def _plan_staged(
    size: int, blend: Blend, bookend, sources: list[Source], config: MixConfig, with_arrays: bool
) -> SplitPlan:
    """The train split of a mixture schedule: each stage Megatron's blend of its weights, the sources'
    streams continued across stages (segment 0 built as Megatron would for the first stage that draws
    from a source; one-epoch segments after it)."""
    positions = {s.prefix: i for i, s in reversed(list(enumerate(sources)))}  # first one wins
    ids = [_index_of(sources, p, positions) for p in blend.prefixes]
    names = source_names(sources)
    keys = [s.idx_sha256 for s in sources]
    _refuse_the_same_data_twice(sources, sorted(set(ids)), keys)
    ranges = config.stage_ranges
    streams: dict[str, SourceStream] = {}
    stage_list: list[Stage] = []
    kept_per_stage: list[list[int]] = []
    for k, (spec, (start, end)) in enumerate(zip(config.stages, ranges, strict=True)):
        kept = [(i, w) for i, w in zip(ids, spec.weights, strict=True) if w > 0]
        norm = normalize_weights([w for _, w in kept])
        targets, built = samples_per_dataset(norm, end - start, config.surplus)
        if k == len(config.stages) - 1:
            end = start + sum(targets)  # the last stage is as long as Megatron's blend of it
        for (i, _), n0 in zip(kept, built, strict=True):
            if keys[i] in streams:
                continue
            beg, stop = _range(sources[i], bookend, "train")
            lengths = sources[i].reader.sequence_lengths
            tokens = int(np.sum(lengths[beg:stop], dtype=np.int64))
            if tokens < 2:
                raise InputError(
                    f"{sources[i].prefix}: its train split (sequences {beg}..{stop}) holds fewer than 2 tokens"
                )
            stream_spec = StreamSpec(
                keys[i], sources[i].path, names[i], (beg, stop), config.seq_length, config.seed, n0, tokens
            )
            streams[keys[i]] = SourceStream.open(stream_spec, sources[i].reader)
        stage_list.append(
            Stage(
                start,
                end,
                [keys[i] for i, _ in kept],
                blend_weights(norm),
                norm,
                None,
                {"stage": k},
            )
        )
        kept_per_stage.append([i for i, _ in kept])
    built = build_stages(streams, stage_list, 0)
    by_key = {keys[i]: i for i in ids}
    components: list[Component] = []
    drawn = np.bincount(built.dataset_index, minlength=len(built.parts))
    for p, (key, segment) in enumerate(built.parts):
        stream = streams[key]
        comp = Component(
            by_key[key],
            None,
            0.0,
            stream.spec.sequence_range,
            int(drawn[p]),  # what the schedule draws from this segment
            stream.spec.first_samples if segment == 0 else None,
            stream.segment(segment),
            int(drawn[p]),
            segment,
        )
        components.append(comp)
    stage_plans = []
    for k, stage in enumerate(built.stages):
        counts = [built.counts[k][key] for key in stage.keys]
        ends = [built.position_after(k, key, n) for key, n in zip(stage.keys, counts, strict=True)]
        stage_plans.append(StagePlan(config.stages[k], stage, kept_per_stage[k], counts, ends))
    total = built.end
    for comp in components:  # the share of each source over the whole schedule
        comp.normalized_weight = sum(c.drawn for c in components if c.source == comp.source) / total
    plan = SplitPlan("train", size, total, [], components, stages=stage_plans)
    plan.dataset_index, plan.dataset_sample_index = built.dataset_index, built.dataset_sample_index
    return plan


def plan_prefixes(
    prefixes,
    weights,
    seq_length: int,
    num_samples: int,
    *,
    seed: int = DEFAULT_SEED,
    split: str = DEFAULT_SPLIT,
    split_name: str = "train",
    allow_mixed_tokenizers: bool = False,
    cache_dir: str | os.PathLike | None = None,
) -> MixPlan:
    """A plan built in code for one split (``num_samples`` samples of ``split_name``), as llm-mix would
    plan it; ``cache_dir`` keeps its ``.npy`` files."""
    if split_name not in SPLITS:
        raise UsageError(f"split {split_name!r}: use one of {', '.join(SPLITS)}")
    sizes = {"train": 1, "valid": 0, "test": 0}
    sizes[split_name] = num_samples
    config = MixConfig(
        blend=Blend([str(p) for p in prefixes], None if weights is None else list(weights)),
        seq_length=seq_length,
        num_samples=sizes["train"],
        valid_samples=sizes["valid"],
        test_samples=sizes["test"],
        seed=seed,
        split=split,
        allow_mixed_tokenizers=allow_mixed_tokenizers,
    )
    plan = build_plan(config, only=split_name)
    if split_name not in plan.splits:
        raise InputError(f"{', '.join(map(str, prefixes))}: no {split_name} split with --split {split}")
    if cache_dir is not None:
        write_cache(plan, Path(cache_dir), durable=False)
    return plan


def _range(source: Source, bookend, name: str) -> tuple[int, int]:
    beg, end = split_range(source.reader.num_sequences, bookend)
    if end <= beg:
        raise InputError(
            f"{source.prefix}: its {name} split is empty ({source.reader.num_sequences} sequences, "
            f"split {bookend[0]:.4g}..{bookend[1]:.4g}); use a coarser --split or more data"
        )
    return beg, end


def _gpt(source: Source, comp: Component, config: MixConfig, name: str) -> GPTIndices:
    lengths = source.reader.sequence_lengths
    beg, end = comp.split_range
    if int(np.sum(lengths[beg:end], dtype=np.int64)) < 2:
        raise InputError(
            f"{source.prefix}: its {name} split (sequences {beg}..{end}) holds fewer than 2 tokens"
        )
    return build_gpt_indices(lengths, comp.split_range, comp.built_samples, config.seq_length, config.seed)


def _warnings(plan: MixPlan) -> list[str]:
    out = []
    seq = plan.config.seq_length
    for split in plan.splits.values():
        if split.stages is not None:
            out += _stage_warnings(plan, split)
            continue
        for c in split.components:
            src = plan.sources[c.source]
            epochs = epochs_drawn(c, seq)
            if c.drawn == 0:
                out.append(
                    f"{src.prefix}: weight {c.normalized_weight:.3g} is too small: it gets no sample of the "
                    f"{split.size} in the {split.name} blend"
                )
            elif epochs > plan.config.max_epochs:
                out.append(
                    f"{src.prefix}: repeated {epochs:.2f} epochs in the {split.name} split (more than {plan.config.max_epochs:g})"
                )
            elif epochs > 1:
                out.append(
                    f"{src.prefix}: exhausted: its {split.name} split is read {epochs:.2f} times (repeated data)"
                )
    return out


def _stage_warnings(plan: MixPlan, split: SplitPlan) -> list[str]:
    out = []
    seq, limit = plan.config.seq_length, plan.config.max_epochs
    for k, st in enumerate(split.stages):
        for i, n in zip(st.sources, st.drawn, strict=True):
            if n == 0:
                out.append(
                    f"{plan.sources[i].prefix}: its weight in stage {k} ({st.spec.until.text()}) is too small: "
                    f"it gets no sample of the stage's {st.stage.end - st.stage.start}"
                )
    for i, (epochs, _) in source_epochs(split, seq).items():
        prefix = plan.sources[i].prefix
        if epochs > limit:
            out.append(f"{prefix}: repeated {epochs:.2f} epochs over the schedule (more than {limit:g})")
        elif epochs > 1:
            out.append(f"{prefix}: exhausted: its train split is read {epochs:.2f} times over the schedule")
    return out


def source_epochs(split: SplitPlan, seq_length: int) -> dict[int, tuple[float, int]]:
    """Per source of a staged split: (epochs its draws read, stream segments built)."""
    by_source: dict[int, list[Component]] = {}
    for c in split.components:
        by_source.setdefault(c.source, []).append(c)
    out = {}
    for i in sorted(by_source):
        parts = by_source[i]
        drawn = sum(c.drawn for c in parts)
        tpe = parts[0].indices.tokens_per_epoch
        built = sum(c.indices.num_epochs for c in parts)
        out[i] = ((drawn * seq_length + 1) / tpe if drawn else 0.0, built)
    return out


def epochs_drawn(c: Component, seq_length: int) -> float:
    """How many times the drawn samples read the split's tokens (each sample advances seq_length)."""
    tpe = c.indices.tokens_per_epoch
    return (c.drawn * seq_length + 1) / tpe if c.drawn else 0.0


# -- mix.json and the cache --------------------------------------------------------------------------
def plan_to_json(plan: MixPlan) -> dict:
    config = plan.config
    seq = config.seq_length
    splits = {}
    files: dict[str, dict[str, str]] = {}
    for name, split in plan.splits.items():
        files[name] = cache_names(plan.hash, split.name, len(split.components))
        comps = []
        for c in split.components:
            src = plan.sources[c.source]
            comps.append(
                {
                    "source": c.source,
                    "segment": c.segment,
                    "prefix": src.path,
                    "weight": c.weight,
                    "normalized_weight": c.normalized_weight,
                    "sequence_range": list(c.split_range),
                    "tokens_per_epoch": c.indices.tokens_per_epoch,
                    "target_samples": c.target_samples,
                    "built_samples": c.built_samples,
                    "index_samples": c.indices.num_samples,
                    "epochs": c.indices.num_epochs,
                    "separate_final_epoch": c.indices.separate_final_epoch,
                    "samples_drawn": c.drawn,
                    "tokens_drawn": c.drawn * seq,
                    "epochs_drawn": round(epochs_drawn(c, seq), 6),
                    "realized_share": c.drawn / split.size if split.size else 0.0,
                }
            )
        splits[name] = {
            "requested_samples": split.requested,
            "num_samples": split.size,
            "blend_weights": split.blend_weights,
            "components": comps,
        }
    sources = []
    train = plan.splits["train"]
    staged = source_epochs(train, seq) if train.stages is not None else {}
    for i, (s, name) in enumerate(zip(plan.sources, source_names(plan.sources), strict=True)):
        entry = s.describe()
        entry["name"] = name
        parts = [c for c in train.components if c.source == i]
        comp = parts[0] if parts else None
        drawn = sum(c.drawn for c in parts)
        entry["weight"] = comp.weight if comp else None
        entry["normalized_weight"] = comp.normalized_weight if comp else 0.0
        entry["samples_drawn"] = drawn
        if train.stages is None:
            entry["epochs"] = comp.indices.num_epochs if comp else 0
            entry["epochs_drawn"] = round(epochs_drawn(comp, seq), 6) if comp else 0.0
        else:
            epochs, built = staged.get(i, (0.0, 0))
            entry["epochs"], entry["epochs_drawn"] = built, round(epochs, 6)
        entry["realized_share"] = drawn / train.size if comp else 0.0
        sources.append(entry)
    out = {
        "format": FORMAT,
        "version": VERSION,
        "tool": f"llmtools {__version__}",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "megatron_semantics": MEGATRON_SEMANTICS,
        "seq_length": seq,
        "sample_tokens": seq + 1,
        "seed": config.seed,
        "split": config.split if config.blend_per_split is None else None,
        "per_split_blends": config.blend_per_split is not None,
        "surplus": config.surplus,
        "requested": {
            "num_samples": config.num_samples,
            "tokens": config.tokens,
            "valid_samples": config.valid_samples,
            "test_samples": config.test_samples,
        },
        "tokenizer": plan.tokenizer,
        "sources": sources,
        "splits": splits,
        "warnings": plan.warnings,
        "notes": plan.notes,
        "cache": {"hash": plan.hash, "files": files},
        "config": _config_json(config),
    }
    if train.stages is not None:
        out["global_batch_size"] = config.global_batch_size
        out["stages"] = [_stage_json(k, st, train.stages, seq) for k, st in enumerate(train.stages)]
    return out


def _stage_json(k: int, st: StagePlan, stages: list[StagePlan], seq: int) -> dict:
    length = st.stage.end - st.stage.start
    return {
        "index": k,
        "from": st.spec.start.to_json(),
        "until": st.spec.until.to_json(),
        "start": st.stage.start,
        "end": st.stage.end,
        "weights": list(st.spec.weights),
        "sources": list(st.sources),
        "keys": list(st.stage.keys),
        "normalized_weights": list(st.stage.weights),
        "blend_weights": list(st.stage.blend_weights),
        "offsets": [st.stage.offsets[key] for key in st.stage.keys],
        "samples_drawn": list(st.drawn),
        "tokens_drawn": [n * seq for n in st.drawn],
        "realized_share": [n / length for n in st.drawn],
        "positions_after": list(st.ends),
    }


def _config_json(config: MixConfig) -> dict:
    def blend(b: Blend | None):
        return (
            None if b is None else {"prefixes": [strip_suffix(p) for p in b.prefixes], "weights": b.weights}
        )

    return {
        "blend": blend(config.blend),
        "blend_per_split": None
        if config.blend_per_split is None
        else {k: blend(v) for k, v in config.blend_per_split.items()},
        "seq_length": config.seq_length,
        "num_samples": config.num_samples,
        "valid_samples": config.valid_samples,
        "test_samples": config.test_samples,
        "seed": config.seed,
        "split": config.split,
        "surplus": config.surplus,
        "allow_mixed_tokenizers": config.allow_mixed_tokenizers,
        "stages": None if config.stages is None else [stage.to_json() for stage in config.stages],
        "global_batch_size": config.global_batch_size,
    }


def _stages_from_json(raw, path: Path) -> list[StageSpec] | None:
    from llmtools.data.stages import StageKey

    if raw is None:
        return None
    if not isinstance(raw, list):
        raise InputError(f"{path}[config.stages]: expected a list of stages")
    out = []
    for k, item in enumerate(raw):
        at = f"{path}[config.stages[{k}]]"
        if not isinstance(item, dict) or not isinstance(item.get("weights"), list):
            raise InputError(f"{at}: expected {{'from': ..., 'until': ..., 'weights': [...]}}")
        start = StageKey.from_json(item.get("from"), f"{at}.from")
        until = StageKey.from_json(item.get("until"), f"{at}.until")
        out.append(StageSpec(start, until, tuple(item["weights"])))
    return out


def config_from_json(data: dict, path: Path) -> MixConfig:
    raw = data.get("config")
    if not isinstance(raw, dict):
        raise InputError(f"{path}[config]: missing; this mix.json cannot be rebuilt")

    def blend(b):
        return None if b is None else Blend(list(b["prefixes"]), b["weights"])

    try:
        return MixConfig(
            blend=blend(raw["blend"]),
            blend_per_split=None
            if raw["blend_per_split"] is None
            else {k: blend(v) for k, v in raw["blend_per_split"].items()},
            seq_length=raw["seq_length"],
            num_samples=raw["num_samples"],
            valid_samples=raw["valid_samples"],
            test_samples=raw["test_samples"],
            seed=raw["seed"],
            split=raw["split"],
            surplus=raw["surplus"],
            allow_mixed_tokenizers=raw.get("allow_mixed_tokenizers", False),
            stages=_stages_from_json(raw.get("stages"), path),
            global_batch_size=raw.get("global_batch_size"),
        )
    except (KeyError, TypeError) as error:
        raise InputError(f"{path}[config]: malformed ({error})") from None
    except UsageError as error:
        raise InputError(f"{path}[config]: {error}") from None


def split_arrays(split: SplitPlan) -> dict[str, np.ndarray]:
    arrays = {"dataset_index": split.dataset_index, "dataset_sample_index": split.dataset_sample_index}
    for k, c in enumerate(split.components):
        arrays[f"{k}.document_index"] = c.indices.document_index
        arrays[f"{k}.sample_index"] = c.indices.sample_index
        arrays[f"{k}.shuffle_index"] = c.indices.shuffle_index
    return arrays


def write_cache(plan: MixPlan, folder: Path, durable: bool = True, group=None) -> list[Path]:
    """Write every split's arrays as ``.npy`` files named by the hash (each atomically; with ``group``, an
    :class:`~llmtools.fsutil.AtomicGroup`, only to temporaries that it commits later); their paths."""
    written = []
    for split in plan.splits.values():
        names = cache_names(plan.hash, split.name, len(split.components))
        written += write_arrays(folder, names, split_arrays(split), durable=durable, group=group)
    return written


def save_plan(
    plan: MixPlan, output: str | os.PathLike, materialize_to: str | os.PathLike | None = None
) -> list[Path]:
    """Write the cache, then the materialized samples (``materialize_to``), then mix.json last, all as one
    step: a mix.json never names a file that is not there, and a failed run leaves none of them.
    Returns mix.json's path first."""
    output = Path(output)
    folder = output.parent if str(output.parent) else Path(".")
    with atomic_group() as group:
        written = write_cache(plan, folder, group=group)
        data = plan_to_json(plan)
        staged = {final: tmp for tmp, final in group.pending}  # the cache files, not yet renamed
        data["cache"]["digests"] = cache_digests(folder, data["cache"]["files"], staged)  # checked on open
        text = mix_text(data)
        if materialize_to is None:
            group.path(output).write_text(text, encoding="utf-8")  # last in the group: renamed last
            return [output, *written]
        from llmtools.data.dataset import BlendedGPTDataset
        from llmtools.data.materialize import materialize

        dataset = BlendedGPTDataset.from_plan(plan, "train", source=str(output))
        samples = materialize(dataset, materialize_to, mix_path=output, mix_json=text, group=group)
        return [output, *written, *samples]


def reopen_plan(mix: MixFile, with_arrays: bool = True) -> MixPlan:
    """Rebuild the plan a mix.json describes (sources reopened, indices recomputed); checks the hash."""
    config = config_from_json(mix.data, mix.path)
    plan = build_plan(config, base=mix.folder, with_arrays=with_arrays)
    if plan.hash != mix.identity:
        raise InputError(
            f"{mix.path}: its sources changed since it was written (plan hash {plan.hash} != {mix.identity}); "
            "run llm-mix again"
        )
    return plan


def explain(plan: MixPlan) -> str:
    """A human table: per split and source, requested vs realized share, epochs, tokens; then warnings."""
    seq = plan.config.seq_length
    lines = [
        f"plan {plan.hash}: seq_length {seq} (+1 token per sample), seed {plan.config.seed}, {MEGATRON_SEMANTICS}"
    ]
    for split in plan.splits.values():
        if split.stages is not None:
            lines += _explain_stages(plan, split)
            continue
        lines.append(
            f"\n[{split.name}] {split.size} samples (requested {split.requested}), {split.size * seq:,} tokens"
        )
        header = f"  {'source':<40} {'requested':>9} {'realized':>9} {'samples':>10} {'tokens':>15} {'split tokens':>14} {'epochs':>7} {'built':>5}"
        lines.append(header)
        for c in split.components:
            src = plan.sources[c.source]
            name = src.prefix if len(src.prefix) <= 40 else "…" + src.prefix[-39:]
            lines.append(
                f"  {name:<40} {c.normalized_weight:>9.4f} {c.drawn / split.size:>9.4f} {c.drawn:>10} "
                f"{c.drawn * seq:>15,} {c.indices.tokens_per_epoch:>14,} {epochs_drawn(c, seq):>7.2f} {c.indices.num_epochs:>5}"
            )
    return "\n".join(lines)


@dataclass
class StageRow:
    """One source in one stage of a schedule (or over the whole schedule), as the explain tables show it."""

    source: int
    requested: float  # share of the stage's samples asked for
    drawn: int
    epochs: float  # epochs of its split read by the end of the stage


def stage_rows(plan: MixPlan, split: SplitPlan) -> list[tuple[str, int, list[StageRow]]]:
    """Per stage of a staged split, then for the whole schedule: (title, samples, one row per source)."""
    seq = plan.config.seq_length
    gbs = plan.config.global_batch_size
    tpe = {c.source: c.indices.tokens_per_epoch for c in split.components}
    out = []
    for k, st in enumerate(split.stages):
        length = st.stage.end - st.stage.start
        steps = f", steps {st.stage.start // gbs + 1}-{-(-st.stage.end // gbs)}" if gbs else ""
        title = (
            f"stage {k}: {st.spec.start.text()} .. {st.spec.until.text()} = samples "
            f"[{st.stage.start}, {st.stage.end}){steps}, {length * seq:,} tokens"
        )
        rows = [
            StageRow(i, w, n, (end * seq + 1) / tpe[i] if end else 0.0)
            for i, w, n, end in zip(st.sources, st.stage.weights, st.drawn, st.ends, strict=True)
        ]
        out.append((title, length, rows))
    drawn: dict[int, int] = {}
    for c in split.components:
        drawn[c.source] = drawn.get(c.source, 0) + c.drawn
    requested: dict[int, float] = {}
    for st in split.stages:
        for j, w in zip(st.sources, st.stage.weights, strict=True):
            requested[j] = requested.get(j, 0.0) + w * (st.stage.end - st.stage.start)
    whole = [
        StageRow(i, requested.get(i, 0.0) / split.size, drawn[i], epochs)
        for i, (epochs, _) in source_epochs(split, seq).items()
    ]
    out.append(("whole schedule:", split.size, whole))
    return out


def _explain_stages(plan: MixPlan, split: SplitPlan) -> list[str]:
    """Per stage and source: requested and realized share, samples, tokens, epochs read by the stage's end."""
    seq = plan.config.seq_length
    names = source_names(plan.sources)
    lines = [
        f"\n[{split.name}] {split.size} samples (requested {split.requested}), {split.size * seq:,} tokens, "
        f"{len(split.stages)} stages"
    ]
    header = (
        f"    {'source':<32} {'requested':>9} {'realized':>9} {'samples':>10} {'tokens':>15} {'epochs':>7}"
    )
    for title, length, rows in stage_rows(plan, split):
        lines += [f"  {title}", header]
        for row in rows:
            name = names[row.source] if len(names[row.source]) <= 32 else "…" + names[row.source][-31:]
            lines.append(
                f"    {name:<32} {row.requested:>9.4f} {row.drawn / length:>9.4f} {row.drawn:>10} "
                f"{row.drawn * seq:>15,} {row.epochs:>7.2f}"
            )
    return lines
