"""Many inputs on one command line: ``@list`` files and globs of dataset prefixes.

A corpus at scale is thousands of files, more than a shell line holds. Every command that takes many
inputs accepts, besides plain paths and globs, ``@FILE``: a text file naming one path (or glob) per
line; blank lines and lines starting with ``#`` are skipped. Relative paths in a list are taken from
the current directory, as ``xargs`` would, so ``ls shards/*.idx > list.txt`` makes a valid list.

:func:`expand_lists` replaces each ``@FILE`` by its lines; :func:`expand_prefixes` turns prefixes,
``foo.bin`` / ``foo.idx`` / ``foo.json`` names and globs into the ``.bin/.idx`` prefixes they name.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence

from llmtools.errors import InputError

LIST_MARK = "@"
DATASET_SUFFIXES = (".bin", ".idx", ".json")


def read_list_file(path: str) -> list[str]:
    """The entries of one ``@list`` file (an :class:`InputError` when it is missing, unreadable or names
    nothing)."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise InputError(f"{path}: no such list file (given as {LIST_MARK}{path})") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a list file (given as {LIST_MARK}{path})") from None
    except UnicodeDecodeError as error:
        raise InputError(
            f"{path}: not a UTF-8 text list of paths ({error.reason} at byte {error.start})"
        ) from None
    entries = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            entries.append(line)
    if not entries:
        raise InputError(f"{path}: the list file names nothing (no path in it, only blank or # lines)")
    return entries


def expand_lists(items: Sequence[str]) -> list[str]:
    """``@FILE`` items replaced by the entries of FILE (one level: an entry is a path or a glob)."""
    out: list[str] = []
    for item in items:
        item = str(item)
        if item.startswith(LIST_MARK) and len(item) > 1:
            for entry in read_list_file(item[1:]):
                if entry.startswith(LIST_MARK):
                    raise InputError(f"{item[1:]}: {entry!r}: a list file cannot name another list file")
                out.append(entry)
        else:
            out.append(item)
    return out


def _strip(path: str) -> str:
    for suffix in DATASET_SUFFIXES:
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return path


def _is_dataset(prefix: str) -> bool:
    return os.path.isfile(prefix + ".idx") or os.path.isfile(prefix + ".bin")


def expand_prefixes(items: Sequence[str], what: str = "dataset") -> list[str]:
    """Dataset prefixes named by ``items``: prefixes, file names with a ``.bin``/``.idx``/``.json``
    suffix, globs over either (sorted), and ``@list`` files of those.

    A glob names the prefixes of the ``.idx``/``.bin`` files it matches (``shards/*`` and
    ``shards/*.idx`` name the same datasets). Adjacent names of *different files* of one dataset
    collapse (``a.bin a.idx`` is one dataset, as a shell expands ``a.*``); any other repeat (``a a``,
    ``a.bin a.bin``, ``a ./a``, a glob matching a dataset named before) is refused, as is a glob matching
    no dataset. Whether each prefix is complete and valid is for its reader to say.
    """
    out: list[str] = []
    seen: dict[str, str] = {}
    files: set[str] = set()  # which files of out[-1] adjacent items named: '' for the dataset as a whole
    for item in expand_lists(items):
        if _is_dataset(_strip(item)) or os.path.exists(item) or not glob.has_magic(item):
            found = [_strip(item)]
            file = item[len(found[0]) :]
        else:
            # ``web/*`` matches files (a.bin, a.idx, a.json); ``web/*_document`` matches prefixes only.
            matches = glob.glob(item, recursive=True) + glob.glob(item + ".idx", recursive=True)
            found = sorted({_strip(m) for m in matches if _is_dataset(_strip(m))})
            if not found:
                raise InputError(f"{item}: no {what} matches this pattern (no .bin/.idx file)")
            file = ""
        for prefix in found:
            key = os.path.realpath(prefix)
            if out and os.path.realpath(out[-1]) == key and file and not files & {"", file}:
                files.add(file)
                continue
            if key in seen:
                raise InputError(f"{prefix}: the same {what} is named twice ({seen[key]!r} and {item!r})")
            seen[key] = item
            files = {file}
            out.append(prefix)
    return out
