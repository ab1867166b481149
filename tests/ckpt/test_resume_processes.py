"""Resume across processes: 2 ranks (exact, every ZeRO stage), world-size changes, kill -9, SIGTERM.

Process starts cost seconds each on a loaded 2-core machine, so each scenario uses as few launches as it
can: references and resumes that need no fresh process run here, in the test process (world size 1).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmtools.ckpt import layout
from llmtools.ckpt.manager import CheckpointManager
from llmtools.ckpt.verify import verify
from tests.ckpt import worker
from tests.ports import free_port

WORKER = str(Path(worker.__file__).resolve())
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update({"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"})
    env.pop("LLMTOOLS_DEBUG", None)
    return env


def _losses(path: Path) -> list[tuple[int, float]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        step, loss = line.split()
        out.append((int(step), float(loss)))
    return out


# ---------------------------------------------------------------------------------------- 2 ranks
@pytest.fixture(scope="module")
def w1_runs(tmp_path_factory, ds_world):
    """1-rank runs of ZeRO-2 and -3 (dropout off), saved at step 3: the sources for 1 -> 2."""
    root = tmp_path_factory.mktemp("w1")
    return root, {zero: worker.reference_run(zero, str(root / f"z{zero}")) for zero in (2, 3)}


@pytest.fixture(scope="module")
def w2_results(w1_runs, tmp_path_factory):
    root = tmp_path_factory.mktemp("w2")
    out = root / "results.json"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        WORKER,
        "--scenario",
        "--zero",
        "0,1,2,3",
        "--run-dir",
        str(root),
        "--from-w1",
        str(w1_runs[0]),
        "--out",
        str(out),
    ]
    done = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return root, json.loads(out.read_text())


@pytest.mark.parametrize("zero", ["0", "1", "2", "3"])
def test_two_ranks_resume_exactly(w2_results, zero):
    result = w2_results[1]["matrix"][zero]
    assert result == {"losses_equal": True, "weights_equal": True}


@pytest.mark.numerics
@pytest.mark.parametrize("zero", [2, 3])
def test_world_size_1_to_2(w1_runs, w2_results, zero):
    one_rank = w1_runs[1][zero][0]
    two_rank = w2_results[1]["reference"][str(zero)]
    resumed = w2_results[1]["from_w1"][str(zero)]
    assert sorted(int(s) for s in resumed) == [4, 5, 6]
    for step, loss in resumed.items():
        # fp32 AdamW trainings, gradients reduced in another order: last-bit (2^-24) update differences, summed over a few steps on a loss ~5: ~1e-6; 1e-5 leaves 10x
        assert loss == pytest.approx(one_rank[int(step)], abs=1e-5)
        # the same bound against the two-rank run
        assert loss == pytest.approx(two_rank[step], abs=1e-5)


@pytest.mark.numerics
@pytest.mark.parametrize("zero", [2, 3])
def test_world_size_2_to_1(w2_results, tmp_path, zero):
    root, results = w2_results
    source = root / f"w2_z{zero}" / "checkpoints" / "step_00000003"
    warnings = []
    engine = worker.build_engine(zero, seed=999, dropout=0.0)
    state = CheckpointManager(tmp_path, warn=warnings.append).load(engine, source)
    assert state["step"] == 3 and state["consumed_samples"] == 12  # the data position carries over
    assert any("RNG states not restored" in w for w in warnings)
    for step in (4, 5, 6):
        # fp32 AdamW trainings, gradients reduced in another order: last-bit (2^-24) update differences, summed over a few steps on a loss ~5: ~1e-6; 1e-5 leaves 10x
        assert worker.train_step(engine, step) == pytest.approx(
            results["reference"][str(zero)][str(step)], abs=1e-5
        )
    assert not [p for p in source.parent.iterdir() if "universal" in p.name]  # the universal copy is gone
    assert verify(source).ok  # and the source was not touched


# ---------------------------------------------------------------------------------------- kill -9
def test_kill9_at_any_point_then_resume_auto_is_bitwise_exact(tmp_path, ds_world):
    """Kill inside a save (three places), and at a random moment; --resume auto each time; then the same
    with background saves (killed while the background thread writes, and at a random moment); then finish.

    Every recorded loss equals the uninterrupted run's for its step, the final weights are bitwise equal,
    and no kill ever left a committed checkpoint folder that fails verification.
    """
    import torch

    steps = 14
    reference_losses, reference_weights = worker.reference_run(
        2, str(tmp_path / "ref"), steps=steps, save_at=-1, dropout=0.1
    )
    run = tmp_path / "run"
    run.mkdir()
    base = [
        sys.executable,
        WORKER,
        "--run-dir",
        str(run),
        "--zero",
        "2",
        "--steps",
        str(steps),
        "--save-every",
        "2",
        "--keep-last",
        "2",
        "--resume",
        "auto",
        "--dropout",
        "0.1",
    ]
    seed = random.randrange(10**6)
    rng = random.Random(seed)
    for crash in ("hash", "rename", "latest", "random", "write async", "random async"):
        crash, *mode = crash.split()
        command = [*base, "--async"] if mode else base
        if crash != "random":
            # the second save after the point a resume starts from (the first one commits, so the run moves
            # on), or the first where steps run short: a random kill before may have got far
            picked = CheckpointManager(run).resolve("auto")
            resumed = layout.parse_step(picked.name) if picked is not None else 0
            at = resumed + (4 if resumed + 4 <= steps - 2 else 2)
            assert at <= steps, f"no save left to kill in (seed {seed})"
            crash = f"{at}:{crash}"
        if crash == "random":
            before = len(_losses(run / "losses.txt"))
            proc = subprocess.Popen(
                [*command, "--step-sleep", "0.15"],
                env=_env(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            deadline = time.time() + 300
            while (
                len(_losses(run / "losses.txt")) == before and time.time() < deadline and proc.poll() is None
            ):
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 0.6))
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=60) in (-signal.SIGKILL, 0)
        else:
            done = subprocess.run(
                [*command, "--crash-at", crash], env=_env(), capture_output=True, timeout=300
            )
            assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
        ckpt_dir = run / "checkpoints"
        for _step, folder in layout.list_checkpoints(ckpt_dir):
            assert verify(folder).ok, f"after kill {crash} (seed {seed}): {verify(folder).problems}"
        picked = CheckpointManager(run).resolve("auto")
        assert picked is not None and verify(picked).ok
    final_losses, final_weights = worker.resumed_run(2, str(run), "auto", steps=steps, dropout=0.1)
    recorded = _losses(run / "losses.txt") + sorted(final_losses.items())
    assert {step for step, _ in recorded} == set(range(1, steps + 1))
    for step, loss in recorded:
        # bitwise: a restarted process repeats the killed one's steps on the same machine and kernels
        assert loss == reference_losses[step], f"step {step} (seed {seed})"
    assert all(torch.equal(final_weights[k], reference_weights[k]) for k in reference_weights)


# ---------------------------------------------------------------------------------------- SIGTERM
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sigterm_saves_exits_0_and_resume_continues_exactly(tmp_path, ds_world, mode):
    """SIGTERM: finish the step, save, exit 0; with background saves (one every step) the write in flight
    is finished and committed first, and nothing is left half-written."""
    import torch

    run = tmp_path / "run"
    run.mkdir()
    background = ["--async", "--save-every", "1"] if mode == "async" else []
    proc = subprocess.Popen(
        [
            sys.executable,
            WORKER,
            *background,
            "--run-dir",
            str(run),
            "--zero",
            "1",
            "--steps",
            "200",
            "--step-sleep",
            "0.1",
            "--dropout",
            "0.1",
        ],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while len(_losses(run / "losses.txt")) < 3 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert "stopped by SIGTERM" in err and "--resume auto" in err
    stopped_at = _losses(run / "losses.txt")[-1][0]
    assert stopped_at < 200
    saved = CheckpointManager(run).resolve("auto")
    assert saved is not None and saved.name == layout.step_name(stopped_at)
    assert not layout.leftovers(run / "checkpoints")  # the write in flight was finished, not abandoned
    steps = stopped_at + 3
    losses, weights = worker.resumed_run(1, str(run), "auto", steps=steps, dropout=0.1)
    reference_losses, reference_weights = worker.reference_run(
        1, str(tmp_path / "ref"), steps=steps, save_at=-1, dropout=0.1
    )
    for step, loss in _losses(run / "losses.txt") + sorted(losses.items()):
        assert loss == reference_losses[step], step
    assert all(torch.equal(weights[k], reference_weights[k]) for k in reference_weights)
