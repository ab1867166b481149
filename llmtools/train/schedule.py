"""Learning-rate schedules: linear warmup, then cosine / linear / constant / WSD / inverse-sqrt.

``lr_factor(step)`` is the multiplier of ``optimizer.lr`` for optimizer step ``step`` (1-based: the first
update uses step 1). ``total_steps`` comes from the config, not from the run, so a run continued with more
steps stays on the same curve. Past ``total_steps`` the rate holds its final value.
"""

from __future__ import annotations

import math

from llmtools.train.config_sections import ScheduleSection


def lr_factor(step: int, schedule: ScheduleSection, total_steps: int) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` (1-based)."""
    warmup = schedule.warmup_steps
    floor = schedule.min_lr_ratio
    if warmup and step <= warmup:
        return step / warmup
    kind = schedule.kind
    if kind == "constant":
        return 1.0
    if kind == "inverse_sqrt":
        # Continuous at the end of warmup; with no warmup it starts at 1 and falls as 1/sqrt(step).
        return math.sqrt(max(warmup, 1) / max(step, 1))
    span = max(total_steps - warmup, 1)
    progress = min(max(step - warmup, 0) / span, 1.0)
    if kind == "cosine":
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    if kind == "linear":
        return floor + (1 - floor) * (1 - progress)
    if kind == "wsd":
        decay = max(1, round(schedule.decay_fraction * total_steps))
        start = total_steps - decay
        if step <= start:
            return 1.0
        t = min((step - start) / decay, 1.0)
        if schedule.decay_shape == "linear":
            shape = 1 - t
        elif schedule.decay_shape == "cosine":
            shape = 0.5 * (1 + math.cos(math.pi * t))
        else:  # "1-sqrt" (Hägele et al. 2024)
            shape = 1 - math.sqrt(t)
        return floor + (1 - floor) * shape
    raise ValueError(f"unknown schedule kind {kind!r}")  # unreachable: ScheduleSection validates kind


def build_lr_scheduler(optimizer, schedule: ScheduleSection, total_steps: int):
    """A ``torch.optim.lr_scheduler.LambdaLR`` following :func:`lr_factor`.

    LambdaLR calls its lambda with the number of scheduler steps taken so far (0 before the first
    update), so the lambda shifts by one: the update of step s uses ``lr_factor(s)``. A resumed run
    restores the scheduler's state from the checkpoint.
    """
    from torch.optim.lr_scheduler import LambdaLR

    return LambdaLR(optimizer, lambda taken: lr_factor(taken + 1, schedule, total_steps))
