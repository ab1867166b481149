"""Pickle and archive bombs in a checkpoint (meta.json re-signed) cost the reading command no more time and
memory than a normal checkpoint: each is refused (exit 2 naming the file) within a time bound, with a peak
resident set close to that of reading the untouched checkpoint (measured by ``wait4`` on the child)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.trust.bombs import ITEMS, compressed_pickle, with_item
from tests.trust.conftest import error_line, rehash
from tests.trust.zipcraft import records_of, write

STEP4 = "checkpoints/step_00000004"
MODEL = f"{STEP4}/mp_rank_00_model_states.pt"
TIME_BOUND = 120  # seconds: the refusals take about as long as reading a good checkpoint (a few seconds)
RSS_MARGIN = 200 << 20  # bytes over the good checkpoint's peak: far below any bomb's cost (>= 1 GiB)
ZIP_BOMB = 1 << 30
ADDRESS_CAP = (
    12 << 30
)  # torch maps ~3 GiB of address space at import; bombs ask for 16 GiB or more  # declared (and real, once inflated) size of the compressed data.pkl


def _cap_memory() -> None:
    """In the child: an address-space cap, so that a bomb that gets through fails there instead of
    taking the machine's memory (the RSS assertion is the test; this only protects the host)."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_CAP, ADDRESS_CAP))


def _run_measured(args, env):
    """``llm-ckpt ARGS`` in a fresh interpreter that reports its own peak RSS on its last stderr line."""
    code = (
        "import resource, runpy, sys\n"
        "sys.argv = ['llm-ckpt', *sys.argv[1:]]\n"
        "try:\n"
        "    runpy.run_module('llmtools.cli.ckpt', run_name='__main__')\n"
        "finally:\n"
        "    sys.stderr.write('\\nPEAK_RSS %d\\n' % (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))\n"
    )
    start = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, *map(str, args)],
            capture_output=True, text=True, env=env, cwd=REPO, timeout=TIME_BOUND, preexec_fn=_cap_memory,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"llm-ckpt {args[0]} still running after {TIME_BOUND} s")
    elapsed = time.monotonic() - start
    assert "PEAK_RSS " in proc.stderr, proc.stderr[-2000:]
    peak = int(proc.stderr.rsplit("PEAK_RSS ", 1)[1].split()[0])
    proc.stderr = proc.stderr.rsplit("\nPEAK_RSS", 1)[0]
    return proc, elapsed, peak


@functools.cache
def _zip_bomb(data: bytes) -> tuple[bytes, int, int]:
    return compressed_pickle(data, ZIP_BOMB)


def _plant(run, kind: str) -> None:
    file = run / MODEL
    records = records_of(file)
    pkl = next(name for name, _ in records if name.endswith("/data.pkl"))
    if kind == "compressed":
        write(file, records, raw={pkl: _zip_bomb(dict(records)[pkl])})
    else:
        write(file, [(name, with_item(data, kind) if name == pkl else data) for name, data in records])
    rehash(run / STEP4)


@pytest.fixture(scope="module")
def baseline_peak(run_master, tmp_path_factory):
    env = dict(os.environ)
    peaks = {}
    for command in ("inspect", "verify"):
        proc, _elapsed, peak = _run_measured([command, run_master / STEP4], env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        peaks[command] = peak
    return peaks


@pytest.mark.parametrize("kind", [*ITEMS, "compressed"])
@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_bombs_are_refused_within_bounds(run, env, baseline_peak, kind, command):
    _plant(run, kind)
    proc, elapsed, peak = _run_measured([command, run / STEP4], env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert str(run / MODEL) in error_line(proc)
    assert elapsed < TIME_BOUND
    assert peak < baseline_peak[command] + RSS_MARGIN, (peak, baseline_peak[command])


def _console_verify(step, env):
    """The installed ``llm-ckpt verify STEP``: (process, seconds)."""
    start = time.monotonic()
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "llm-ckpt"), "verify", str(step)],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=TIME_BOUND, preexec_fn=_cap_memory,
    )  # fmt: skip
    return proc, time.monotonic() - start


def test_keys_that_hash_alike_are_refused_before_unpickling(run, env):
    """60,000 integer keys that all hash alike (0.8 MB): unpickling them is quadratic, minutes inside one
    C call that holds the GIL, deaf to SIGTERM. The installed command refuses them in about the time it
    takes to verify the good checkpoint."""
    good, baseline = _console_verify(run / STEP4, env)
    assert good.returncode == 0, good.stderr[-2000:]
    _plant(run, "collisions")
    proc, elapsed = _console_verify(run / STEP4, env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = error_line(proc)
    assert str(run / MODEL) in line and "dict key" in line, line
    assert elapsed < baseline + 20, (elapsed, baseline)
