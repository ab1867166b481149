"""Saves by wall-clock time (``checkpoint.save_every_minutes``): a run killed by the OOM killer, a lost node
or a preemption without notice loses at most about that much work, whatever ``save_every`` says.

Rank 0's clock decides and one tiny collective tells every rank, so all ranks save at the same step (each
rank's own clock could fall on either side of the interval). One process needs no collective. torch is
imported only by that collective (this module is imported before the run's checks end)."""

from __future__ import annotations

import time


class SaveClock:
    """Whether ``minutes`` of training have passed since the run started here or last saved."""

    def __init__(self, minutes: float, rank: int, world: int, device) -> None:
        self.seconds = 60.0 * minutes
        self.rank, self.world, self.device = rank, world, device
        self.since = time.monotonic()

    def restart(self) -> None:
        """A checkpoint was just saved (by whatever made it due): the interval counts from now."""
        self.since = time.monotonic()

    def due(self) -> bool:
        """Rank 0's answer, on every rank (collective when there are several ranks: call it on all)."""
        if not self.seconds:
            return False
        late = self.rank == 0 and time.monotonic() - self.since >= self.seconds
        if self.world == 1:
            return late
        from llmtools.train.distributed import any_rank

        return any_rank(late, self.device)
