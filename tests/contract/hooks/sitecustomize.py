"""Fault injection for the contract tests: pause a real command at a chosen point.

Loaded by Python at start-up (this folder is put first on PYTHONPATH) only by tests that set
``LLMTOOLS_TEST_PAUSE=module.path:Qualified.name[@N][<]``: the N-th call (default 1) of that function
returns normally (or, with ``<``, has not started yet), then touches ``LLMTOOLS_TEST_PAUSE_MARK`` and
sleeps, so that the test can send a signal to a command that is provably in the middle of its work (a
temporary exists, data is half written). Nothing else changes: the command is the real console script,
with its real handlers.
"""

import os

_target = os.environ.get("LLMTOOLS_TEST_PAUSE")
if _target:
    import faulthandler
    import functools
    import importlib
    import signal
    import time

    # A command that never stops is diagnosed, not just killed: the test asks for every thread's stack.
    faulthandler.register(signal.SIGUSR2, all_threads=True)

    _before = _target.endswith("<")
    _spec, _, _count = _target.rstrip("<").partition("@")
    _module_name, _, _qualname = _spec.partition(":")
    _owner = importlib.import_module(_module_name)
    *_parents, _name = _qualname.split(".")
    for _part in _parents:
        _owner = getattr(_owner, _part)
    _original = getattr(_owner, _name)
    _calls = [0]

    def _pause():
        with open(os.environ["LLMTOOLS_TEST_PAUSE_MARK"], "w") as mark:
            mark.write(str(os.getpid()))
        # The test signals us here. Short sleeps: a signal the kernel hands to another thread of ours
        # is still noticed by the main thread within one of them, as between two steps of real work.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.05)

    @functools.wraps(_original)
    def _paused(*args, **kwargs):
        _calls[0] += 1
        due = _calls[0] == int(_count or 1)
        if due and _before:
            _pause()
        result = _original(*args, **kwargs)
        if due and not _before:
            _pause()
        return result

    setattr(_owner, _name, _paused)
