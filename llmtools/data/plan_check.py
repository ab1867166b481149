"""Is a mix.json still the plan it claims to be? Checked each time a run opens one, cheaply.

Three things can drift under a plan's path after llm-mix wrote it, and each would otherwise be trained on
without a word:

- the mix.json itself (weights edited by hand, a file rebuilt in place): its sources, splits and config
  must agree with each other, and its config and sources must still give the plan hash its index arrays
  were built under (:func:`check_recorded`);
- the index cache (``.npy`` files left from another plan under the names mix.json points to): sizes and
  sha256 recorded per file (:func:`llmtools.formats.mix.load_split_arrays`), and the blend's arrays must
  draw from each source what the weights say (:func:`check_arrays`);
- the sources (re-tokenized in place, a sidecar naming another tokenizer): each ``.idx``/``.bin`` against
  its fingerprint (size and mtime; a checksum only when the mtime moved), the sidecar's tokenizer against
  the one recorded (:func:`check_source`).

Every refusal is an :class:`~llmtools.errors.InputError` naming the file (and key) that differs.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from llmtools.data import mix as mixlib
from llmtools.data.blend import normalize_weights
from llmtools.data.mix_json import config_from_json
from llmtools.errors import InputError, where
from llmtools.formats.fingerprint import changed
from llmtools.formats.sidecar import read_sidecar, sidecar_path

_TOLERANCE = 1e-9


def check_recorded(mix: dict, path: Path) -> None:
    """The mix.json against itself (no file but it is read)."""
    config = config_from_json(mix, path)
    blends = mixlib.split_blends(config)
    sources = mix["sources"]
    for name, split in mix["splits"].items():
        blend = blends.get(name, (None, None))[0]
        comps = split["components"]
        if blend is None:
            raise InputError(f"{where(path, key=f'splits.{name}')}: config names no blend for this split")
        weights = blend.weights
        if name == "train" and config.stages is not None:
            weights = None  # a schedule's weights are its stages': checked through the plan hash below
        if weights is not None:
            kept = [w for w in weights if w > 0]
            have = [c.get("weight") for c in comps]
            if len(comps) > 1 or len(kept) > 1:
                for k, (want, got) in enumerate(zip(kept, have, strict=False)):
                    if got is None or abs(float(got) - want) > _TOLERANCE * max(1.0, abs(want)):
                        key = f"splits.{name}.components[{k}].weight"
                        raise InputError(
                            f"{where(path, key=key)}: {got}, but the plan was built with {want} "
                            f"(config blend weights {weights}): edited after llm-mix wrote it; run llm-mix again"
                        )
                normalized = normalize_weights(kept)
                for k, (want, comp) in enumerate(zip(normalized, comps, strict=False)):
                    got = comp.get("normalized_weight")
                    if got is None or abs(float(got) - want) > 1e-6:
                        key = f"splits.{name}.components[{k}].normalized_weight"
                        raise InputError(
                            f"{where(path, key=key)}: {got}, but weights {kept} normalise to {want:.6g}: "
                            "edited after llm-mix wrote it; run llm-mix again"
                        )
        if name == "train":
            for comp in comps:
                i = comp["source"]
                recorded = sources[i].get("weight", comp.get("weight"))
                if recorded != comp.get("weight"):
                    raise InputError(
                        f"{where(path, key=f'sources[{i}].weight')}: {recorded}, but its train component has "
                        f"weight {comp.get('weight')}: edited after llm-mix wrote it; run llm-mix again"
                    )
    stand_ins = [
        SimpleNamespace(
            prefix=s.get("prefix_as_given") or s["prefix"],
            idx_sha256=s.get("idx_sha256"),
            reader=SimpleNamespace(dtype=s.get("dtype")),
        )
        for s in sources
    ]
    try:
        identity = mixlib.plan_hash(config, stand_ins, blends, mix.get("megatron_semantics"))
    except KeyError as missing:
        raise InputError(f"{where(path, key='config')}: names a source not in sources ({missing})") from None
    if identity != mix["cache"]["hash"]:
        raise InputError(
            f"{where(path, key='cache.hash')}: {mix['cache']['hash']}, but its config and sources give plan "
            f"{identity}: mix.json was edited after llm-mix wrote it (weights, seed, lengths or sources); "
            "run llm-mix again"
        )


def check_arrays(mix: dict, path: Path, split: str, arrays: dict) -> None:
    """The split's blend arrays against mix.json: length, and what it draws from each source."""
    recorded = mix["splits"][split]
    comps = recorded["components"]
    files = (mix["cache"].get("files") or {}).get(split) or {}
    where_index = path.parent / files.get("dataset_index", f"{split} dataset_index")
    if "dataset_index" not in arrays:  # mix.json's cache.files no longer names it
        raise InputError(f"{where(path, key=f'cache.files.{split}')}: names no dataset_index array")
    index = np.asarray(arrays["dataset_index"])
    if int(index.shape[0]) != int(recorded["num_samples"]):
        raise InputError(
            f"{where_index}: {index.shape[0]} samples, mix.json says {recorded['num_samples']} "
            f"(splits.{split}.num_samples): an index array of another plan?"
        )
    if index.size and (int(index.min()) < 0 or int(index.max()) >= len(comps)):
        raise InputError(f"{where_index}: names a source outside the {len(comps)} of the {split} blend")
    counts = np.bincount(index.astype(np.int64, copy=False), minlength=len(comps))
    shares = recorded.get("blend_weights") or []
    for k, comp in enumerate(comps):
        drawn = int(counts[k])
        if comp.get("samples_drawn") is not None and drawn != int(comp["samples_drawn"]):
            raise InputError(
                f"{where_index}: draws {drawn} samples from {comp.get('prefix')}, mix.json says "
                f"{comp['samples_drawn']} (splits.{split}.components[{k}].samples_drawn): not this plan's arrays"
            )
        # Megatron's greedy blend keeps every source within one sample of its share at every position.
        if len(comps) > 1 and k < len(shares) and abs(drawn - shares[k] * index.size) > 1 + 1e-6 * index.size:
            raise InputError(
                f"{where(path, key=f'splits.{split}.blend_weights[{k}]')}: {shares[k]}, but the arrays draw "
                f"{drawn} of {index.size} samples from {comp.get('prefix')}: weights and arrays disagree; "
                "run llm-mix again"
            )


