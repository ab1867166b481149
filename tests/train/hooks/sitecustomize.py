"""Stop a real ``llm-train`` at a chosen step, the way a scheduler does: SIGTERM to itself.

Loaded by Python at start-up (this folder is put first on PYTHONPATH) only by tests that set
``LLMTOOLS_TEST_STOP_AT=N``: right after the N-th optimizer step of the process returns, the process
sends itself SIGTERM; its own handler then finishes the step, saves a checkpoint and exits, as a
preempted job does. Nothing else changes.
"""

import os

_at = os.environ.get("LLMTOOLS_TEST_STOP_AT")
if _at:
    import functools
    import signal

    from llmtools.train import trainer as _loop

    _original = _loop._Trainer.train_step
    _calls = [0]

    @functools.wraps(_original)
    def _train_step(self, *args, **kwargs):
        out = _original(self, *args, **kwargs)
        _calls[0] += 1
        if _calls[0] == int(_at):
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    _loop._Trainer.train_step = _train_step
