"""A finished process ends, whatever threads the libraries it used left running.

``exit_without_native_teardown`` (how llm-train and every distributed worker end) tells thread pools to
stop as the interpreter would, joins what is left and runs the atexit handlers, all within a bound: an
idle ``ThreadPoolExecutor`` (inductor's compile pool on a cold cache), a pool busy with endless work and a
non-daemon thread that never returns. Real processes; the real ``llm-train`` with such threads started
inside it ends on success, on a signal's stop and on a health stop."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.train.conftest import TINY
from tests.train.test_exactness import llm_train, write_config

SCRIPT = """
import atexit, concurrent.futures, sys, threading, time
from llmtools.train.distributed import exit_without_native_teardown
kind = sys.argv[1]
atexit.register(lambda: print("atexit ran", flush=True))
if kind in ("idle-pool", "all"):
    pool = concurrent.futures.ThreadPoolExecutor(2)
    pool.submit(lambda: None).result()
if kind in ("busy-pool", "all"):
    busy = concurrent.futures.ThreadPoolExecutor(1)
    busy.submit(threading.Event().wait)
if kind in ("thread", "all"):
    threading.Thread(target=threading.Event().wait, name="never-returns").start()
print("work done")  # buffered: the exit flushes it
exit_without_native_teardown(7, bound_s=float(sys.argv[2]))
"""


@pytest.mark.parametrize(
    "kind, ends_by_itself",
    [("idle-pool", True), ("busy-pool", False), ("thread", False), ("all", False)],
)
def test_the_exit_ends_within_its_bound_whatever_threads_run(kind, ends_by_itself):
    bound = 3.0
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, kind, str(bound)], capture_output=True, text=True, timeout=120
    )
    took = time.monotonic() - started
    assert done.returncode == 7, done.stderr[-3000:]
    assert "work done" in done.stdout
    if ends_by_itself:
        # told to stop, an idle pool's workers return at once: no waiting, no warning, atexit ran
        assert took < bound and "atexit ran" in done.stdout and done.stderr == "", (took, done.stderr)
    else:
        assert "still waited 3 s after its end" in done.stderr and took < bound + 30, (took, done.stderr)


BOUND = 240


@pytest.mark.parametrize("ending", ["success", "signal", "health-stop"])
def test_llm_train_ends_with_a_library_pool_and_a_thread_left_running(byte_data, tmp_path, ending):
    settings = {"training": {"train_steps": 3}}
    if ending == "health-stop":  # experts' capacity cut: a routing collapse stops the first step
        settings["model"] = {"preset": "tiny-moe", **TINY, "moe_capacity_factor": 0.1}
        settings["health"] = {"moe_collapse_action": "stop"}
    config = write_config(tmp_path / "train.yaml", byte_data["mix"], settings)
    started = time.monotonic()
    done = llm_train(config, tmp_path / "run", threads=True, stop_at=2 if ending == "signal" else None,
                     timeout=BOUND)  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == {"success": 0, "signal": 143, "health-stop": 1}[ending], err[-3000:]
    assert "still waited" in err and "never-returns" in err, err[-3000:]
    assert time.monotonic() - started < BOUND


@pytest.mark.slow
def test_a_compiled_run_on_a_cold_inductor_cache_ends(byte_data, tmp_path, monkeypatch):
    """``training.compile: true`` with an empty inductor cache: inductor starts its compile pools, and the
    run, once its final checkpoint is written, still ends (exit 0) and without waiting for the bound."""
    import shutil

    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))  # cold
    config = write_config(tmp_path / "train.yaml", byte_data["mix"],
                          {"training": {"train_steps": 2, "compile": True}})  # fmt: skip
    done = llm_train(config, tmp_path / "run", timeout=900)
    err = done.stderr.decode()
    assert done.returncode == 0, err[-3000:]
    assert done.stdout.decode().strip().splitlines()[-1].endswith("step_00000002")
    assert "still waited" not in err, err[-3000:]
