"""Reading a JSON object from a file with the one error model: a message naming the file."""

from __future__ import annotations

import json
import os
from pathlib import Path

from llmtools.errors import InputError


def loads(text: str | bytes):
    """``json.loads``, with input nested too deeply for the parser reported as a JSON error (the
    standard library raises RecursionError, with no place, a few thousand levels down)."""
    try:
        return json.loads(text)
    except RecursionError:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        depth = len(text) - len(text.lstrip("[{ \t"))
        raise json.JSONDecodeError(
            "nested too deeply (arrays/objects more than ~1000 levels deep)", text, min(depth, len(text))
        ) from None


def read_json_object(path: str | os.PathLike, what: str = "JSON file") -> dict:
    """Parse ``path`` as a JSON object; :class:`InputError` naming the file when it is not one."""
    path = Path(path)
    try:
        data = loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: not a valid {what} ({error})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: a {what} must be a JSON object")
    return data
