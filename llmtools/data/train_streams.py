"""What a run's config asks for, as the data ledger sees it: the train split as streams and stages.

A :class:`TrainStreams` is read from a ``mix.json`` (static or staged; :class:`~llmtools.formats.mix.
MixFile`) or from a plan built in code over ``data.prefixes``: per source its stream
(:class:`~llmtools.data.streams.StreamSpec`) and first segment's arrays, the stages of the blend, and
the plan's own dataset from its position 0. :func:`llmtools.data.reconcile.open_run_data` joins it with
a checkpoint's ledger.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from llmtools.data.dataset import BlendedGPTDataset
from llmtools.data.gpt_index import GPTIndices
from llmtools.data.mix_json import plan_to_json
from llmtools.data.stages import Stage
from llmtools.data.streams import StreamSpec, display_name
from llmtools.errors import InputError
from llmtools.formats.mix import MixFile


@dataclass
class TrainStreams:
    """A plan's train split as streams and stages (positions relative to where the plan starts)."""

    identity: str
    """The plan's hash (a mix.json's ``cache.hash``): the same identity is the same samples."""
    origin: str
    """Where it came from: the mix.json path, or the train config's prefixes."""
    seq_length: int
    tokenizer: dict | None
    vocab_size: int | None
    specs: dict[str, StreamSpec]
    readers: dict
    first: dict[str, GPTIndices]
    stages: list[Stage]
    dataset: object
    """The plan's own arrays from its position 0 (a BlendedGPTDataset): a fresh run reads them as is."""
    parts: list[tuple[str, int]]
    """(source key, stream segment) of each of ``dataset``'s parts."""
    staged: bool = False

    @property
    def size(self) -> int:
        return self.stages[-1].end

    @classmethod
    def from_mix(cls, mix: MixFile | str | os.PathLike) -> TrainStreams:
        """The train split of a ``mix.json`` (read once, or already read; its cached arrays, rebuilt when
        missing)."""
        if not isinstance(mix, MixFile):
            mix = MixFile.read(mix)
        dataset = BlendedGPTDataset.from_mix(mix, split="train")
        return cls.from_json(mix.data, dataset, str(mix.path))

    @classmethod
    def from_mix_plan(cls, plan, origin: str) -> TrainStreams:
        """The train split of an in-memory :class:`~llmtools.data.mix.BuiltMix` (prefixes in a config)."""
        dataset = BlendedGPTDataset.from_plan(plan, "train", source=origin)
        return cls.from_json(plan_to_json(plan), dataset, origin)

    @classmethod
    def from_json(cls, mix: dict, dataset, origin: str) -> TrainStreams:
        where = f"{origin}[splits.train]"
        try:
            return cls._from_json(mix, dataset, origin)
        except (KeyError, TypeError, ValueError, IndexError) as error:
            raise InputError(f"{where}: malformed ({type(error).__name__}: {error})") from None

    @classmethod
    def _from_json(cls, mix: dict, dataset, origin: str) -> TrainStreams:
        seq = int(mix["seq_length"])
        seed = int(mix["seed"])
        sources = mix["sources"]
        keys = [str(s["idx_sha256"]) for s in sources]
        taken: set[str] = set()
        names = []
        for s in sources:
            name = s.get("name") if isinstance(s.get("name"), str) and s["name"] not in taken else None
            name = name or display_name(str(s["prefix"]), taken)
            taken.add(name)
            names.append(name)
        train = mix["splits"]["train"]
        parts, specs, readers, first = [], {}, {}, {}
        for p, comp in enumerate(train["components"]):
            i, segment = int(comp["source"]), int(comp.get("segment", 0))
            key = keys[i]
            parts.append((key, segment))
            part = dataset.parts[p]
            readers[key] = part.reader
            if segment:
                continue
            beg, end = (int(v) for v in comp["sequence_range"])
            built = comp.get("built_samples")
            specs[key] = StreamSpec(
                key,
                os.path.abspath(part.reader.prefix),
                names[i],
                (beg, end),
                seq,
                seed,
                None if built is None else int(built),
                int(comp["tokens_per_epoch"]),
            )
            first[key] = GPTIndices(
                part.document_index,
                part.sample_index,
                part.shuffle_index,
                int(comp["epochs"]),
                bool(comp["separate_final_epoch"]),
                int(comp["tokens_per_epoch"]),
            )
        identity = str(mix["cache"]["hash"])
        stages = []
        if mix.get("stages"):
            for k, st in enumerate(mix["stages"]):
                stage_keys = [keys[int(i)] for i in st["sources"]]
                stages.append(
                    Stage(
                        int(st["start"]),
                        int(st["end"]),
                        stage_keys,
                        [float(v) for v in st["blend_weights"]],
                        [float(v) for v in st["normalized_weights"]],
                        dict(zip(stage_keys, (int(v) for v in st["offsets"]), strict=True)),
                        {"plan": identity, "stage": k, "path": origin},
                    )
                )
        else:
            comps = train["components"]
            stage_keys = [keys[int(c["source"])] for c in comps]
            stages.append(
                Stage(
                    0,
                    int(train["num_samples"]),
                    stage_keys,
                    [float(v) for v in train["blend_weights"]],
                    [float(c["normalized_weight"]) for c in comps],
                    dict.fromkeys(stage_keys, 0),
                    {"plan": identity, "stage": 0, "path": origin},
                )
            )
        _check_schedule(stages, len(dataset), origin)
        return cls(
            identity,
            origin,
            seq,
            dataset.tokenizer,
            dataset.vocab_size,
            specs,
            readers,
            first,
            stages,
            dataset,
            parts,
            bool(mix.get("stages")),
        )

    def keys(self) -> list[str]:
        """The plan's sources in order of first appearance in its stages."""
        out: list[str] = []
        for stage in self.stages:
            out += [k for k in stage.keys if k not in out]
        return out


def _check_schedule(stages: list[Stage], samples: int, origin: str) -> None:
    """A schedule read from a file: stages from 0, back to back, ending where the plan's samples end."""
    before = 0
    for k, stage in enumerate(stages):
        at = f"{origin}[stages[{k}]]"
        if stage.start < before:
            raise InputError(
                f"{at}: starts at sample {stage.start}, inside stage {k - 1} (until sample {before}): "
                "the stage ranges overlap"
            )
        if stage.start > before:
            what = f"stage {k - 1} ends at sample {before}" if k else "the schedule starts at sample 0"
            raise InputError(f"{at}: starts at sample {stage.start} but {what}: a gap in the stage ranges")
        if stage.end <= stage.start:
            raise InputError(f"{at}: ends at sample {stage.end}, not after its start {stage.start}")
        before = stage.end
    if before != samples:
        raise InputError(
            f"{origin}[stages]: the schedule covers samples [0, {before}), the plan holds {samples}"
        )
