"""Sample plans: which sample of which source the blend yields at each position, as Megatron-LM would.

:func:`build_plan` turns a :class:`MixConfig` (prefixes, weights, sequence length, sample counts, seed,
split or per-split blends) into a :class:`BuiltMix` holding, per split, each source's GPT indices
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
hash, each written atomically); :func:`llmtools.data.mix_cache.load_split` reopens one split, rebuilding
the arrays when the cache is missing. What is asked for is :mod:`llmtools.data.mix_config`, the sources
:mod:`llmtools.data.mix_sources`, the file :mod:`llmtools.data.mix_json`, the explanations
:mod:`llmtools.data.mix_report`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from llmtools.data.blend import blend_weights, build_blending_indices, normalize_weights, samples_per_dataset
from llmtools.data.gpt_index import GPTIndices, build_gpt_indices
from llmtools.data.materialize import materialize
from llmtools.data.mix_config import DEFAULT_SEED, MEGATRON_SEMANTICS, Blend, MixConfig
from llmtools.data.mix_json import plan_to_json
from llmtools.data.mix_overlap import overlap_warnings
from llmtools.data.mix_report import epochs_drawn, explain_stages, plan_warnings
from llmtools.data.mix_sources import (
    Source,
    check_tokenizers,
    open_source,
    refuse_the_same_content,
    refuse_the_same_data_twice,
    source_names,
)
from llmtools.data.splits import DEFAULT_SPLIT, SPLITS, split_matrix, split_range
from llmtools.data.stages import Stage, StageSpec
from llmtools.data.stages import build as build_stages
from llmtools.data.streams import SourceStream, StreamSpec
from llmtools.dirfd import refuse_link
from llmtools.errors import InputError, RuntimeFailure, UsageError
from llmtools.formats.indexed import strip_suffix
from llmtools.formats.mix import cache_digests, cache_folder_name, cache_names, mix_text, write_arrays
from llmtools.fsutil import atomic_group
from llmtools.progress import Progress


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
class BuiltMix:
    config: MixConfig
    sources: list[Source]
    splits: dict[str, SplitPlan]
    tokenizer: dict | None
    notes: list[str]
    warnings: list[str]
    hash: str


def plan_hash(
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


def split_blends(config: MixConfig) -> dict[str, tuple[Blend, tuple | None]]:
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
) -> BuiltMix:
    """Open the sources, check them, and compute every index of every split (or of split ``only``)."""
    blends = split_blends(config)
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
    warnings += overlap_warnings(sources)
    plan = BuiltMix(config, sources, splits, tokenizer, notes, warnings, plan_hash(config, sources, blends))
    if with_arrays:
        warnings.extend(plan_warnings(plan))
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
    refuse_the_same_content(sources, ids, name)
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
    refuse_the_same_data_twice(sources, sorted(set(ids)), keys)
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
) -> BuiltMix:
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


def split_arrays(split: SplitPlan) -> dict[str, np.ndarray]:
    arrays = {"dataset_index": split.dataset_index, "dataset_sample_index": split.dataset_sample_index}
    for k, c in enumerate(split.components):
        arrays[f"{k}.document_index"] = c.indices.document_index
        arrays[f"{k}.sample_index"] = c.indices.sample_index
        arrays[f"{k}.shuffle_index"] = c.indices.shuffle_index
    return arrays


def write_cache(plan: BuiltMix, folder: Path, durable: bool = True, group=None) -> list[Path]:
    """Write every split's arrays as ``.npy`` files named by the hash (each atomically; with ``group``, an
    :class:`~llmtools.fsutil.AtomicGroup`, only to temporaries that it commits later); their paths."""
    written = []
    for split in plan.splits.values():
        names = cache_names(plan.hash, split.name, len(split.components))
        written += write_arrays(folder, names, split_arrays(split), durable=durable, group=group)
    return written


def save_plan(
    plan: BuiltMix, output: str | os.PathLike, materialize_to: str | os.PathLike | None = None
) -> list[Path]:
    """Write the cache, then the materialized samples (``materialize_to``), then mix.json last, all as one
    step: a mix.json never names a file that is not there, and a failed run leaves none of them.
    Returns mix.json's path first."""
    output = Path(output)
    folder = output.parent if str(output.parent) else Path(".")
    cache = cache_folder_name(output)  # the cache in one folder beside the mix.json, not scattered there
    made = not refuse_link(folder / cache).exists()  # a planted link would send the cache elsewhere
    try:
        return _save_plan(plan, output, folder, cache, materialize_to)
    except BaseException:
        if made:  # a failed run leaves no folder it made (the group removed the files in it)
            with contextlib.suppress(OSError):
                (folder / cache).rmdir()
        raise


def _save_plan(
    plan: BuiltMix, output: Path, folder: Path, cache: str, materialize_to: str | os.PathLike | None
) -> list[Path]:
    with atomic_group() as group:
        written = write_cache(plan, folder / cache, group=group)
        data = plan_to_json(plan)
        files = data["cache"]["files"]
        for split, names in files.items():
            files[split] = {key: f"{cache}/{name}" for key, name in names.items()}
        staged = {final: tmp for tmp, final in group.pending}  # the cache files, not yet renamed
        data["cache"]["digests"] = cache_digests(folder, data["cache"]["files"], staged)  # checked on open
        text = mix_text(data)
        if materialize_to is None:
            group.path(output).write_text(text, encoding="utf-8")  # last in the group: renamed last
            return [output, *written]
        from llmtools.data.dataset import BlendedGPTDataset  # here: the dataset imports the planner

        dataset = BlendedGPTDataset.from_plan(plan, "train", source=str(output))
        samples = materialize(dataset, materialize_to, mix_path=output, mix_json=text, group=group)
        return [output, *written, *samples]


def explain(plan: BuiltMix) -> str:
    """A human table: per split and source, requested vs realized share, epochs, tokens; then warnings."""
    seq = plan.config.seq_length
    lines = [
        f"plan {plan.hash}: seq_length {seq} (+1 token per sample), seed {plan.config.seed}, {MEGATRON_SEMANTICS}"
    ]
    for split in plan.splits.values():
        if split.stages is not None:
            lines += explain_stages(plan, split)
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
