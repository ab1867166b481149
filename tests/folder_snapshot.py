"""Every entry of a folder with what it holds: a file's sha256 and mode, a link's target, a folder's
presence. Two snapshots are equal when nothing under the folder was written, removed, renamed or moved."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def snapshot(folder: Path) -> dict[str, tuple]:
    entries: dict[str, tuple] = {}
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in dirs + files:
            path = Path(root) / name
            key = str(path.relative_to(folder))
            if path.is_symlink():
                entries[key] = ("link", os.readlink(path))
            elif path.is_dir():
                entries[key] = ("dir",)
            else:
                entries[key] = ("file", path.stat().st_mode, hashlib.sha256(path.read_bytes()).hexdigest())
    return entries


def changes(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    """What differs, one line per entry (empty when nothing changed)."""
    return [
        f"{key}: {before.get(key, 'absent')} -> {after.get(key, 'absent')}"
        for key in sorted(set(before) | set(after))
        if before.get(key) != after.get(key)
    ]
