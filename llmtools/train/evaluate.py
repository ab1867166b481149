"""Evaluation on the valid split: the task's loss (and metrics) over the first ``eval.iters`` micro-batches."""

from __future__ import annotations

from llmtools.train.distributed import all_mean
from llmtools.train.plan import TrainPlan


def evaluate(engine, plan: TrainPlan, rank: int, world: int) -> tuple[float, dict[str, float]]:
    """Mean loss (and task metrics) over the first ``eval.iters`` micro-batches per rank of the valid split,
    averaged over the ranks."""
    import numpy as np
    import torch

    data, task = plan.valid_data, plan.task
    micro = plan.config.training.micro_batch_size
    n = len(data)
    engine.eval()
    losses, metrics = [], {name: [] for name in task.metric_names}
    with torch.no_grad():
        for i in range(plan.config.eval.iters):
            start = (i * world + rank) * micro
            indices = [int(j % n) for j in range(start, start + micro)]
            out = task.loss(engine, data.batch(np.asarray(indices)), engine.device)
            losses.append(float(out.loss))
            for name in task.metric_names:
                metrics[name].append(float(out.metrics[name]))
    engine.train()
    local = [sum(losses) / len(losses)] + [sum(v) / len(v) for v in metrics.values()]
    means = all_mean(local, engine.device)
    return means[0], dict(zip(task.metric_names, means[1:], strict=True))
