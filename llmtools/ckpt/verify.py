"""Is a checkpoint complete and intact? meta.json, file sizes and checksums, tensor shapes.

A checkpoint is *complete* when its meta.json parses and says ``complete: true``; it is *verified* when,
in addition, every file DeepSpeed needs for its ZeRO stage, world size and precision (and every RNG file)
is listed and present (:func:`llmtools.ckpt.layout.required_files`), every file meta.json lists has the
recorded size and sha256, and the parameter shapes in DeepSpeed's model-states file equal those meta.json
recorded at save time.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmtools.ckpt import layout
from llmtools.errors import InputError

_CHUNK = 1 << 22
REQUIRED_KEYS = ("format", "version", "step", "complete", "files", "world_size", "zero_stage", "precision")


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def list_files(folder: str | Path) -> list[str]:
    """Every file under ``folder`` (relative, sorted), except meta.json itself."""
    folder = Path(folder)
    return sorted(
        p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != layout.META
    )


def file_manifest(folder: str | Path, fsync: bool = False) -> dict[str, dict[str, Any]]:
    """meta.json's ``files``: size and sha256 of every file under ``folder`` (fsynced first if asked)."""
    from llmtools.fsutil import fsync_file

    files = {}
    for name in list_files(folder):
        file = Path(folder) / name
        if fsync:
            fsync_file(file)
        files[name] = {"size": file.stat().st_size, "sha256": sha256_file(file)}
    return files


def read_meta(path: str | Path) -> dict[str, Any]:
    """meta.json of a checkpoint folder; InputError naming the file when missing or malformed."""
    meta_path = Path(path) / layout.META
    try:
        text = meta_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(
            f"{meta_path}: missing (the save did not finish, or this is not a checkpoint)"
        ) from None
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(f"{meta_path}:{error.lineno}: not valid JSON ({error.msg})") from None
    if not isinstance(meta, dict):
        raise InputError(f"{meta_path}: expected a JSON object")
    for key in REQUIRED_KEYS:
        if key not in meta:
            raise InputError(f"{meta_path}[{key}]: missing")
    if meta["format"] != layout.META_FORMAT:
        raise InputError(f"{meta_path}[format]: {meta['format']!r}, expected {layout.META_FORMAT!r}")
    return meta


@dataclass
class Report:
    """The outcome of verifying one checkpoint."""

    path: Path
    meta: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # files its kind needs that it does not hold or list

    @property
    def complete(self) -> bool:
        """meta.json says complete and the folder holds every file its kind needs."""
        return self.meta is not None and self.meta.get("complete") is True and not self.missing

    @property
    def ok(self) -> bool:
        return self.complete and not self.problems

    def first_problem(self) -> str:
        return self.problems[0] if self.problems else ""


def param_shapes_from_model_states(path: Path) -> dict[str, list[int]]:
    """Parameter shapes recorded by DeepSpeed in ``mp_rank_00_model_states.pt`` (lazily: no tensor is read).

    ZeRO-3 leaves empty placeholders in ``module``; the true shapes are in ``param_shapes``.
    """
    from llmtools.ckpt.torchfile import load_lazy

    state = load_lazy(path)
    shapes: dict[str, list[int]] = {}
    for group in state.get("param_shapes") or []:
        for name, shape in group.items():
            shapes[name] = list(shape)
    module = state.get("module") or {}
    for name, tensor in module.items():
        if name not in shapes and hasattr(tensor, "shape"):
            shapes[name] = list(tensor.shape)
    for name, info in (state.get("frozen_param_shapes") or {}).items():
        shapes[name] = list(info)  # frozen params (LoRA's base): ZeRO-3's module holds [0] placeholders
    return shapes


