"""Training health: a NaN/inf loss or grad norm, a grad-norm spike or a loss spike decides whether an update
is applied; a spike of the applied update's size (its ratio to the parameters) warns or stops after it.

The decision is taken inside the optimizer step (see :class:`HealthGate`); what happens next -- skip the
update, or stop with a checkpoint -- is the loop's business.
"""

from __future__ import annotations

import math
import statistics
from collections import deque


class HealthGate:
    """Decides, inside the optimizer step, whether this update is applied.

    DeepSpeed computes the global grad norm (all ranks agree on it) before it calls the inner optimizer,
    so the check runs there: the wrapped ``step`` of the basic optimizer asks :meth:`allow`. A skipped
    update leaves the weights and Adam moments untouched; the LR schedule still advances, so the step
    count and the curve stay aligned. With ``stop`` the update is refused too, so the checkpoint written
    before stopping holds the last good weights.
    """

    def __init__(self, health, norm_source, loss_scaling: bool = False) -> None:
        self.health = health
        self.norm_source = norm_source  # () -> float | None, the global pre-clip grad norm
        # fp16: DeepSpeed skips overflowing steps as its loss scaler's routine.
        self.loss_scaling = loss_scaling
        self.history: deque[float] = deque(maxlen=health.spike_window)
        self.update_history: deque[float] = deque(maxlen=health.spike_window)
        self.loss_history: deque[float] = deque(maxlen=health.spike_window)
        self.reset()
        self.consecutive_skips = 0

    def reset(self) -> None:
        self.loss_bad = False
        self.loss: float | None = None  # the step's loss, the same on every rank (for loss spikes)
        self.loss_limit: float | None = None  # above it a loss is a spike (None: not checked yet)
        self.decided = False
        self.skip = False
        self.reason: str | None = None  # "nan" | "spike" | "loss_spike" | "overflow" (fp16)
        self.stop = False
        self.norm: float | None = None
        self.precomputed_norm: float | None = None
        self.update_spike: str | None = None  # a message when the applied update's size spiked

    # -- what decides the next steps, kept in every checkpoint ------------------------------------------
    def state_dict(self) -> dict:
        """The recent healthy grad norms, losses and update ratios (the medians spikes are measured
        against) and the count of consecutive skips: a resumed run decides its next updates as the
        uninterrupted one would."""
        return {
            "history": list(self.history),
            "loss_history": list(self.loss_history),
            "update_history": list(self.update_history),
            "consecutive_skips": self.consecutive_skips,
        }

    def load_state_dict(self, state: dict, where: str = "health_state") -> None:
        """Take back :meth:`state_dict`; a window longer than ``health.spike_window`` keeps its newest
        values (the deques' own rule), a shorter one fills up again as a fresh run's does."""
        from llmtools.errors import InputError

        if not isinstance(state, dict):
            raise InputError(f"{where}: expected an object")
        for key in ("history", "loss_history", "update_history"):
            values = state.get(key, [])
            if not isinstance(values, list) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values
            ):
                raise InputError(f"{where}.{key}: expected a list of finite numbers")
            window: deque[float] = getattr(self, key)
            window.clear()
            window.extend(float(v) for v in values)
        skips = state.get("consecutive_skips", 0)
        if not isinstance(skips, int) or isinstance(skips, bool) or skips < 0:
            raise InputError(f"{where}.consecutive_skips: expected an integer >= 0")
        self.consecutive_skips = skips

    def allow(self) -> bool:
        if not self.decided:
            self._decide()
        return not self.skip

    def overflowed(self) -> None:
        """DeepSpeed found non-finite gradients and skipped the update before asking the optimizer.

        With fp16 loss scaling that is the scaler's routine (it halves the scale and goes on), unless
        the loss itself was not finite; otherwise it is a NaN/inf like any other."""
        self.decided = True
        norm = self.norm_source()
        self.norm = float("inf") if norm is None else float(norm)
        if self.loss_scaling and not self.loss_bad:
            self.reason, self.skip, self.stop = "overflow", True, False
            return
        self.reason, self.skip, self.stop = "nan", True, self.health.nan_action == "stop"

    def check_update(self, ratio: float, lr: float) -> None:
        """The applied update's size, per unit of learning rate (so warmup and decay do not look like
        spikes), against the median of the recent ones (``health.update_spike_factor``)."""
        h = self.health
        if not (h.update_spike_factor > 0 and lr > 0 and math.isfinite(ratio)):
            return
        scaled = ratio / lr
        window = self.update_history
        if len(window) == window.maxlen and scaled > h.update_spike_factor * statistics.median(window):
            self.update_spike = (
                f"update/parameter ratio spike {ratio:.3g} ({scaled:.3g} per unit lr > "
                f"{h.update_spike_factor} x median {statistics.median(window):.3g})"
            )
            return
        window.append(scaled)

    def _decide(self) -> None:
        self.decided = True
        norm = self.norm_source()
        if norm is None:
            norm = self.precomputed_norm
        self.norm = None if norm is None else float(norm)
        h = self.health
        if h.loss_spike_factor > 0 and len(self.loss_history) == self.loss_history.maxlen:
            self.loss_limit = h.loss_spike_factor * statistics.median(self.loss_history)
        if self.loss_bad or (self.norm is not None and not math.isfinite(self.norm)):
            self.reason, self.skip, self.stop = "nan", True, h.nan_action == "stop"
        elif (
            h.spike_factor > 0
            and self.norm is not None
            and len(self.history) == self.history.maxlen
            and self.norm > h.spike_factor * statistics.median(self.history)
        ):
            self.reason = "spike"
        elif self.loss_limit is not None and self.loss is not None and self.loss > self.loss_limit:
            self.reason = "loss_spike"
        if self.reason in ("spike", "loss_spike"):
            self.skip = h.spike_action in ("skip", "stop")
            self.stop = h.spike_action == "stop"
        if self.norm is not None and math.isfinite(self.norm) and not self.skip:
            self.history.append(self.norm)
        if self.loss is not None and math.isfinite(self.loss) and not self.skip:
            self.loss_history.append(self.loss)


