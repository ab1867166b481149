"""Train configs without traps: the schedule's length follows training.train_steps unless a file sets it,
contradictions are refused in one line with both values and the fix, and an unknown key is answered with
the key it most likely means (known aliases of other trainers first, then spelling distance)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmtools.errors import InputError, UsageError
from llmtools.train.config import load_train_config
from tests.train.conftest import TINY

ROOT = Path(__file__).resolve().parents[2]
DS = str(ROOT / "configs" / "deepspeed" / "zero2.json")


def _config(folder: Path, mix: str = "mix.json", **sections) -> Path:
    raw = {
        "model": {"preset": "tiny", **TINY},
        "data": {"mix": mix},
        "training": {"micro_batch_size": 4, "global_batch_size": 8, "train_steps": 200},
        "schedule": {"warmup_steps": 20},
    }
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    path = folder / "train.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_the_schedule_follows_train_steps(tmp_path):
    config = load_train_config(_config(tmp_path), ["training.train_steps=100"])
    assert config.schedule.total_steps is None and config.total_steps(64) == 100
    shipped = load_train_config(ROOT / "configs/train/tiny.yaml", ["training.train_steps=100"])
    assert shipped.total_steps(128) == 100  # the shipped config leaves the length to train_steps


def test_a_file_with_its_full_curve_refuses_fewer_steps_without_a_word(tmp_path):
    path = _config(tmp_path, schedule={"total_steps": 200})
    with pytest.raises(UsageError) as error:
        load_train_config(path, ["training.train_steps=100"])
    message = str(error.value)
    assert "training.train_steps=100" in message and "schedule.total_steps=200" in message
    assert "--set schedule.total_steps=100" in message
    # stopping part-way on purpose, or a curve of its own: both taken
    assert (
        load_train_config(path, ["training.train_steps=100", "schedule.total_steps=200"]).total_steps(64)
        == 200
    )
    assert (
        load_train_config(path, ["training.train_steps=100", "schedule.total_steps=100"]).total_steps(64)
        == 100
    )
    # a file whose curve spans several runs (total != its own train_steps) is taken as written
    spans = _config(tmp_path, schedule={"total_steps": 400})
    assert load_train_config(spans, ["training.train_steps=300"]).total_steps(64) == 400


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["training.train_steps=10"], "schedule.warmup_steps=20 is not shorter than training.train_steps=10"),
        (
            ["training.train_steps=10", "schedule.total_steps=20"],
            "warmup_steps=20 is not shorter than schedule.total_steps=20",
        ),
        (["schedule.total_steps=150"], "training.train_steps=200 runs past schedule.total_steps=150; set"),
    ],
)
def test_contradictions_are_refused_with_both_values_and_the_fix(tmp_path, overrides, expected):
    with pytest.raises((InputError, UsageError)) as error:
        load_train_config(_config(tmp_path), overrides)
    assert expected in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    "key, meant",
    [
        ("optimizer.learning_rate", "optimizer.lr"),
        ("training.max_steps", "training.train_steps"),
        ("schedule.warmup", "schedule.warmup_steps"),
        ("training.lr", "optimizer.lr"),  # the right key in another section
        ("training.seeed", "training.seed"),  # spelling distance
    ],
)
def test_unknown_keys_suggest_what_they_most_likely_mean(tmp_path, key, meant):
    with pytest.raises(UsageError, match=f"did you mean '{meant}'"):
        load_train_config(_config(tmp_path), [f"{key}=1"])
    section, name = key.split(".")
    with pytest.raises(InputError, match=f"did you mean '{meant}'"):  # in the file as well
        load_train_config(_config(tmp_path, **{section: {name: 1}}))


def test_the_command_refuses_in_one_line_and_dry_run_shows_the_following_length(byte_data, tmp_path, cli_env):
    path = _config(tmp_path, byte_data["mix"])
    train = [sys.executable, "-m", "llmtools.cli.train", str(path), "--deepspeed", DS, "--dry-run", "--json"]
    ok = subprocess.run(
        [*train, "--set", "training.train_steps=50"], capture_output=True, text=True, env=cli_env
    )
    assert ok.returncode == 0, ok.stderr
    plan = json.loads(ok.stdout)
    assert plan["steps"] == plan["total_steps"] == 50
    bad = subprocess.run(
        [*train, "--set", "training.train_steps=5"], capture_output=True, text=True, env=cli_env
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    (line,) = bad.stderr.strip().splitlines()
    assert "schedule.warmup_steps=20 is not shorter than training.train_steps=5" in line
