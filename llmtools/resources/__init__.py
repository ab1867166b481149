"""Files the commands read at run time, shipped inside the package: model presets (``models``), train
configs (``train``), DeepSpeed configs (``deepspeed``) and the JSON Schemas of every file format
(``schemas``).

They live once, in the repository's ``configs/models``, ``configs/train``, ``configs/deepspeed`` and
``schemas`` folders; ``llmtools/resources/<kind>`` are links to them, which a build follows (package data in
pyproject.toml): a wheel carries the files, an editable install reads them in place. ``LLMTOOLS_MODEL_PRESETS``
points the model presets at another folder.

One rule for every option that takes a name or a path (:func:`locate`): a path has a ``/`` or ends in one
of its kind's extensions (``my.yaml``, ``./tiny``, ``configs/train/tiny.yaml``); anything else is the name
of a shipped file (``tiny``, ``zero2``). A file in the current folder never takes a shipped name's place;
when one of that name is there, one line on stderr says which was read and how to name the other.
"""

from __future__ import annotations

import difflib
import os
import sys
from importlib import resources
from pathlib import Path, PurePath

from llmtools.errors import InputError

KINDS = ("models", "train", "deepspeed", "schemas")
# What a path of each kind ends in; without a "/" and without one of these, a value is a shipped name.
EXTENSIONS = {
    "models": (".yaml", ".yml", ".json"),
    "train": (".yaml", ".yml"),
    "deepspeed": (".json",),
    "schemas": (".json",),
}
WHAT = {
    "models": "model preset",
    "train": "train config",
    "deepspeed": "DeepSpeed config",
    "schemas": "schema",
}
_announced: set[tuple[str, str]] = set()


def resource_dir(kind: str) -> Path:
    """The folder holding one kind of shipped file (a real folder: wheels install unzipped)."""
    if kind not in KINDS:
        raise ValueError(f"unknown resource kind {kind!r} (one of {', '.join(KINDS)})")
    if kind == "models" and os.environ.get("LLMTOOLS_MODEL_PRESETS"):
        return Path(os.environ["LLMTOOLS_MODEL_PRESETS"])
    return Path(str(resources.files("llmtools.resources") / kind))


def names(kind: str, suffix: str | None = None) -> list[str]:
    """The shipped files of one kind, by name without the suffix."""
    suffixes = (suffix,) if suffix else EXTENSIONS[kind]
    return sorted({p.stem for s in suffixes for p in resource_dir(kind).glob(f"*{s}") if p.is_file()})


def is_path(given: str | os.PathLike, kind: str) -> bool:
    """Whether ``given`` is a path (a ``/``, or one of the kind's extensions) rather than a shipped name.

    A :class:`~pathlib.PurePath` is a path whatever it looks like: it is what :func:`locate` returns (``./tiny``
    becomes ``Path("tiny")``, which must not turn back into a name) and what a program means by passing one."""
    if isinstance(given, PurePath):
        return True
    text = os.fspath(given)
    return "/" in text or os.sep in text or text in (".", "..") or text.lower().endswith(EXTENSIONS[kind])


def shipped(kind: str, name: str) -> Path | None:
    """The shipped file of this name, or None."""
    for extension in EXTENSIONS[kind]:
        candidate = resource_dir(kind) / f"{name}{extension}"
        if candidate.is_file():
            return candidate
    return None


def locate(kind: str, given: str | os.PathLike) -> Path:
    """The file ``given`` means: itself when it is a path (it must exist), else the shipped file of that name.

    A bare name that is not shipped is refused with the shipped names (and, when a file of that name is here,
    how to name it as a path); a path that does not exist is refused, naming the shipped file it may mean.
    """
    text = os.fspath(given)
    what = WHAT[kind]
    if is_path(given, kind):
        path = Path(text)
        if not path.exists():
            stem = path.name
            for extension in EXTENSIONS[kind]:
                stem = stem.removesuffix(extension)
            hint = f" (the shipped one is named {stem}, without a path or extension)" if (
                "/" not in text and shipped(kind, stem) is not None
            ) else ""
            raise InputError(f"{text}: no such {what}{hint}")
        return path
    found = shipped(kind, text)
    here = Path(text)
    if found is None:
        choices = names(kind)
        close = difflib.get_close_matches(text, choices, n=1)
        suggestion = f"did you mean {close[0]!r}? " if close else ""
        local = f"; for the {'folder' if here.is_dir() else 'file'} here, write ./{text}" if here.exists() else ""
        raise InputError(
            f"{text!r} is neither a path nor a shipped {what} ({suggestion}shipped: {', '.join(choices)}; a path "
            f"has a '/' or ends in {'/'.join(EXTENSIONS[kind])}{local})"
        )
    if here.exists():
        announce_shadow(kind, text, here.is_dir())
    return found


def shown(kind: str, given: str | os.PathLike, located: Path) -> str:
    """How messages name what :func:`locate` found: a path as the user wrote it (``./tiny`` stays ``./tiny``,
    which a Path would shorten to the name ``tiny``), a shipped file by its place in the package."""
    return os.fspath(given) if is_path(given, kind) else str(located)


def announce_shadow(kind: str, name: str, folder: bool = False, what: str | None = None) -> None:
    """One stderr line, once per process (rank 0): a bare ``name`` read as the shipped (or built-in: ``what``
    says which, e.g. "built-in chat template") one while a file or folder of that name is in the current
    folder."""
    what = what or f"shipped {WHAT[kind]}"
    if (kind, name) in _announced or os.environ.get("RANK", "0") != "0":
        return
    _announced.add((kind, name))
    print(
        f"note: {name}: read the {what}, not the {'folder' if folder else 'file'} of that name here "
        f"(write ./{name} for it)",
        file=sys.stderr,
        flush=True,
    )