IDLE_SHARE = 0.1
"""An expert is idle in a window when it gets under this share of an even split of the tokens."""


def routing_collapse(layers: list[dict], health) -> str | None:
    """MoE routing collapse in a logging window's router statistics (``moe_layers`` of a train record):
    the first layer where most experts are idle or most token assignments are dropped, described; None
    when no layer is (or the check is off)."""
    if health.moe_collapse_action == "off":
        return None
    for layer in layers:
        load = layer["load"]
        idle = sum(1 for share in load if share * len(load) < IDLE_SHARE)
        if idle >= health.moe_idle_fraction * len(load):
            return (
                f"MoE routing collapse in layer {layer['layer']}: {idle} of {len(load)} experts idle "
                f"(>= health.moe_idle_fraction {health.moe_idle_fraction:g})"
            )
        if layer["dropped"] >= health.moe_dropped_fraction:
            return (
                f"MoE routing collapse in layer {layer['layer']}: {layer['dropped']:.0%} of token assignments "
                f"dropped (>= health.moe_dropped_fraction {health.moe_dropped_fraction:g})"
            )
    return None


def wrap_step(optimizer, gate: HealthGate, monitor=None) -> None:
    """Gate every step of the inner optimizer; ``monitor`` (a :class:`~llmtools.train.norms.NormMonitor`)
    sees the parameters before and after each applied one."""
    original = optimizer.step

    def step(*args, **kwargs):
        # Marked like torch's own LR-scheduler wrapper, so torch does not warn that step() was replaced.
        optimizer._opt_called = True
        if not gate.allow():
            return None
        if monitor is None:
            return original(*args, **kwargs)
        old = monitor.before(optimizer)
        out = original(*args, **kwargs)
        monitor.after(optimizer, old)
        return out

    step._wrapped_by_lr_sched = True
    optimizer.step = step
