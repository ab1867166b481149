"""What a benchmark worker's measured stretch adds to memory, and running such a worker in its own process.

On CUDA it is the allocator's peak over what was allocated before; on CPU the process's peak RSS over the
peak before (``ru_maxrss`` never goes down, so each measurement runs in a fresh worker process: what it
reports is that worker's own). Shared by bench_memory, bench_doc_mask and bench_dpo.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys


def rss_peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class PeakMemory:
    """``with PeakMemory(cuda) as peak: ...`` then ``peak.grown_mb``: memory the block added at its peak."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.before = 0
        self.grown_mb = 0.0

    def __enter__(self) -> PeakMemory:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.before = torch.cuda.memory_allocated()
        else:
            self.before = rss_peak_bytes()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
        else:
            peak = rss_peak_bytes()
        self.grown_mb = (peak - self.before) / 2**20


def run_worker(script: str, argv: list[str], what: str, threads: int | None = None) -> dict:
    """Run ``script ARGV`` in a fresh process (with ``threads`` OpenMP threads when given); its last stdout
    line is the JSON result."""
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    proc = subprocess.run(
        [sys.executable, script, *argv], capture_output=True, text=True, env=env, check=False
    )
    if proc.returncode:
        raise SystemExit(f"worker failed ({what}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
