"""The index cache of a mix.json, for one split: read, checked, and rebuilt when it is gone.

Opening a plan's split is two steps. This module is the first: :func:`load_split` loads the split's
cached ``.npy`` arrays (sizes and checksums against ``cache.digests``), and when any is missing rebuilds
every split's arrays from the plan's sources and writes them back (:func:`restore_cache`: the same files,
the same bytes llm-mix wrote; a read-only folder keeps the rebuilt arrays in memory only). The second,
:class:`~llmtools.data.dataset.BlendedGPTDataset`, only reads what this returns.
"""

from __future__ import annotations

import numpy as np

from llmtools.data import mix as mixlib
from llmtools.data import plan_check  # called through the module: a benchmark times the open without it
from llmtools.data.mix_json import config_from_json
from llmtools.errors import InputError
from llmtools.formats.mix import MixFile, load_split_arrays, write_arrays
from llmtools.fsutil import inside


def load_split(mix: MixFile, split: str) -> dict[str, np.ndarray]:
    """One split's arrays, checked against the mix.json (rebuilt and written back when the cache is gone)."""
    plan_check.check_recorded(
        mix.data, mix.path
    )  # an edited mix.json is refused before its arrays are trusted
    arrays = load_split_arrays(mix.data, mix.path, split)
    if arrays is None:  # the cache was deleted or never copied: rebuild it, identically
        arrays = restore_cache(mix, split)
    plan_check.check_arrays(mix.data, mix.path, split, arrays)
    return arrays


def restore_cache(mix: MixFile, split: str) -> dict[str, np.ndarray]:
    """Rebuild the plan from its sources, write its cache where the mix.json names it (its cache folder, or
    beside it for a mix.json written before the folder); ``split``'s arrays."""
    plan = reopen_plan(mix)
    recorded = mix.data["cache"].get("files") or {}
    try:
        for name, built in plan.splits.items():
            names = recorded.get(name)
            if isinstance(names, dict):
                where = f"{mix.path}[cache.files.{name}]"
                for value in names.values():  # the cache folder, made again if it was deleted
                    inside(mix.folder, value, where).parent.mkdir(parents=True, exist_ok=True)
                write_arrays(mix.folder, names, mixlib.split_arrays(built))
    except (OSError, KeyError):
        pass  # a read-only folder (or names for other arrays): the rebuilt arrays in memory are just as good
    return mixlib.split_arrays(plan.splits[split])


def reopen_plan(mix: MixFile, with_arrays: bool = True) -> mixlib.BuiltMix:
    """Rebuild the plan a mix.json describes (sources reopened, indices recomputed); checks the hash."""
    config = config_from_json(mix.data, mix.path)
    plan = mixlib.build_plan(config, base=mix.folder, with_arrays=with_arrays)
    if plan.hash != mix.identity:
        raise InputError(
            f"{mix.path}: its sources changed since it was written (plan hash {plan.hash} != {mix.identity}); "
            "run llm-mix again"
        )
    return plan
