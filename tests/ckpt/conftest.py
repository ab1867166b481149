"""Fixtures for checkpoint tests: an in-process DeepSpeed engine (world size 1) and a run with checkpoints."""

from __future__ import annotations

import shutil

import pytest

from tests.ckpt import worker


@pytest.fixture(scope="session")
def ds_world():
    """torch.distributed over gloo + HashStore in this process (no port, no launcher)."""
    pytest.importorskip("deepspeed")
    worker.init_dist()
    return 1


@pytest.fixture(scope="session")
def saved_run_master(tmp_path_factory, ds_world):
    """A ZeRO-1 run with checkpoints at steps 2, 4 and 6 (read-only: copy it with ``saved_run``)."""
    from llmtools.ckpt.manager import CheckpointManager

    run = tmp_path_factory.mktemp("saved") / "run"
    engine = worker.build_engine(1)
    manager = CheckpointManager(run)
    for step in range(1, 7):
        worker.train_step(engine, step)
        if step % 2 == 0:
            manager.save(engine, step, worker.client_state(step))
    return run


@pytest.fixture
def saved_run(saved_run_master, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(saved_run_master, run)
    return run
