"""Where a model's shape comes from: a preset shipped in the package (``configs/models/`` in the repository), a YAML/JSON file, a Hugging Face
folder or ``config.json``, or a mapping of fields, all turned into a :class:`ModelConfig`.

This module sits above both :mod:`.config` (the shape) and :mod:`.hf_config` (Hugging Face's spelling
of it), so neither needs the other's loader.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llmtools.errors import InputError
from llmtools.formats import jsonfile, yamlfile
from llmtools.model.config import ModelConfig
from llmtools.model.hf_config import from_hf_config
from llmtools.resources import locate, resource_dir, shown

# The presets ship inside the package (llmtools.resources.models); LLMTOOLS_MODEL_PRESETS overrides.
PRESET_DIR = resource_dir("models")


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def _read_mapping(path: Path, where: str | None = None) -> dict:
    where = where or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise InputError(f"{where}: cannot read ({error.strerror})") from None
    if path.suffix == ".json":
        try:
            data = jsonfile.loads(text)
        except ValueError as error:
            raise InputError(f"{where}: not valid JSON ({error})") from None
    else:
        data = yamlfile.loads(text, where)
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a mapping of model fields")
    return data


def load_model_config(
    spec: str | os.PathLike | Mapping[str, Any] | ModelConfig, *, names: bool = True
) -> ModelConfig:
    """A ModelConfig from a preset name (``tiny``, ``llama3-8b``), a YAML/JSON file, a Hugging Face
    model folder or ``config.json``, or a mapping of fields.

    A string is a path when it has a ``/`` or ends in .yaml/.yml/.json, else a preset's name (one rule for
    every name-or-path option, :func:`llmtools.resources.locate`); ``names=False`` reads it as a path
    whatever it looks like (``init_from`` names a folder, never a preset).

    YAML presets may wrap the fields in a ``model:`` key and carry a ``published:`` block (reference
    figures that tests compare against); both are unwrapped/ignored here.
    """
    if isinstance(spec, ModelConfig):
        return spec
    if isinstance(spec, Mapping):
        return _from_mapping(dict(spec), "model")
    text = os.fspath(spec)
    if names:
        try:
            path = locate("models", spec)
        except InputError as error:
            raise InputError(f"model: {error}") from None
    else:
        path = Path(text)
    where = shown("models", spec, path) if names else text  # a path as written: ./tiny stays ./tiny
    if path.is_dir():
        path = where_file = path / "config.json"
        if not path.exists():
            raise InputError(f"{path}: no config.json in this model folder")
        where = str(where_file)
    if not path.is_file():
        raise InputError(f"{text}: no such model config file or folder")
    return _from_mapping(_read_mapping(path, where), where)


def _from_mapping(data: dict, source: str) -> ModelConfig:
    if "model_type" in data or "architectures" in data:  # a Hugging Face config.json
        return from_hf_config(data, source=source)
    data.pop("published", None)
    if set(data) == {"model"} or ("model" in data and isinstance(data["model"], Mapping)):
        extra = sorted(set(data) - {"model", "published", "name", "description"})
        if extra:
            raise InputError(f"{source}: unexpected top-level key {extra[0]!r} beside 'model'")
        data = dict(data["model"])
    data.pop("name", None)
    data.pop("description", None)
    return ModelConfig.from_dict(data, source)


def preset_metadata(name: str) -> dict:
    """The ``published:`` block of a preset (reference parameter counts and their source)."""
    data = _read_mapping(PRESET_DIR / f"{name}.yaml")
    return dict(data.get("published") or {})


__all__ = ["load_model_config", "list_presets", "preset_metadata", "PRESET_DIR"]
