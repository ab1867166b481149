"""Record every path a real command writes, appends to, renames or deletes (for the planted-link tests).

Loaded by Python at start-up (this folder is put first on PYTHONPATH) only by tests that set
``LLMTOOLS_TEST_WRITES=FILE``: an audit hook appends one JSON line per event to FILE — ``open`` with a
writing mode or flag, llmtools' own ``llmtools.dirfd.open``, ``os.remove``, ``os.rename``, ``os.rmdir``,
``shutil.rmtree`` — with the absolute path. Nothing else changes.
"""

import os

_log = os.environ.get("LLMTOOLS_TEST_WRITES")
if _log:
    import json
    import sys

    _WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    _busy = []

    def _record(kind, path):
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, str):
            return
        _busy.append(1)
        try:
            with open(_log, "a", encoding="utf-8") as handle:
                handle.write(json.dumps({"kind": kind, "path": os.path.abspath(path)}) + "\n")
        finally:
            _busy.pop()

    def _hook(event, args):
        if _busy:
            return
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                mode is None and isinstance(flags, int) and flags & _WRITE_FLAGS
            )
            if writing and not (isinstance(path, int)):
                _record("open", path)
        elif event == "llmtools.dirfd.open":
            _record("open", args[0])
        elif event in ("os.remove", "os.rmdir", "shutil.rmtree"):
            _record("delete", args[0])
        elif event == "os.rename":
            _record("rename-from", args[0])
            _record("rename-to", args[1])

    sys.addaudithook(_hook)
