"""A resume that cannot go on changes nothing: a matrix of layout changes (world size, sequence degree,
tensor degree, ZeRO stage) x ``--rollback`` through the real ``llm-train``. Each is refused before any
work, in one line naming the layout that resumes it, never advising ``--force`` (which deletes the run),
and the run folder is byte for byte what it was (every file's hash before and after). A resume with
nothing left to train says so first and writes nothing either, even where loading would reshard."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.folder_snapshot import changes, snapshot
from tests.train.parallel_runs import ROOT, ds_config, torchrun_train
from tests.train.test_cli import llm_train, write_config

STEPS = 4


def _config(folder: Path, mix: str, *, sequence: int = 1, tensor: int = 1, steps: int = STEPS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return write_config(
        folder,
        mix,
        parallel={"sequence": sequence, "tensor": tensor},
        training={"train_steps": steps, "micro_batch_size": 2, "global_batch_size": 8},
        schedule={"warmup_steps": 1, "total_steps": 20},
        checkpoint={"save_every": 2},
        eval={"every": 0},
    )


# The runs resumed below: (world size, ZeRO stage, sequence degree, tensor degree), checkpoints at 2 and 4.
SOURCES = {"sp": (2, 2, 2, 1), "tp": (2, 1, 1, 2), "one": (1, 2, 1, 1)}


@pytest.fixture(scope="module")
def runs(byte_data, tmp_path_factory):
    cli_env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cli_env.pop("LLMTOOLS_DEBUG", None)
    folder = tmp_path_factory.mktemp("sources")
    made = {}
    for name, (world, stage, sequence, tensor) in SOURCES.items():
        config = _config(folder / f"c-{name}", byte_data["mix"], sequence=sequence, tensor=tensor)
        run = folder / name
        if world == 1:
            out = llm_train([config, "--deepspeed", ds_config(stage), "-o", run], cli_env)
            assert out.returncode == 0, out.stderr[-3000:]
        else:
            torchrun_train(config, stage, run, cli_env, nproc=world)
        made[name] = run
    return made


# (source, world size, ZeRO stage, sequence, tensor, extra flags, words of the refusal)
LAYOUTS = [
    ("sp", 1, 2, 1, 1, (), "resume it with ZeRO-2 on 2 rank(s)"),
    ("sp", 4, 2, 2, 1, (), "resume it with ZeRO-2 on 2 rank(s)"),
    ("sp", 4, 2, 1, 1, (), "a sequence-parallel checkpoint (parallel.sequence 2)"),
    ("sp", 2, 1, 2, 1, ("--reshard",), "a sequence-parallel checkpoint (parallel.sequence 2)"),
    ("tp", 1, 1, 1, 1, (), "[parallel.tensor]: checkpoint has 2, the config has 1"),
    ("tp", 4, 1, 1, 2, (), "resume it with ZeRO-1 on 2 rank(s) with parallel.tensor 2"),
    ("tp", 2, 2, 1, 2, ("--reshard",), "a tensor-parallel checkpoint (parallel.tensor 2)"),
    ("one", 2, 2, 2, 1, (), "or on 2 rank(s) with parallel.sequence 1"),
    ("one", 1, 3, 1, 1, (), "--reshard converts between ZeRO-1 and ZeRO-2 only"),
    ("one", 1, 1, 1, 1, (), "pass --reshard"),
    ("one", 2, 2, 1, 2, (), "[parallel.tensor]: checkpoint has 1, the config has 2"),
]


@pytest.mark.parametrize("rollback", [False, True], ids=["auto", "rollback"])
@pytest.mark.parametrize(
    "source, world, stage, sequence, tensor, flags, words",
    LAYOUTS,
    ids=[f"{s}-to-w{w}z{z}sp{q}tp{t}" for s, w, z, q, t, *_ in LAYOUTS],
)
def test_a_refused_resume_changes_nothing_and_never_advises_force(
    runs, byte_data, tmp_path, cli_env, source, world, stage, sequence, tensor, flags, words, rollback
):
    run = tmp_path / "run"
    shutil.copytree(runs[source], run)
    config = _config(tmp_path / "c", byte_data["mix"], sequence=sequence, tensor=tensor, steps=8)
    before = snapshot(run)
    resume = ["--resume", "2", "--rollback"] if rollback else ["--resume", "auto"]
    # rank 0 of the new world: every refusal here comes before the ranks meet
    env = {**cli_env, "WORLD_SIZE": str(world), "RANK": "0", "LOCAL_RANK": "0"}
    out = llm_train([config, "--deepspeed", ds_config(stage), "-o", run, *resume, *flags], env)
    assert out.returncode == 2, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llm-train: error: "), out.stderr[-3000:]
    assert words in lines[0], lines[0]
    assert "--force" not in out.stderr and "damaged" not in out.stderr, lines[0]
    assert changes(before, snapshot(run)) == []


@pytest.mark.parametrize("how", ["same", "other-world"])
def test_a_resume_with_nothing_to_train_says_so_first_and_writes_nothing(runs, byte_data, tmp_path, cli_env, how):
    """The finished one-rank run resumed as it was, and on two ranks (which would reshard it): exit 0,
    ``nothing to train`` naming the step, no resharding, no config.N.yaml, no event, no change at all."""
    run = tmp_path / "run"
    shutil.copytree(runs["one"], run)
    config = _config(tmp_path / "c", byte_data["mix"])
    before = snapshot(run)
    if how == "same":
        out = llm_train([config, "--deepspeed", ds_config(2), "-o", run, "--resume", "auto"], cli_env)
        assert out.returncode == 0, out.stderr[-3000:]
    else:
        out = torchrun_train(config, 2, run, cli_env, "--resume", "auto", nproc=2)
    assert "nothing to train" in out.stderr and f"step_{STEPS:08d}" in out.stderr, out.stderr[-3000:]
    assert "resharding" not in out.stderr
    assert changes(before, snapshot(run)) == []
