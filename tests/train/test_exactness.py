"""Stop a real ``llm-train`` at a chosen step (SIGTERM, as a scheduler does), resume it with ``--resume
auto``: every loss and the final weights are bitwise those of the uninterrupted run (same machine, same
kernels). A few cells of the matrix, each with several features on, chosen to cover the state that
decides what a run does next; benchmarks/exactness_matrix.py runs every feature on its own."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.train.conftest import TINY

HOOKS = Path(__file__).resolve().parent / "hooks"
BIN = Path(os.sys.executable).parent

# Natural spikes in a tiny run: batches of 2 samples, a high learning rate, a window of 3 and factors this
# close to 1 make steps 8, 11 and 12 of 12 skipped and quarantined (a stop at 9: one quarantine before the
# stop, two after it, decided by the gate's windows as saved).
SPIKES = {"spike_factor": 1.05, "loss_spike_factor": 1.01, "spike_window": 3, "spike_action": "skip",
          "max_skips": 1000, "update_spike_factor": 1.5}  # fmt: skip
NOISY = {"micro_batch_size": 1, "global_batch_size": 2}
CELLS = {
    # AdamW, fp32, the health gate (grad-norm, loss and update-ratio windows, skips, quarantine), async saves
    "health-quarantine-async": (
        {"health": SPIKES, "training": NOISY, "optimizer": {"lr": 1e-2}, "checkpoint": {"async": True}},
        9,
    ),  # fmt: skip
    # Muon's two groups and bf16
    "muon-bf16": ({"optimizer": {"name": "muon", "lr": 2e-2}, "training": {"precision": "bf16"}}, 5),
    # Lion, LoRA adapters, MoE router and its auxiliary loss
    "lion-lora-moe": (
        {
            "optimizer": {"name": "lion", "lr": 3e-4},
            "lora": {"r": 4},
            "model": {"preset": "tiny-moe", **TINY},
        },
        5,
    ),  # fmt: skip
}
STEPS = 12


def write_config(path: Path, mix: str, cell: dict) -> Path:
    raw = {
        "model": {"preset": "tiny", **TINY},
        "data": {"mix": mix},
        "training": {"micro_batch_size": 4, "global_batch_size": 8, "train_steps": STEPS, "seed": 1234},
        "optimizer": {"lr": 3e-3, "weight_decay": 0.1},
        "schedule": {"kind": "cosine", "warmup_steps": 2},
        "logging": {"log_every": 1},
        "checkpoint": {"save_every": 0, "save_final": True},
    }
    for section, values in cell.items():
        if isinstance(values, dict):
            raw.setdefault(section, {}).update(values)
        else:
            raw[section] = values
    steps, schedule = raw["training"].get("train_steps"), raw["schedule"]
    if steps is not None and "total_steps" not in schedule and steps <= schedule.get("warmup_steps", 0):
        # a run shorter than its warmup is refused; a few-step run that stops inside the warmup on
        # purpose names the schedule's length (the warmup's learning rates do not depend on it)
        schedule["total_steps"] = STEPS
    path.write_text(yaml.safe_dump(raw))
    return path


def llm_train(
    config: Path,
    run: Path,
    *extra: str,
    stop_at: int | None = None,
    timeout: float = 300,
    threads: bool = False,
    inject: str | None = None,
):
    env = dict(os.environ)
    env.update({"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    if stop_at is not None or threads or inject:  # tests/train/hooks/sitecustomize.py says what each does
        env["PYTHONPATH"] = f"{HOOKS}{os.pathsep}{env['PYTHONPATH']}"
    if stop_at is not None:
        env["LLMTOOLS_TEST_STOP_AT"] = str(stop_at)
    if threads:
        env["LLMTOOLS_TEST_THREADS"] = "1"
    if inject:
        env["LLMTOOLS_TEST_INJECT"] = inject
    argv = [str(BIN / "llm-train"), str(config), "--deepspeed", str(REPO / "configs/deepspeed/zero1.json")]
    return subprocess.run(
        [*argv, "-o", str(run), *extra], capture_output=True, timeout=timeout, env=env, cwd=run.parent
    )


def losses(run: Path) -> dict[int, float]:
    """The train records' loss per step (a resumed run appends to the same file)."""
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "train":
            out[record["step"]] = record["loss"]
    return out


def events(run: Path, *kinds: str) -> list[tuple[int, str]]:
    records = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    return [(r["step"], r["event"]) for r in records if r["kind"] == "event" and r["event"] in kinds]


def weights(checkpoint: Path) -> dict:
    from llmtools.ckpt.reader import CheckpointReader

    with CheckpointReader(checkpoint) as reader:
        return {name: source.load() for name, source in reader.sources().items()}


def assert_exact(full: Path, resumed: Path) -> None:
    import torch

    assert losses(resumed) == losses(full)  # bitwise: the same floats, step by step
    final = f"checkpoints/step_{STEPS:08d}"
    a, b = weights(full / final), weights(resumed / final)
    assert a.keys() == b.keys()
    different = [name for name in a if not torch.equal(a[name], b[name])]
    assert not different, f"weights differ after the resume: {different[:5]}"


def check(proc, what: str) -> None:
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{proc.stderr.decode()[-3000:]}"


def check_stopped(proc, signal_name: str = "SIGTERM") -> None:
    """A run a signal stopped before its end, its state saved: exit 128 + the signal, the resume line
    the last one on stderr."""
    import signal

    err = proc.stderr.decode()
    assert proc.returncode == 128 + signal.Signals[signal_name].value, f"({proc.returncode}):\n{err[-3000:]}"
    assert err.strip().splitlines()[-1].startswith(f"stopped by {signal_name}: saved "), err[-3000:]



@pytest.mark.parametrize("cell", sorted(CELLS))
def test_stop_and_resume_is_exact(byte_data, tmp_path, cell):
    settings, stop = CELLS[cell]
    config = write_config(tmp_path / "train.yaml", byte_data["mix"], settings)
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    check(llm_train(config, full), "the uninterrupted run")
    stopped = llm_train(config, resumed, stop_at=stop)
    check_stopped(stopped)
    assert b"stopped by SIGTERM" in stopped.stderr and max(losses(resumed)) == stop
    check(llm_train(config, resumed, "--resume", "auto"), "the resumed run")
    if "health" in settings:
        # the gate skipped updates before and after the stop: its saved windows decided the later ones
        skipped = [s for s, _ in events(full, "spike", "loss_spike")]
        assert min(skipped) < stop < max(skipped), skipped
    assert_exact(full, resumed)
