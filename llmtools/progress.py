"""Progress of long work, on stderr: tqdm's bar (rate and time left) on a terminal; elsewhere (a log file,
CI) the same figures as a plain line every ``LLMTOOLS_PROGRESS_INTERVAL`` seconds (default 30), so short
work stays silent and long work is never silent for long. Every long command uses this one class; the
library passes ``enabled=False`` only where the caller asked for quiet."""

from __future__ import annotations

import os
import sys
import time


def on_terminal() -> bool:
    """Whether a bar is drawn (stderr is a terminal) rather than plain lines."""
    return sys.stderr.isatty()


def _sized() -> bool:
    try:
        return min(os.get_terminal_size(sys.stderr.fileno())) > 0
    except (OSError, ValueError):
        return False


class Progress:
    """``with Progress(total, "verify step_00000200", unit="B") as bar: bar.update(n)``."""

    def __init__(self, total: int | None, desc: str, unit: str = "B", enabled: bool = True) -> None:
        self.total, self.desc, self.unit, self.n = total, desc, unit, 0
        self.enabled = enabled
        self.postfix = ""
        self.started = self.last = time.monotonic()
        self.interval = float(os.environ.get("LLMTOOLS_PROGRESS_INTERVAL", "30"))
        self.bar = None
        if enabled and on_terminal():
            from tqdm import tqdm

            # A terminal that reports no width (a bare pty, some `docker exec -t`) would get an empty bar.
            sized = _sized()
            self.bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=self._scale(), unit_divisor=self._divisor(),
                            file=sys.stderr, leave=False, dynamic_ncols=sized, ncols=None if sized else 100,
                            nrows=None if sized else 24, smoothing=0.1)  # fmt: skip

    def _divisor(self) -> int:
        return 1024 if self.unit == "B" else 1000

    def _scale(self) -> bool:
        return self.unit in ("B", "tok")  # big counts read better as 1.2G; tensors, rows and docs as they are

    def set_postfix(self, text: str) -> None:
        """Extra figures after the rate (``docs/s, tok/s``), on the bar and on the plain lines."""
        self.postfix = text
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=False)

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
        return tqdm.format_meter(self.n, self.total, elapsed, prefix=self.desc, unit=self.unit, unit_scale=self._scale(),
                                 unit_divisor=self._divisor(), ncols=0, postfix=self.postfix or None)  # fmt: skip

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
