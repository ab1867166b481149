"""``kill -9`` in the middle of an output-writing command, then the same command again, without ``--force``:
the rerun succeeds and leaves exactly its outputs, nothing of the killed run (no ``.tmp-*`` temporary, no
lock file). The writer that takes an output's lock removes the temporaries a dead writer of that output
left (``llmtools.locks.remove_dead_temporaries``): one mechanism, taken by every command that writes an
output. Each case is a real console script paused mid-write (``hooks/sitecustomize.py``) and killed."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.contract.conftest import HOOKS, contract_env, run_cli, start_cli, temporaries
from tests.contract.test_bad_inputs import copy_world_prefix
from tests.contract.test_signals import CASES

# llm-mix's index cache sits in MIX.cache/, a folder only that mix.json's writer writes into.
KILLED = ["json2bin", "sft", "pref", "merge", "tokenizer-train", "export", "export-sigint", "convert-hf", "mix"]


def _locks(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.lock"))


@pytest.mark.parametrize("case", [c for c in CASES if c.name in KILLED], ids=lambda c: c.name)
def test_a_rerun_after_kill_9_leaves_nothing_of_the_killed_run(case, world, tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    copy_world_prefix(case.copies, d, world)
    for relative, content in case.files.items():
        (d / relative).parent.mkdir(parents=True, exist_ok=True)
        (d / relative).write_bytes(content)
    argv = [a.format(w=world) if "{w." in a else a for a in case.argv]
    mark = tmp_path / "paused"
    env = contract_env()
    env.update(PYTHONPATH=f"{HOOKS}{os.pathsep}{env['PYTHONPATH']}", LLMTOOLS_TEST_PAUSE=case.pause,
               LLMTOOLS_TEST_PAUSE_MARK=str(mark))  # fmt: skip
    proc = start_cli(argv, d, env=env)
    try:
        deadline = time.monotonic() + 180
        while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert mark.exists(), proc.stderr.read().decode()
        left = temporaries(d)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert left or _locks(d), "the kill found nothing in flight"
    again = run_cli(argv, d)
    assert again.returncode == 0, again.stderr.decode()[-2000:]
    assert temporaries(d) == [], f"the killed run's temporaries stayed: {temporaries(d)}"
    assert _locks(d) == [], f"lock files stayed: {_locks(d)}"