def verify(path: str | Path, checksums: bool = True, shapes: bool = True) -> Report:
    """Check a checkpoint folder. ``checksums=False`` checks sizes only (fast for listing)."""
    path = Path(path)
    report = Report(path)
    if not path.is_dir():
        report.problems.append(f"{path}: not a folder")
        return report
    try:
        report.meta = read_meta(path)
    except InputError as error:
        report.problems.append(str(error))
        return report
    meta = report.meta
    meta_path = path / layout.META
    if meta.get("complete") is not True:
        report.problems.append(f"{meta_path}[complete]: not true (the save did not finish)")
        return report
    files = meta.get("files") or {}
    if not files:
        report.problems.append(f"{meta_path}[files]: empty")
    try:
        needed = layout.required_files(meta)
    except (TypeError, ValueError):
        needed = []
        report.problems.append(f"{meta_path}: zero_stage, world_size or precision is not what a save writes")
    for name in needed:
        if name not in files:
            report.missing.append(name)
            where = "missing" if not (path / name).is_file() else "not listed in meta.json"
            report.problems.append(
                f"{path / name}: {where}; a ZeRO-{meta.get('zero_stage')} {meta.get('precision')} checkpoint of "
                f"world size {meta.get('world_size')} needs it (incomplete save?)"
            )
    for name, entry in sorted(files.items()):
        file = path / name
        if not file.is_file():
            report.problems.append(f"{file}: missing")
            continue
        size = file.stat().st_size
        if size != entry.get("size"):
            report.problems.append(f"{file}: size {size}, meta.json says {entry.get('size')} (truncated?)")
            continue
        if checksums and sha256_file(file) != entry.get("sha256"):
            report.problems.append(f"{file}: sha256 differs from meta.json (corrupt)")
    if report.problems or not shapes:
        return report
    model_states = layout.model_states_file(path)
    expected = meta.get("param_shapes")
    if expected and model_states.is_file():
        try:
            found = param_shapes_from_model_states(model_states)
        except InputError as error:
            report.problems.append(str(error))
            return report
        for name, shape in expected.items():
            if name not in found:
                report.problems.append(f"{model_states}[{name}]: parameter missing")
            elif list(found[name]) != list(shape):
                report.problems.append(f"{model_states}[{name}]: shape {found[name]}, meta.json says {shape}")
    return report


def check(path: str | Path) -> dict[str, Any]:
    """Verify fully; return meta or raise InputError naming what is wrong."""
    report = verify(path)
    if not report.ok:
        more = f" (and {len(report.problems) - 1} more)" if len(report.problems) > 1 else ""
        raise InputError(report.first_problem() + more)
    return report.meta  # type: ignore[return-value]


def _model_shape(model: dict[str, Any]) -> dict[str, Any]:
    from llmtools.model.config import SHAPE_FIELDS
    from llmtools.model.presets import load_model_config

    try:  # derived fields (head_dim, num_key_value_heads) filled in, so both sides compare alike
        model = load_model_config(dict(model)).to_dict(full=True)
    except Exception:  # noqa: BLE001 - not a full model config (a test's toy model): compare as given
        model = dict(model)
    return {k: model.get(k) for k in SHAPE_FIELDS if k in model}


def check_compatible(
    meta: dict[str, Any], path: str | Path, model: dict[str, Any] | None, tokenizer: dict[str, Any] | None
) -> None:
    """Refuse a checkpoint whose model shape or tokenizer differs from the run's, naming both values."""
    where = Path(path) / layout.META
    saved_model = meta.get("model")
    if model is not None and saved_model is not None:
        ours, theirs = _model_shape(model), _model_shape(saved_model)
        differ = [key for key in ours if key in theirs and ours[key] != theirs[key]]
        if differ:
            key, rest = differ[0], differ[1:]
            also = "".join(f"; {k}: {theirs[k]!r} vs {ours[k]!r}" for k in rest)
            raise InputError(
                f"{where}[model.{key}]: checkpoint has {theirs[key]!r}, the config has {ours[key]!r}{also} "
                "(a different model shape cannot be resumed)"
            )
    saved_tok = meta.get("tokenizer")
    if tokenizer is not None and saved_tok is not None:
        for key in ("hash", "vocab_size", "eod_id"):
            if key in tokenizer and key in saved_tok and tokenizer[key] != saved_tok[key]:
                raise InputError(
                    f"{where}[tokenizer.{key}]: checkpoint has {saved_tok[key]!r}, the data has "
                    f"{tokenizer[key]!r} (a different tokenizer cannot be resumed)"
                )
