"""Progress of long work, on stderr: tqdm's bar (rate and time left) on a terminal; elsewhere (a log file,
CI) the same figures as a plain line every ``LLMTOOLS_PROGRESS_INTERVAL`` seconds (default 30), so short
work stays silent and long work is never silent for long."""

from __future__ import annotations

import os
import sys
import time


class Progress:
    """``with Progress(total, "verify step_00000200", unit="B") as bar: bar.update(n)``."""

    def __init__(self, total: int | None, desc: str, unit: str = "B", enabled: bool = True) -> None:
        self.total, self.desc, self.unit, self.n = total, desc, unit, 0
        self.enabled = enabled
        self.started = self.last = time.monotonic()
        self.interval = float(os.environ.get("LLMTOOLS_PROGRESS_INTERVAL", "30"))
        self.bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            scale = unit == "B"
            self.bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=scale, unit_divisor=1024 if scale else 1000,
                            file=sys.stderr, leave=False, dynamic_ncols=True)  # fmt: skip

    def update(self, n: int) -> None:
        self.n += n
        if self.bar is not None:
            self.bar.update(n)
            return
        now = time.monotonic()
        if self.enabled and now - self.last >= self.interval:
            self.last = now
            print(self.line(now), file=sys.stderr, flush=True)

    def line(self, now: float | None = None) -> str:
        from tqdm import tqdm

        elapsed = (now or time.monotonic()) - self.started
        scale = self.unit == "B"
        return tqdm.format_meter(self.n, self.total, elapsed, prefix=self.desc, unit=self.unit, unit_scale=scale,
                                 unit_divisor=1024 if scale else 1000, ncols=0)  # fmt: skip

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
