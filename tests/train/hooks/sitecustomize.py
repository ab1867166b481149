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

# ``LLMTOOLS_TEST_INJECT=KIND@N``: a fault at the N-th optimizer step of the process, to provoke a stop
# cheaply: ``nan`` (the step's first micro-batch loss is inf: a NaN stop the data causes), ``update`` (the
# step's update/parameter ratio x 100: an update spike) or ``error`` (the step raises).
_inject = os.environ.get("LLMTOOLS_TEST_INJECT")
if _inject:
    import functools

    from llmtools.train import trainer as _trainer
    from llmtools.train.norms import NormMonitor as _Norms
    from llmtools.train.tasks import pretrain as _pretrain

    _kind, _step = _inject.split("@")
    _step = int(_step)
    _steps = [0]  # steps begun
    _begin = _trainer._Trainer.train_step

    @functools.wraps(_begin)
    def _counted(self, *args, **kwargs):
        _steps[0] += 1
        if _kind == "error" and _steps[0] == _step:
            raise RuntimeError(f"injected failure at step {_step}")
        return _begin(self, *args, **kwargs)

    _trainer._Trainer.train_step = _counted
    _loss = _pretrain.Inputs.loss
    _hit = [False]

    def _micro_loss(self, logits):
        loss = _loss(self, logits)
        if _kind == "nan" and _steps[0] == _step and not _hit[0]:
            _hit[0] = True
            return loss * float("inf")
        return loss

    _pretrain.Inputs.loss = _micro_loss
    _finish = _Norms.finish

    def _norms(self, device):
        out = _finish(self, device)
        if _kind == "update" and _steps[0] == _step and out is not None:
            out = {**out, "update_ratio": out["update_ratio"] * 100}
        return out

    _Norms.finish = _norms

# ``LLMTOOLS_TEST_SLOW_RANK=R``: rank R reads its config 20 s late (a rank slower than the others to reach
# a refusal they all make), so the launcher stops it while the others have already ended.
_slow = os.environ.get("LLMTOOLS_TEST_SLOW_RANK")
if _slow and os.environ.get("RANK") == _slow:
    import time

    from llmtools.train import config as _config

    _load = _config.load_train_config

    def _late(*args, **kwargs):
        time.sleep(20)
        return _load(*args, **kwargs)

    _config.load_train_config = _late
