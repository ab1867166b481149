"""The loss of a micro-batch (next-token cross-entropy in fp32) and the evaluation on the valid split."""

from __future__ import annotations

from llmtools.train.distributed import all_mean
from llmtools.train.plan import TrainPlan


def cross_entropy(logits, labels):
    import torch.nn.functional as F

    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def to_batch(array, device):
    import torch

    tokens = torch.from_numpy(array).to(device=device, dtype=torch.long, non_blocking=True)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def evaluate(engine, plan: TrainPlan, rank: int, world: int) -> float:
    """Mean next-token loss over the first ``eval.iters`` micro-batches per rank of the valid split."""
    import numpy as np
    import torch

    data = plan.valid_data
    micro = plan.config.training.micro_batch_size
    n = len(data)
    engine.eval()
    losses = []
    with torch.no_grad():
        for i in range(plan.config.eval.iters):
            start = (i * world + rank) * micro
            indices = [int(j % n) for j in range(start, start + micro)]
            inputs, labels = to_batch(data.batch(np.asarray(indices)), engine.device)
            losses.append(float(cross_entropy(engine(inputs), labels)))
    engine.train()
    return all_mean([sum(losses) / len(losses)], engine.device)[0]
