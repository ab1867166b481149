"""Is a checkpoint complete, intact and safe to load? meta.json, files, checksums, pickles, tensor shapes.

A checkpoint is *complete* when its meta.json parses and says ``complete: true``; it is *verified* when,
in addition, every file DeepSpeed needs for its ZeRO stage, world size and precision (and every RNG file)
is listed (:func:`llmtools.ckpt.layout.required_files`), the files meta.json lists are exactly the files in
the folder (each inside it: no absolute path, no ``..``, no symlink out), each has the recorded size and
sha256, every ``.pt`` file names only globals of :data:`llmtools.ckpt.safeload.ALLOWED` (checked without
loading it), and the parameter shapes in DeepSpeed's model-states file equal those meta.json recorded at
save time. A checkpoint that verifies is safe to resume from, convert or inspect.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmtools.ckpt import layout
from llmtools.ckpt.meta import REQUIRED_KEYS, read_meta  # noqa: F401 - the one reader of meta.json, re-exported
from llmtools.errors import InputError
from llmtools.fsutil import inside

_CHUNK = 1 << 22


def sha256_file(path: str | Path, progress=None) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            if progress is not None:
                progress.update(len(chunk))
    return digest.hexdigest()


def list_files(folder: str | Path) -> list[str]:
    """Every file (and symlink) under ``folder`` (relative, sorted), except meta.json itself.

    Symlinked folders are listed as entries, not entered.
    """
    import os

    folder = Path(folder)
    found = []
    for root, dirs, files in os.walk(folder):
        base = Path(root)
        links = [d for d in dirs if (base / d).is_symlink()]
        dirs[:] = [d for d in dirs if d not in links]
        for name in [*files, *links]:
            relative = (base / name).relative_to(folder).as_posix()
            if relative != layout.META:
                found.append(relative)
    return sorted(found)


def file_manifest(folder: str | Path, fsync: bool = False, progress=None) -> dict[str, dict[str, Any]]:
    """meta.json's ``files``: size and sha256 of every file under ``folder`` (fsynced first if asked),
    the hashed bytes told to ``progress`` if given."""
    from llmtools.fsutil import fsync_file

    files = {}
    for name in list_files(folder):
        file = Path(folder) / name
        if fsync:
            fsync_file(file)
        files[name] = {"size": file.stat().st_size, "sha256": sha256_file(file, progress)}
    return files


@dataclass
class Report:
    """The outcome of verifying one checkpoint."""

    path: Path
    meta: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # files its kind needs that it does not hold or list
    unsafe: InputError | None = None  # a file our safe reader refuses although its checksum matches

    @property
    def complete(self) -> bool:
        """meta.json says complete and the folder holds every file its kind needs."""
        return self.meta is not None and self.meta.get("complete") is True and not self.missing

    @property
    def ok(self) -> bool:
        return self.complete and not self.problems

    def first_problem(self) -> str:
        return self.problems[0] if self.problems else ""


def param_shapes_from_model_states(path: Path, state: dict | None = None) -> dict[str, list[int]]:
    """Parameter shapes recorded by DeepSpeed in ``mp_rank_00_model_states.pt`` (lazily: no tensor is read).

    ZeRO-3 leaves empty placeholders in ``module``; the true shapes are in ``param_shapes``.
    """
    from llmtools.ckpt.torchfile import load_lazy

    state = load_lazy(path) if state is None else state
    try:
        shapes: dict[str, list[int]] = {}
        for group in state.get("param_shapes") or []:
            for name, shape in group.items():
                shapes[name] = [int(s) for s in shape]
        module = state.get("module") or {}
        for name, tensor in module.items():
            if name not in shapes and hasattr(tensor, "shape"):
                shapes[name] = list(tensor.shape)
        for name, info in (state.get("frozen_param_shapes") or {}).items():
            # LoRA: the true shapes of frozen parameters (ZeRO-3's module holds [0] for them)
            shapes[name] = [int(s) for s in info]
    except (AttributeError, TypeError, ValueError) as error:
        raise InputError(f"{path}: malformed param_shapes or module ({error})") from None
    return shapes


def verify(
    path: str | Path, checksums: bool = True, shapes: bool = True, found_in: Path | None = None
) -> Report:
    """Check a checkpoint folder. ``checksums=False`` checks sizes only (fast for listing).

    The pickles of every ``.pt`` file are checked against the allowlist in every mode (it reads only
    their small ``data.pkl``, never tensor data). ``found_in``: the checkpoints folder ``path`` was found
    in by listing it; a symlink from there to a folder elsewhere is a problem.
    """
    from llmtools.ckpt.safeload import UnsafeFileError, check_file

    path = Path(path)
    report = Report(path)
    if not path.is_dir():
        report.problems.append(f"{path}: not a folder")
        return report
    if found_in is not None and not layout.stays_inside(found_in, path):
        report.problems.append(f"{path}: a symlink out of {found_in} (to {path.resolve()}); refused")
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
    files = meta["files"]
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
    listed: dict[str, Path] = {}
    for name in sorted(files):
        try:
            listed[name] = inside(path, name, f"{meta_path}[files]")
        except InputError as error:
            report.problems.append(str(error))
    present = set(list_files(path))
    for name in sorted(present - set(files) - set(needed)):
        report.problems.append(f"{path / name}: present but not listed in meta.json (added or renamed?)")
    if report.problems:
        return report
    from llmtools.progress import Progress

    total = sum(f.stat().st_size for f in listed.values() if f.is_file()) if checksums else 0
    with Progress(total, f"sha256 {path.name}", unit="B", enabled=checksums) as bar:
        for name, file in listed.items():
            entry = files[name]
            if not file.is_file():
                report.problems.append(f"{file}: missing")
                continue
            size = file.stat().st_size
            if size != entry["size"]:
                report.problems.append(f"{file}: size {size}, meta.json says {entry['size']} (truncated?)")
                continue
            if checksums and sha256_file(file, bar) != entry["sha256"]:
                report.problems.append(f"{file}: sha256 differs from meta.json (corrupt)")
    if report.problems:
        return report
    model_states = layout.model_states_file(path)
    structures: dict[Path, Any] = {}
    for file in listed.values():
        if file.suffix == ".pt":
            try:
                structures[file] = check_file(file, crcs=checksums)  # CRC-32s: with the sha256s
            except InputError as error:
                report.problems.append(str(error))
                # The file has the size and sha256 the save recorded, yet our reader refuses it: not a
                # torn write but a file made to be refused (or to be read differently by another reader).
                if isinstance(error, UnsafeFileError) or checksums:
                    report.unsafe = error
                return report
    expected = meta.get("param_shapes")
    if not shapes or not expected or model_states not in structures:
        return report
    state = structures[model_states]
    if not isinstance(state, dict):
        report.problems.append(f"{model_states}: not a DeepSpeed model-states dict")
        return report
    try:
        found = param_shapes_from_model_states(model_states, state)
    except InputError as error:
        report.problems.append(str(error))
        return report
    for name, shape in expected.items():
        if name not in found:
            report.problems.append(f"{model_states}[{name}]: parameter missing")
        elif list(found[name]) != list(shape):
            report.problems.append(f"{model_states}[{name}]: shape {found[name]}, meta.json says {shape}")
    return report


def check_pickles(folder: str | Path) -> None:
    """Every ``.pt`` file in ``folder`` (a checkpoint without meta.json) against the allowlist; symlinks
    out of the folder refused. InputError / UnsafeFileError naming the file otherwise."""
    from llmtools.ckpt.safeload import check_file

    folder = Path(folder)
    for name in list_files(folder):
        if name.endswith(".pt"):
            check_file(inside(folder, name, str(folder)))


def check(path: str | Path, checksums: bool = True) -> dict[str, Any]:
    """Verify fully (``checksums=False``: all but the sha256s); return meta or raise InputError naming
    what is wrong (an unsafe pickle: :class:`~llmtools.ckpt.safeload.UnsafeFileError`, itself)."""
    report = verify(path, checksums=checksums)
    if report.unsafe is not None:
        raise report.unsafe
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
