"""One optimizer step (:func:`accumulate_and_update`) and its figures (:func:`step_means`).

``grad_accumulation`` micro-batches per rank (forward and the task's loss, :mod:`~llmtools.train.tasks`;
backward), then the update; the health checks gate the update (:mod:`~llmtools.train.health`). The loss
reported for a step is the mean of the micro-batch losses over all ranks, i.e. the loss of the global
batch. torch is imported inside the functions: every function here runs with it loaded, and importing
this module must not load it.
"""

from __future__ import annotations

import contextlib

from llmtools.train.distributed import all_mean, any_rank, mean_over_ranks
from llmtools.train.engine import grad_norm_of
from llmtools.train.health import HealthGate
from llmtools.train.plan import TrainPlan


def accumulate_and_update(
    engine, plan: TrainPlan, batches, gate: HealthGate, coalesce: bool, own_norm: bool, router=None
):
    """One optimizer step: every micro-batch's forward and backward, the health checks, the update.

    ``router`` (a MoE model's :class:`~llmtools.train.moe.RouterLoss`) is the model the task calls: the
    router's auxiliary loss of that forward joins the micro-batch's loss before backward (the task's
    loss alone is what is reported). Returns the micro-batch losses and the task's metrics per
    micro-batch (detached)."""
    import torch

    gas = plan.grad_accumulation
    model = engine if router is None else router
    losses, metrics = [], []
    if coalesce:  # DeepSpeed's documented manual boundary: not one until all micro-batches are in
        engine.set_gradient_accumulation_boundary(False)
    with engine.coalesce_grad_reduction() if coalesce else contextlib.nullcontext():
        for m in range(gas):
            indices = next(batches)
            batch = plan.train_data.batch(indices)
            if hasattr(plan.train_data, "check_ids"):
                plan.train_data.check_ids(batch, indices)
            out = plan.task.loss(model, batch, engine.device)
            losses.append(out.loss.detach())
            metrics.append({name: value.detach() for name, value in out.metrics.items()})
            aux = router.take_aux() if router is not None else None
            engine.backward(out.loss if aux is None else out.loss + aux)
            if m < gas - 1 and not coalesce:
                engine.step()  # DeepSpeed counts micro-steps; the update waits for the boundary
    # the accumulation boundary: health checks, then the update
    local = torch.stack(losses).float()
    gate.loss_bad = any_rank(not bool(torch.isfinite(local).all()), engine.device)
    if gate.health.loss_spike_factor > 0 and not gate.loss_bad:
        gate.loss = mean_over_ranks(float(local.mean()), engine.device)  # one verdict on every rank
    if own_norm:
        gate.precomputed_norm = grad_norm_of(engine.module)
    if coalesce:
        engine.set_gradient_accumulation_boundary(True)
    engine.step()
    if not gate.decided:  # the optimizer was not reached (DeepSpeed skipped an overflowing step itself)
        gate.overflowed()
    return losses, metrics


def step_means(
    losses: list, metrics: list[dict], names: tuple[str, ...], device
) -> tuple[float, dict[str, float]]:
    """The step's loss and task metrics: means over the micro-batches, then over all ranks (one reduction)."""
    import torch

    local = [float(torch.stack(losses).float().mean())]
    local += [float(torch.stack([m[name] for m in metrics]).float().mean()) for name in names]
    means = all_mean(local, device)
    return means[0], dict(zip(names, means[1:], strict=True))
