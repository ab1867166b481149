"""Stop a real ``llm-train`` at a chosen step, the way a scheduler does: SIGTERM to itself.

Loaded by Python at start-up (this folder is put first on PYTHONPATH) only by tests that set
``LLMTOOLS_TEST_STOP_AT=N``: right after the N-th optimizer step of the process returns, the process
sends itself SIGTERM; its own handler then finishes the step, saves a checkpoint and exits, as a
preempted job does. Nothing else changes.

``LLMTOOLS_TEST_THREADS=1``: after the first step, leave running what libraries leave running (an idle
``ThreadPoolExecutor``, as inductor's compile pool, and a non-daemon thread that never returns), to check
that the process still ends.
"""

import os

_at = os.environ.get("LLMTOOLS_TEST_STOP_AT")
_threads = os.environ.get("LLMTOOLS_TEST_THREADS")
if _at or _threads:
    import functools
    import signal

    from llmtools.train import trainer as _loop

    _original = _loop._Trainer.train_step
    _calls = [0]

    @functools.wraps(_original)
    def _train_step(self, *args, **kwargs):
        out = _original(self, *args, **kwargs)
        _calls[0] += 1
        if _threads and _calls[0] == 1:
            import concurrent.futures
            import threading

            pool = concurrent.futures.ThreadPoolExecutor(2)
            pool.submit(lambda: None).result()
            threading.Thread(target=threading.Event().wait, name="never-returns").start()
        if _at and _calls[0] == int(_at):
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    _loop._Trainer.train_step = _train_step
