"""LR schedules: warmup, each decay shape, total_steps fixed by the config, LambdaLR alignment."""

from __future__ import annotations

import math

import pytest

from llmtools.train.config_sections import ScheduleSection
from llmtools.train.schedule import lr_factor


def curve(kind: str, total: int = 100, **kw) -> list[float]:
    s = ScheduleSection(kind=kind, warmup_steps=kw.pop("warmup_steps", 10), **kw)
    return [lr_factor(step, s, total) for step in range(1, total + 1)]


@pytest.mark.parametrize("kind", ["cosine", "linear", "constant", "wsd", "inverse_sqrt"])
def test_linear_warmup_reaches_peak(kind):
    values = curve(kind)
    # float64 arithmetic on both sides in another order: pytest's default rel=1e-6 is ~2^30 of its ulps
    assert values[:10] == pytest.approx([i / 10 for i in range(1, 11)])
    # float64 arithmetic on both sides in another order: pytest's default rel=1e-6 is ~2^30 of its ulps
    assert max(values) == pytest.approx(1.0)


def test_cosine_ends_at_floor_and_is_monotonic():
    values = curve("cosine", min_lr_ratio=0.1)
    # float64 arithmetic on both sides in another order: pytest's default rel=1e-6 is ~2^30 of its ulps
    assert values[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(values[9:], values[10:], strict=False))
    mid = lr_factor(55, ScheduleSection(kind="cosine", warmup_steps=10, min_lr_ratio=0.1), 100)
    assert mid == pytest.approx(0.1 + 0.9 * 0.5)  # halfway through the decay


def test_linear_decay():
    s = ScheduleSection(kind="linear", warmup_steps=0, min_lr_ratio=0.0)
    # float64 arithmetic on both sides in another order: pytest's default rel=1e-6 is ~2^30 of its ulps
    assert [lr_factor(t, s, 10) for t in (0, 5, 10)] == pytest.approx([1.0, 0.5, 0.0])


def test_wsd_is_flat_then_decays():
    values = curve("wsd", decay_fraction=0.2, min_lr_ratio=0.0, decay_shape="linear")
    # float64 arithmetic on both sides in another order: pytest's default rel=1e-6 is ~2^30 of its ulps
    assert values[10:80] == pytest.approx([1.0] * 70)
    # float64 arithmetic on both sides in another order: pytest's default rel=1e-6 is ~2^30 of its ulps
    assert values[89] == pytest.approx(0.5)
    # float64 arithmetic on both sides in another order: pytest's default rel=1e-6 is ~2^30 of its ulps
    assert values[-1] == pytest.approx(0.0)
    sqrt_shape = curve("wsd", decay_fraction=0.2, min_lr_ratio=0.0)  # default 1-sqrt
    assert sqrt_shape[89] == pytest.approx(1 - math.sqrt(0.5))


def test_inverse_sqrt_is_continuous_after_warmup():
    s = ScheduleSection(kind="inverse_sqrt", warmup_steps=16)
    # float64 arithmetic on both sides in another order: pytest's default rel=1e-6 is ~2^30 of its ulps
    assert lr_factor(16, s, 100) == pytest.approx(1.0)
    # float64 arithmetic on both sides in another order: pytest's default rel=1e-6 is ~2^30 of its ulps
    assert lr_factor(64, s, 100) == pytest.approx(0.5)


def test_past_total_steps_holds_the_floor():
    s = ScheduleSection(kind="cosine", warmup_steps=0, min_lr_ratio=0.2)
    # float64 arithmetic on both sides in another order: pytest's default rel=1e-6 is ~2^30 of its ulps
    assert lr_factor(150, s, 100) == pytest.approx(0.2)


def test_total_steps_fixed_keeps_one_curve():
    """A run of 50 steps then continued to 100 sees the same rates as one run of 100 (total_steps fixed)."""
    s = ScheduleSection(kind="cosine", warmup_steps=5, total_steps=100)
    first = [lr_factor(t, s, 100) for t in range(1, 51)]
    whole = [lr_factor(t, s, 100) for t in range(1, 101)]
    assert first == whole[:50]


def test_lambda_lr_applies_step_one_rate_to_first_update():
    torch = pytest.importorskip("torch")
    from llmtools.train.schedule import build_lr_scheduler

    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=2.0)
    s = ScheduleSection(kind="cosine", warmup_steps=4)
    sched = build_lr_scheduler(opt, s, 20)
    seen = []
    for _ in range(6):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # float64 arithmetic on both sides in another order: pytest's default rel=1e-6 is ~2^30 of its ulps
    assert seen == pytest.approx([2.0 * lr_factor(t, s, 20) for t in range(1, 7)])
