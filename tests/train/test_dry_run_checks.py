"""``llm-train --dry-run`` makes every check the real run makes before compute: one list
(:data:`llmtools.train.loop.CHECKS`), and for each entry a case the real run refuses, which the dry run
refuses with the same line (exit 2) — through the real command, writing nothing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from llmtools.train.loop import CHECKS
from tests.conftest import REPO
from tests.train.conftest import TINY
from tests.train.test_cli import DS, llm_train


def write_config(folder: Path, mix: str, **sections) -> Path:
    raw = {
        "model": {"preset": "tiny", **TINY},
        "data": {"mix": mix},
        "training": {"micro_batch_size": 4, "global_batch_size": 8, "train_steps": 2},
        "logging": {"log_every": 1},
    }
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    path = folder / "train.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="module")
def finished(byte_data, tmp_path_factory):
    """A finished two-step run (its final checkpoint saved) and its config."""
    folder = tmp_path_factory.mktemp("finished")
    config = write_config(folder, byte_data["mix"])
    run_dir = folder / "run"
    env = _env()
    out = llm_train([config, "--deepspeed", DS, "-o", run_dir], env)
    assert out.returncode == 0, out.stderr
    return config, run_dir


def _env() -> dict:
    """What the cli_env fixture gives (this module's run is shared by its tests)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("LLMTOOLS_DEBUG", None)
    return env


def _fp16_on_this_cpu() -> bool:
    from llmtools.thirdparty import import_deepspeed

    import_deepspeed()
    from deepspeed.accelerator import get_accelerator

    return bool(get_accelerator().is_fp16_supported())


def _hide(env: dict, folder: Path, module: str) -> dict:
    """The library ``module`` as if not installed: import machinery finds nothing under its name."""
    hooks = folder / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(f"import sys\nsys.modules[{module!r}] = None\n")
    return {**env, "PYTHONPATH": f"{hooks}{os.pathsep}{env['PYTHONPATH']}"}


def case(name: str, finished, folder: Path, env: dict):
    """(arguments, environment, the words of the refusal) of a run the check ``name`` refuses."""
    config, run_dir = finished
    fresh = folder / "fresh"
    if name == "outputs":  # a file of someone else's where the run would write its metrics
        fresh.mkdir()
        (fresh / "metrics.jsonl").write_text("my own notes\n")
        return [config, "-o", fresh], env, f"{fresh / 'metrics.jsonl'}: already exists and is"
    if name == "plan":
        return [config, "-o", fresh, "--set", "training.train_steps=100000"], env, "the data ends before"
    if name == "trackers":
        hidden = _hide(env, folder, "wandb")
        return [config, "-o", fresh, "--set", "logging.report_to=[wandb]"], hidden, "wandb is not installed"
    if name == "fp16 device":
        if _fp16_on_this_cpu():
            pytest.skip("this CPU has fp16 arithmetic: nothing here refuses an fp16 run")
        return [config, "-o", fresh, "--set", "training.precision=fp16"], env, "has no fp16 on this machine"
    if name == "run folder":  # the run exists: a new run there needs --resume or --force
        return [config, "-o", run_dir], env, "already holds a run"
    if name == "resume policy":
        args = [config, "-o", run_dir, "--resume", "auto", "--set", "training.global_batch_size=16"]
        return args, env, "[training.global_batch_size]: checkpoint has 8, the config has 16"
    if name == "data continuation":  # the data read again from its start holds too few samples
        args = [config, "-o", run_dir, "--resume", "auto", "--reset-data", "--set", "training.train_steps=1000"]
        return args, env, "--reset-data: the data holds 6000 samples, but the 998 steps left"
    raise KeyError(f"no case for the check {name!r}: add one (every check is refused by --dry-run too)")


def listing(folder: Path) -> dict:
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("name", [name for name, _ in CHECKS])
def test_every_refusal_of_the_run_is_a_refusal_of_the_dry_run(name, finished, tmp_path):
    args, env, words = case(name, finished, tmp_path, _env())
    run_dir = Path(args[args.index("-o") + 1])
    before = listing(run_dir) if run_dir.exists() else None
    real = llm_train([*args[:1], "--deepspeed", DS, *args[1:]], env, timeout=240)
    dry = llm_train([*args[:1], "--deepspeed", DS, *args[1:], "--dry-run"], env, timeout=240)
    assert real.returncode == 2, real.stderr
    (line,) = real.stderr.strip().splitlines()
    assert words in line, line
    assert dry.returncode == 2, f"--dry-run passed a run that is refused ({line}): {dry.stdout[-300:]}"
    assert dry.stderr == real.stderr and dry.stdout == ""
    assert (listing(run_dir) if run_dir.exists() else None) == before, "a refusal wrote nothing"
    if before is None:
        shutil.rmtree(run_dir, ignore_errors=True)


def test_a_dry_run_that_passes_writes_nothing(finished, tmp_path):
    config, _ = finished
    out = llm_train([config, "--deepspeed", DS, "-o", tmp_path / "new", "--dry-run", "--json"], _env())
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "new").exists()
