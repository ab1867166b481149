"""The one decision on what a command may write, and what ``--force`` may replace.

Every command that writes calls :func:`claim` with its outputs and its inputs before doing any work::

    claim([prefix + ".bin", prefix + ".idx", prefix + ".json"], inputs=input_files, force=force)

It refuses (:class:`~llmtools.errors.UsageError`, exit 2, nothing touched, the message naming the path and
why) an output that

* is an input, contains an input, or lies inside an input folder (whatever ``--force`` says);
* exists and is not an earlier output of ours, even with ``--force`` (a file without our mark, a
  non-empty folder we did not write: :func:`llmtools.formats.output_marks.not_ours`);
* is an output of ours of another kind than the command writes (``kinds``), or a training run, a part of
  one or one of its checkpoints, which only ``llm-train`` replaces (even with ``--force``);
* exists, without ``--force``;
* with ``--force``, would take an input with it: the leftovers of a killed run (``OUTPUT.tmp-*``) go too.

An empty folder may be written into without ``--force``: it holds nothing to lose.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable
from pathlib import Path

from llmtools.errors import UsageError
from llmtools.formats.output_marks import RUN_CHECKPOINT_KIND, RUN_ENTRY_KIND, RUN_KIND, kind_of, not_ours
from llmtools.fsutil import TMP_MARK

PathLike = str | os.PathLike


def _real(path: PathLike) -> Path:
    return Path(os.path.realpath(os.path.abspath(path)))


def _within(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def overlap(output: PathLike, inputs: Iterable[PathLike], adds: bool = False) -> str | None:
    """Why ``output`` may not be written given ``inputs`` (None when they are apart). An output that is
    only added to (``adds``) may contain inputs: nothing of theirs is replaced."""
    out = _real(output)
    for given in inputs:
        if str(given) in ("", "-"):
            continue
        source = _real(given)
        if out == source:
            return f"it is the input {given}"
        if _within(source, out) and not adds:
            return f"it contains the input {given}"
        if _within(out, source):
            return f"it lies inside the input {given}"
    return None


def _leftover(output: PathLike, inputs: Iterable[PathLike]) -> str | None:
    """The input named like a temporary a killed run writing ``output`` left (``OUTPUT.tmp-*``, which
    --force removes with the output), or that lies inside one; None when there is none."""
    out = _real(output)
    for given in inputs:
        if str(given) in ("", "-"):
            continue
        source = _real(given)
        for path in (source, *source.parents):
            if path.parent == out.parent and path.name.startswith(out.name + TMP_MARK):
                return str(given)
    return None


def claim(
    outputs: Iterable[PathLike],
    inputs: Iterable[PathLike] = (),
    force: bool = False,
    adds: bool = False,
    kinds: Collection[str] | None = None,
) -> None:
    """Refuse (UsageError naming the path and why) any output this command may not write; see the module.

    ``adds``: the command adds to an existing output and replaces only files of its own in it
    (``llm-log tb``'s log folder): only the overlap with the inputs is checked. ``kinds``: the kinds of
    output (:func:`llmtools.formats.output_marks.kind_of`) this command writes; an earlier output of ours of
    another kind is not replaced. A training run, its entries and its checkpoints are replaced only by a
    command that names their kinds (``llm-train``), whatever ``kinds`` a command omits.
    """
    inputs = [p for p in inputs if p is not None]
    for output in outputs:
        output = Path(output)
        why = overlap(output, inputs, adds)
        if why:
            raise UsageError(f"{output}: refusing to write there: {why} (pick another output)")
        leftover = _leftover(output, inputs) if force else None
        if leftover:
            raise UsageError(
                f"{output}: refusing --force: it would remove the input {leftover}, named like a killed "
                f"run's leftover ({output.name}{TMP_MARK}*) (pick another output)"
            )
        if (
            adds
            or not os.path.lexists(output)
            or (output.is_dir() and not output.is_symlink() and _empty(output))
        ):
            continue
        why = not_ours(output)
        if not why:
            _same_kind(output, kinds or ())
        if why:
            raise UsageError(
                f"{output}: already exists and is {why}; --force replaces only earlier llmtools outputs: "
                "remove it yourself or pick another output"
            )
        if not force:
            raise UsageError(f"{output}: already exists (use --force to overwrite)")


_RUN_PARTS = {
    RUN_KIND: "a training run folder",
    RUN_ENTRY_KIND: "part of a training run folder",
    RUN_CHECKPOINT_KIND: "a checkpoint of a training run",
}


def _same_kind(output: Path, kinds: Collection[str]) -> None:
    """Refuse to replace an output of ours of another kind than this command writes; a run (or part of
    one) is replaced by nothing but ``llm-train``."""
    found = kind_of(output)
    if found in _RUN_PARTS and found not in kinds:
        raise UsageError(
            f"{output}: refusing to write there: it is {_RUN_PARTS[found]}, and only llm-train replaces a "
            "run (llm-train -o RUN --force); --force of other commands replaces only their own earlier "
            "outputs (pick another output)"
        )
    if kinds and found is not None and found not in kinds:
        raise UsageError(
            f"{output}: refusing --force: it is an earlier llmtools output of another kind ({found}), and "
            f"--force replaces only an earlier output of the same kind ({', '.join(sorted(kinds))}) "
            "(remove it yourself or pick another output)"
        )


def input_paths(specs: Iterable[PathLike | None]) -> list[str]:
    """The paths a command's input arguments name (globs expanded, an ``@list`` file and the paths it
    lists; ``-`` and None dropped), for :func:`claim`'s overlap check. Missing paths stay as given: the
    command reports them itself."""
    import glob

    from llmtools.formats.pathlists import LIST_MARK, expand_lists

    given = [str(spec) for spec in specs if spec is not None and str(spec) not in ("", "-")]
    listed = [spec[len(LIST_MARK) :] for spec in given if spec.startswith(LIST_MARK) and len(spec) > 1]
    found: list[str] = []
    for text in [*listed, *expand_lists(given)]:
        matches = glob.glob(text, recursive=True) if glob.has_magic(text) and not os.path.exists(text) else []
        found += matches or [text]
    return found


def _empty(folder: Path) -> bool:
    return not any(folder.iterdir())
