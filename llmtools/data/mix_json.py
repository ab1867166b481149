"""A built plan as ``mix.json`` (:func:`plan_to_json`) and a mix.json's config back (:func:`config_from_json`).

The file's structure and its cache's names are :mod:`llmtools.formats.mix`'s; here the planner's objects
are turned into the file's fields and back. Writing the file is :func:`llmtools.data.mix.save_plan`.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import TYPE_CHECKING

from llmtools import __version__
from llmtools.data.mix_config import MEGATRON_SEMANTICS, Blend, MixConfig
from llmtools.data.mix_report import epochs_drawn, source_epochs
from llmtools.data.mix_sources import source_names
from llmtools.data.stages import StageKey, StageSpec
from llmtools.errors import InputError, UsageError
from llmtools.formats.indexed import strip_suffix
from llmtools.formats.mix import FORMAT, VERSION, cache_names

if TYPE_CHECKING:  # the planner imports this module: its types only in annotations
    from llmtools.data.mix import BuiltMix, StagePlan


def plan_to_json(plan: BuiltMix) -> dict:
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
