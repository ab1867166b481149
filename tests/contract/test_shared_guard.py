"""The guard in tests/conftest.py fails a test run that changes the shared data folder (which is read-only
for tests): proven by a pytest run whose one test writes a cache file into a copy of that folder."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO

WRITES_A_CACHE = """
from tests.conftest import SHARED_DATA

def test_writes_beside_the_fixtures():
    (SHARED_DATA / "cache").mkdir()
    (SHARED_DATA / "cache" / "index.npy").write_bytes(b"x")

def test_touches_nothing():
    assert SHARED_DATA.is_dir()
"""


def test_a_run_that_writes_into_shared_data_fails(tmp_path):
    data = tmp_path / "shared-data"
    (data / "tokenizers").mkdir(parents=True)
    (data / "README.md").write_text("fixtures\n")
    probe = tmp_path / "probe"
    probe.mkdir()
    # The real guard, registered in the probe's own conftest (so nothing is written into the repo).
    (probe / "conftest.py").write_text(
        "from tests.conftest import shared_data_stays_read_only  # noqa: F401\n"
    )
    (probe / "test_probe.py").write_text(WRITES_A_CACHE)
    env = {**os.environ, "LLMTOOLS_SHARED_DATA": str(data), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(probe), str(probe)],
        cwd=probe, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode != 0, proc.stdout
    assert "tests changed the read-only shared data folder" in proc.stdout
    assert "cache/index.npy" in proc.stdout
    assert "2 passed" in proc.stdout  # the tests themselves pass: the guard is what fails the run
