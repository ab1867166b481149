"""A script of the user's that calls the library's ``init_distributed`` and simply returns still gets its
process group torn down while Python is alive: a gloo group left to interpreter finalization can abort the
process ("terminate called without an active exception", exit 134) after all of its work succeeded."""

from __future__ import annotations

import subprocess
import sys

from tests.train.test_slurm import clean_env

# atexit runs its handlers last registered, first run: this check, registered before init_distributed,
# runs after whatever the library registered, as interpreter finalization would.
SCRIPT = """
import atexit
import torch.distributed as dist
atexit.register(lambda: print("alive at exit:", dist.is_initialized(), flush=True))
from llmtools.train.distributed import init_distributed
info = init_distributed()
t = __import__("torch").ones(1)
dist.all_reduce(t)
print("world", info.world_size, "sum", int(t.item()), flush=True)
"""


def test_a_script_that_never_destroys_its_group_has_it_destroyed_before_finalization(cli_env):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=clean_env(cli_env), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "world 1 sum 1" in done.stdout and "alive at exit: False" in done.stdout, done.stdout