def check_source(described: dict, prefix: str, path: Path) -> None:
    """One source (opened at ``prefix``) against the fingerprints and tokenizer mix.json recorded."""
    files = described.get("files") or {}
    for kind in ("idx", "bin"):  # plain strings and os.stat: this runs once per source, for every source
        file = f"{prefix}.{kind}"
        recorded = files.get(kind)
        if isinstance(recorded, dict):
            problem = changed(file, recorded)
            if problem is not None:
                raise InputError(
                    f"{file}: changed since {path} was made ({problem}): re-tokenized or replaced in place; "
                    "run llm-mix again"
                )
    recorded_tok = described.get("tokenizer")
    if isinstance(recorded_tok, dict):
        try:
            current = (read_sidecar(prefix) or {}).get("tokenizer")
        except InputError:
            current = None
        if _tokenizer_key(current) != _tokenizer_key(recorded_tok):
            raise InputError(
                f"{sidecar_path(prefix)}: names tokenizer {_tokenizer_name(current)}, but {path} was made with "
                f"{_tokenizer_name(recorded_tok)}: the data or its sidecar changed; run llm-mix again"
            )


def _tokenizer_key(tok) -> str | None:
    if not isinstance(tok, dict):
        return None
    identity = {k: tok.get(k) for k in ("hash", "vocab_size", "eod_id") if k in tok}
    return json.dumps(identity or tok, sort_keys=True)


def _tokenizer_name(tok) -> str:
    if not isinstance(tok, dict):
        return "none (no sidecar tokenizer)"
    name = tok.get("name") or tok.get("kind") or tok.get("source") or "?"
    return f"{name!r} ({tok.get('vocab_size', '?')} ids, {tok.get('hash', 'no hash')})"
