"""Pretraining (``task: pretrain``, the default): next-token cross-entropy in fp32 over every token of
blended GPT samples (a ``mix.json`` from llm-mix, or prefixes with weights planned in code)."""

from __future__ import annotations

import os
from collections.abc import Callable

from llmtools.errors import InputError
from llmtools.train.tasks.base import LossOutput, Task, TokenScores, score_tokens


def cross_entropy(logits, labels):
    import torch.nn.functional as F

    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def to_batch(array, device):
    import torch

    tokens = torch.from_numpy(array).to(device=device, dtype=torch.long, non_blocking=True)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


class PretrainTask(Task):
    name = "pretrain"

    def open_data(self, split: str, samples_for: Callable[[int], int]):
        """A mix's split (its seq_length and samples are the mix's), or exactly the samples the run needs
        planned over ``data.prefixes``."""
        from llmtools.data.dataset import BlendedGPTDataset

        data = self.config.data
        if data.mix is not None:
            if not os.path.exists(data.mix):
                raise InputError(
                    f"{self.config.source}: data.mix: {data.mix}: no such file (make one with llm-mix)"
                )
            opened = BlendedGPTDataset.from_mix(data.mix, split=split)
            if data.seq_length is not None and data.seq_length != opened.seq_length:
                raise InputError(
                    f"{self.where}: data.seq_length={data.seq_length} contradicts seq_length={opened.seq_length} "
                    f"of {data.mix}"
                )
            return opened
        return BlendedGPTDataset.from_prefixes(
            data.prefixes,
            data.weights or [1.0] * len(data.prefixes),
            data.seq_length,
            samples_for(data.seq_length),
            seed=data.seed,
            split=data.split,
            cache_dir=data.cache_dir,
            **({"split_name": split} if split != "train" else {}),
        )

    def loss(self, model, batch, device) -> LossOutput:
        inputs, labels = to_batch(batch, device)
        return LossOutput(cross_entropy(model(inputs), labels))

    def evaluate(self, model, batch, device, byte_lengths=None) -> tuple[LossOutput, TokenScores]:
        inputs, labels = to_batch(batch, device)
        scores = score_tokens(model(inputs), labels, byte_lengths=byte_lengths)
        if self.metric_names:  # a task built on this one reports its metrics from its own loss()
            return self.loss(model, batch, device), scores
        return LossOutput(scores.nats / scores.tokens), scores
