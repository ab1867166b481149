"""Evaluation on the valid split: the first ``eval.iters`` micro-batches per rank, all ranks together.

For a task that predicts tokens (:class:`~llmtools.train.tasks.base.TokenScores`), the numbers are sums
over every scored token of every rank, so each is exactly its definition over the evaluated text:

* ``eval_loss`` = total cross-entropy in nats / tokens (``eval_ppl`` = exp of it);
* ``eval_accuracy`` = tokens whose top-1 prediction is the label / tokens;
* ``eval_bpb`` (bits per byte) = total cross-entropy / ln 2 / the UTF-8 bytes those tokens stand for
  (:mod:`llmtools.tokenize.token_bytes`; absent when the data's tokenizer cannot be reloaded).

A task that scores no tokens reports the mean of its micro-batch losses. The task's own metrics
(``metric_names``) are means over micro-batches and ranks.
"""

from __future__ import annotations

import math

from llmtools.train.distributed import all_mean
from llmtools.train.plan import TrainPlan


def evaluate(
    engine, plan: TrainPlan, rank: int, world: int, ranks: int | None = None
) -> tuple[float, dict[str, float]]:
    """The eval loss, and the other fields of the eval record (``eval_accuracy``, ``eval_bpb``,
    ``eval_tokens``, ``eval_bytes`` and the task's metrics). ``rank``/``world`` pick the samples (the
    data-parallel rank and replicas); ``ranks`` is every process that scores tokens (default ``world``;
    more under sequence parallelism, where each scores its part of the rows)."""
    import numpy as np
    import torch

    data, task = plan.valid_data, plan.task
    micro = plan.config.training.micro_batch_size
    n = len(data)
    byte_lengths = None
    if plan.eval_byte_lengths is not None:
        byte_lengths = torch.as_tensor(plan.eval_byte_lengths, device=engine.device)
    engine.eval()
    losses, metrics = [], {name: [] for name in task.metric_names}
    sums = [0.0, 0.0, 0.0, 0.0]  # tokens, nats, correct, bytes
    scored = False
    with torch.no_grad():
        for i in range(plan.config.eval.iters):
            start = (i * world + rank) * micro
            indices = [int(j % n) for j in range(start, start + micro)]
            out, scores = task.evaluate(engine, data.batch(np.asarray(indices)), engine.device, byte_lengths)
            losses.append(float(out.loss))
            for name in task.metric_names:
                metrics[name].append(float(out.metrics[name]))
            if scores is not None:
                scored = True
                sums[0] += float(scores.tokens)
                sums[1] += float(scores.nats)
                sums[2] += float(scores.correct)
                sums[3] += float(scores.bytes) if scores.bytes is not None else 0.0
    engine.train()
    local = [sum(losses) / len(losses)] + [sum(v) / len(v) for v in metrics.values()]
    # One reduction: means of the losses and metrics, and (mean x world =) sums of the token scores.
    means = all_mean(local + sums, engine.device)
    loss, task_means = means[0], means[1 : len(local)]
    record = dict(zip(task.metric_names, task_means, strict=True))
    if not scored:
        return loss, record
    tokens, nats, correct, scored_bytes = (value * (ranks or world) for value in means[len(local) :])
    record["eval_accuracy"] = correct / tokens if tokens else float("nan")
    record["eval_tokens"] = round(tokens)
    if byte_lengths is not None and scored_bytes > 0:
        record["eval_bpb"] = nats / math.log(2) / scored_bytes
        record["eval_bytes"] = round(scored_bytes)
    return (nats / tokens if tokens else float("nan")), record


def source_names(data) -> list[str] | None:
    """The short name of each source of a blended valid split (those of ``source_tokens`` in the train
    records; a valid split with its own blend names its own sources, one or more), or None when the data
    is not a blend (nothing tells which source a sample came from)."""
    parts = getattr(data, "parts", None)
    if not parts or getattr(data, "dataset_index", None) is None:
        return None
    from llmtools.data.streams import display_name

    taken: set[str] = set()
    names = []
    for part in parts:
        name = display_name(part.reader.prefix, taken)
        taken.add(name)
        names.append(name)
    return names


def evaluate_sources(engine, plan: TrainPlan, rank: int, world: int) -> dict[str, float]:
    """Per-source validation loss: the same micro-batches as :func:`evaluate`, each sample's tokens counted
    for the source it was drawn from: ``<source>/loss`` (nats per token) and ``<source>/bpb``. A pretraining
    task on a blend only (other tasks' samples are not a source's text). Collective."""
    import numpy as np
    import torch

    from llmtools.train.tasks.base import score_tokens
    from llmtools.train.tasks.pretrain import to_batch

    data = plan.valid_data
    names = source_names(data) if plan.task.per_source else None
    if names is None:  # refused before compute (plan.check_per_source): never reached in a run
        return {}
    micro, n = plan.config.training.micro_batch_size, len(data)
    byte_lengths = None
    if plan.eval_byte_lengths is not None:
        byte_lengths = torch.as_tensor(plan.eval_byte_lengths, device=engine.device)
    sums = [0.0] * (3 * len(names))  # per source: tokens, nats, bytes
    engine.eval()
    with torch.no_grad():
        for i in range(plan.config.eval.iters):
            start = (i * world + rank) * micro
            indices = np.asarray([int(j % n) for j in range(start, start + micro)])
            inputs, labels = to_batch(data.batch(indices), engine.device)
            logits = engine(inputs)
            for row, index in enumerate(indices):
                scores = score_tokens(logits[row : row + 1], labels[row : row + 1], byte_lengths=byte_lengths)
                source = int(data.dataset_index[index])
                sums[3 * source] += float(scores.tokens)
                sums[3 * source + 1] += float(scores.nats)
                sums[3 * source + 2] += float(scores.bytes) if scores.bytes is not None else 0.0
    engine.train()
    totals = [value * world for value in all_mean(sums, engine.device)]
    record: dict[str, float] = {}
    for s, name in enumerate(names):
        tokens, nats, scored_bytes = totals[3 * s : 3 * s + 3]
        if tokens:  # a source the evaluated batches did not draw from has no figure
            record[f"{name}/loss"] = nats / tokens
            record[f"{name}/tokens"] = round(tokens)
            if scored_bytes > 0:
                record[f"{name}/bpb"] = nats / math.log(2) / scored_bytes
    return record
