"""YAML in, by one loader for every YAML file we read (train configs, model presets, a preset folder named
by ``LLMTOOLS_MODEL_PRESETS``, ``--set`` values).

YAML aliases (``*name``, and the merge key ``<<: *name`` that rests on them) are refused: an alias is a
reference, so a file of a few hundred bytes can name a tree of a billion leaves that the parser builds
and every check then walks. None of our files needs one, and refusing them bounds what a file builds by
its size. Nesting deeper than :data:`MAX_DEPTH` is refused too (the parser recurses per level). Every
failure is an :class:`InputError` naming the file and line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.events import AliasEvent, CollectionStartEvent

from llmtools.errors import InputError

MAX_DEPTH = 200
"""Levels of nesting a YAML file may have (ours use three)."""


class Refused(InputError):
    """An alias or nesting beyond :data:`MAX_DEPTH`: valid YAML that we do not build."""


class _Refused(ComposerError):
    pass


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses aliases and deep nesting before building a node."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            raise _Refused(
                None, None, f"a YAML alias (*{event.anchor}) is not accepted: write the value out",
                event.start_mark,
            )  # fmt: skip
        if not isinstance(event, CollectionStartEvent):
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(None, None, f"nested too deeply (more than {MAX_DEPTH} levels)", event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def loads(text: str, where: str) -> Any:
    """The value of the YAML document ``text``; :class:`InputError` ``where[:LINE]: not valid YAML (...)``
    for bad syntax, an alias, or nesting beyond :data:`MAX_DEPTH`."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader, bounded
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        if isinstance(error, _Refused) and error.problem.startswith("nested"):
            at = f", line {mark.line + 1}" if mark is not None else ""
            raise Refused(f"{where}: YAML {error.problem[:-1]}{at})") from None
        if isinstance(error, _Refused):
            raise Refused(f"{where}{line}: {error.problem}") from None
        problem = getattr(error, "problem", None) or error
        raise InputError(f"{where}{line}: not valid YAML ({problem})") from None
    except RecursionError:  # the scanner's own recursion, before a node is composed
        raise Refused(f"{where}: YAML nested too deeply") from None


def read(path, what: str = "YAML file") -> Any:
    """:func:`loads` of the file at ``path`` (UTF-8); a file that cannot be read is an InputError too."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such {what}") from None
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or error
        raise InputError(f"{path}: cannot read this {what} ({reason})") from None
    return loads(text, str(path))


__all__ = ["MAX_DEPTH", "Refused", "loads", "read"]
