"""Pretraining (``task: pretrain``, the default): next-token cross-entropy in fp32 over every token of
blended GPT samples (a ``mix.json`` from llm-mix, or prefixes with weights planned in code).

The train data keeps a data ledger (:mod:`llmtools.data.ledger`): one cursor per source, so a resumed
run continues every source where it stopped, also when the mix changed in between.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from llmtools.errors import InputError
from llmtools.train.tasks.base import DataLedger, DataResume, LossOutput, Task, TokenScores, score_tokens


def cross_entropy(logits, labels):
    import torch.nn.functional as F

    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def to_batch(array, device):
    import torch

    tokens = torch.from_numpy(array).to(device=device, dtype=torch.long, non_blocking=True)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


class PretrainTask(Task):
    name = "pretrain"

    def __init__(self, config) -> None:
        super().__init__(config)
        self._plan = None  # llmtools.data.ledger.DataPlan of the train split
        self._train = None  # the RunData the trainer reads

    def open_data(self, split: str, samples_for: Callable[[int], int]):
        """A mix's split (its seq_length and samples are the mix's), or exactly the samples the run needs
        planned over ``data.prefixes``. The train split keeps a data ledger."""
        from llmtools.data.dataset import BlendedGPTDataset

        data = self.config.data
        if data.mix is not None:
            if not os.path.exists(data.mix):
                raise InputError(
                    f"{self.config.source}: data.mix: {data.mix}: no such file (make one with llm-mix)"
                )
            if split == "train":
                from llmtools.data.ledger import DataPlan

                return self._open_train(DataPlan.from_mix(data.mix))
            opened = BlendedGPTDataset.from_mix(data.mix, split=split)
            self._check_seq_length(opened.seq_length)
            return opened
        # the plan's arguments: the train split is planned here (its ledger), the others by the dataset
        planned = (
            data.prefixes,
            data.weights or [1.0] * len(data.prefixes),
            data.seq_length,
            samples_for(data.seq_length),
        )
        options = {"seed": data.seed, "split": data.split, "cache_dir": data.cache_dir}
        if split == "train":
            from llmtools.data.ledger import DataPlan
            from llmtools.data.mix import plan_prefixes

            plan = plan_prefixes(*planned, **options)
            return self._open_train(DataPlan.from_mix_plan(plan, "data.prefixes"))
        return BlendedGPTDataset.from_prefixes(*planned, **options, split_name=split)

    def _check_seq_length(self, seq_length: int) -> None:
        data = self.config.data
        if data.mix is not None and data.seq_length is not None and data.seq_length != seq_length:
            raise InputError(
                f"{self.where}: data.seq_length={data.seq_length} contradicts seq_length={seq_length} "
                f"of {data.mix}"
            )

    def _open_train(self, plan):
        from llmtools.data.ledger import open_run_data

        self._check_seq_length(plan.seq_length)
        self._plan = plan
        self._train, _ = open_run_data(plan, None, 0)
        return self._train

    # -- the data ledger ---------------------------------------------------------------------------
    def ledger(self) -> DataLedger | None:
        return self._train

    def resume_data(
        self, saved: dict | None, consumed: int, *, reset: bool, quarantine: list[dict], where: str
    ) -> DataResume:
        from llmtools.data.ledger import Ledger, open_run_data

        ledger = None if saved is None else Ledger.from_json(saved, where)
        data, report = open_run_data(
            self._plan,
            ledger,
            0 if reset else consumed,
            reset=reset,
            quarantine=quarantine,
            where=where,
        )
        self._train = data
        event = None
        if report.kind in ("continued", "extended", "reset") or report.quarantine:
            event = {
                "change": report.kind,
                "plan": self._plan.identity,
                "path": self._plan.origin,
                "position": 0 if reset else consumed,
                "sources": report.sources,
                "quarantined_documents": report.quarantine,
            }
        return DataResume(data, report.lines, event)

    def sample_losses(self, model, batch, device) -> list[float]:
        import torch
        import torch.nn.functional as F

        inputs, labels = to_batch(batch, device)
        with torch.no_grad():
            logits = model(inputs).float()
            per_token = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none")
        return per_token.view(labels.shape).mean(dim=1).tolist()

    def loss(self, model, batch, device) -> LossOutput:
        inputs, labels = to_batch(batch, device)
        return LossOutput(cross_entropy(model(inputs), labels))

    def evaluate(self, model, batch, device, byte_lengths=None) -> tuple[LossOutput, TokenScores]:
        inputs, labels = to_batch(batch, device)
        scores = score_tokens(model(inputs), labels, byte_lengths=byte_lengths)
        if self.metric_names:  # a task built on this one reports its metrics from its own loss()
            return self.loss(model, batch, device), scores
        return LossOutput(scores.nats / scores.tokens), scores
