"""A run's state as a table of parts (llmtools.ckpt.state): a new part round-trips through a real save and
load, and a bare client state is summarised exactly as a run's parts are."""

from __future__ import annotations

import pytest

from llmtools.ckpt.manager import CheckpointManager
from llmtools.ckpt.state import RunState, summarize
from llmtools.ckpt.verify import read_meta
from llmtools.errors import UsageError
from tests.ckpt import worker


class Counter:
    """The tiny example part: a count that must survive a resume, shown in meta.json."""

    def __init__(self) -> None:
        self.count = 0

    def state_dict(self) -> dict:
        return {"counter": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.count = int(state.get("counter", 0))

    def summary(self, client_state: dict) -> dict:
        return {"counter": client_state.get("counter")}


class Header:
    """What the trainer's progress and identity parts save, as in tests.ckpt.worker."""

    def __init__(self, step: int) -> None:
        self.entries = worker.client_state(step)

    def state_dict(self) -> dict:
        return dict(self.entries)

    def load_state_dict(self, state: dict) -> None:
        self.entries = {key: state[key] for key in self.entries}


def test_a_new_part_round_trips_through_a_real_save_and_load(tmp_path, ds_world):
    engine = worker.build_engine(1)
    worker.train_step(engine, 1)
    counter = Counter()
    counter.count = 41
    manager = CheckpointManager(tmp_path / "run")
    folder = manager.save(engine, 1, RunState({"header": Header(1), "counter": counter}))
    meta = read_meta(folder)
    assert meta["counter"] == 41
    assert meta["consumed_samples"] == worker.client_state(1)["consumed_samples"]

    restored, header = Counter(), Header(0)
    client_state = manager.load(worker.build_engine(1, seed=999), folder)
    RunState({"header": header, "counter": restored}).load_state_dict(client_state)
    assert restored.count == 41 and header.entries == worker.client_state(1)


def test_a_bare_client_state_is_summarised_as_the_parts_are():
    state = RunState({"header": Header(3)})
    assert state.summary() == summarize(worker.client_state(3))
    assert list(state.state_dict()) == list(worker.client_state(3))


def test_two_parts_never_own_the_same_entry():
    with pytest.raises(UsageError, match="is another part's"):
        RunState({"a": Header(1), "b": Header(2)}).state_dict()
