"""Shared fixtures. Real corpora and tokenizers come from ../shared/data (never copied into the repo)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("LLMTOOLS_SHARED_DATA", REPO.parent / "shared" / "data"))

# Keep CPU tests deterministic and quiet on 2 cores.
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# Tests that must not share the cores with other test workers (make test runs them in a second, serial
# invocation): the multi-host tests start several torchrun agents in network namespaces each, and the signal
# tests run their own pool of processes and time their signals. The sequence-parallel tests: a worker of
# theirs was once aborted (SIGABRT) while another test worker ran its own torchrun jobs beside them
# (a free port taken between its choice and its use is the suspect; not reproduced alone; test ports now
# come from tests/ports.py, outside the ephemeral range). DeepSpeed's AutoTP test: its torchrun worker
# aborted the same way once in its teardown ("terminate called without an active exception") while two
# other suites ran torchrun jobs beside it.
SERIAL = (
    "tests/multihost/",
    "tests/contract/test_signals.py",
    "tests/train/test_sequence_parallel.py",
    "tests/train/test_autotp.py",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(str(item.fspath)).resolve().relative_to(REPO).as_posix().startswith(SERIAL):
            item.add_marker(pytest.mark.serial)


def shared(relative: str) -> Path:
    """A path under ../shared/data, or skip the test with a clear reason when it is absent."""
    path = SHARED_DATA / relative
    if not path.exists():
        pytest.skip(f"needs {path} (the shared data folder beside the repo; always present in CI)")
    return path


@pytest.fixture
def shared_data():
    return shared


def _listing(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry under ``root``: (kind, size, mtime in ns). Cheap: one stat per file, no reading."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            try:
                stat = os.lstat(path)
            except OSError:
                continue
            out[os.path.relpath(path, root)] = (stat.st_mode >> 12, stat.st_size, stat.st_mtime_ns)
    return out


@pytest.fixture(scope="session", autouse=True)
def shared_data_stays_read_only():
    """The shared data folder is read-only for every test: anything created, changed or removed under
    it during the run (a library's cache written beside a fixture, say) fails the run, naming the paths."""
    if not SHARED_DATA.is_dir():
        yield
        return
    before = _listing(SHARED_DATA)
    yield
    after = _listing(SHARED_DATA)
    changed = sorted({path for path in before.keys() | after.keys() if before.get(path) != after.get(path)})
    if changed:
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        pytest.fail(f"tests changed the read-only shared data folder {SHARED_DATA}: {shown}", pytrace=False)


# Test workers fork (subprocesses with a preexec_fn, multiprocessing, os.fork), and a fork needs as much
# committable memory as the worker holds privately: a worker that keeps what its tests allocated fails later,
# unrelated tests with ENOMEM. DeepSpeed never frees an engine by itself, so engines built in this process
# are released after every test, and a test that still leaves the worker this much larger fails by name.
WORKER_GROWTH_LIMIT = int(1.5 * 2**30)


def _private_memory() -> int | None:
    """The worker's private data size (VmData): what a fork must be able to commit again."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@pytest.fixture(autouse=True)
def worker_memory_is_released(request):
    before = _private_memory()
    yield
    engines = sys.modules.get("tests.ckpt.worker")
    if engines is not None:
        engines.release_engines()
    after = _private_memory()
    if before is None or after is None or after - before <= WORKER_GROWTH_LIMIT:
        return
    import gc

    gc.collect()
    after = _private_memory() or after
    if after - before > WORKER_GROWTH_LIMIT:
        pytest.fail(
            f"{request.node.nodeid} left this test process {(after - before) / 2**30:.1f} GiB larger "
            f"({after / 2**30:.1f} GiB private): release what it built (llmtools.train.engine.release_engine "
            "for DeepSpeed engines), or later forks from this worker fail with ENOMEM",
            pytrace=False,
        )


@pytest.fixture
def cli_env():
    """Environment for subprocess CLI tests: the checkout on the path, debug tracebacks off."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("LLMTOOLS_DEBUG", None)
    return env


@pytest.fixture
def python():
    return sys.executable


def run_cli_inproc(capsys, monkeypatch, command: str, *args):
    """Run ``llm-<command>`` in this process through its real ``main`` (argument parsing and the error
    model included): much faster than a subprocess. Returns a CompletedProcess-like result."""
    import importlib
    import subprocess

    main = importlib.import_module(f"llmtools.cli.{command}").main
    capsys.readouterr()  # drop what the test's own set-up printed
    monkeypatch.setattr(sys, "argv", [f"llm-{command}", *map(str, args)])
    with pytest.raises(SystemExit) as exit_info:
        main()
    out = capsys.readouterr()
    code = exit_info.value.code
    return subprocess.CompletedProcess(args, 0 if code is None else code, out.out, out.err)
