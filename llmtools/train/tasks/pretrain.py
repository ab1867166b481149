"""Pretraining (``task: pretrain``, the default): next-token cross-entropy in fp32 over every token of
blended GPT samples (a ``mix.json`` from llm-mix, or prefixes with weights planned in code).

With ``data.reset_position_ids`` / ``reset_attention_mask`` / ``eod_mask_loss`` (Megatron's flags,
:mod:`llmtools.data.doc_mask`) the samples carry position ids restarting per document, document ids
that keep attention inside each document, and a loss mask over the EOD inputs; the EOD id is the one
the data's tokenizer identity records.

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


def masked_cross_entropy(logits, labels, loss_mask):
    """``sum(ce * mask) / sum(mask)`` in fp32, Megatron's masked loss (0 when nothing is masked in)."""
    import torch.nn.functional as F

    ce = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none")
    mask = loss_mask.flatten().to(ce.dtype)
    return (ce * mask).sum() / mask.sum().clamp(min=1.0)


class Inputs:
    """One micro-batch on the device: inputs, labels, the model's keyword arguments, the loss mask."""

    def __init__(self, array, device, eod_id: int | None, data, sequence=None) -> None:
        import torch

        self.tokens, self.labels = to_batch(array, device)
        self.kwargs: dict = {}
        self.loss_mask = None
        self.sequence = sequence
        if eod_id is not None:
            self._masks(array, device, eod_id, data)
        if sequence is not None:  # this rank's slice of every row; the document boundaries stay whole
            if "position_ids" not in self.kwargs:
                t = self.tokens.shape[1]
                self.kwargs["position_ids"] = torch.arange(t, device=device).expand_as(self.tokens)
            self.tokens, self.labels = sequence.local(self.tokens), sequence.local(self.labels)
            self.kwargs["position_ids"] = sequence.local(self.kwargs["position_ids"])
            if self.loss_mask is not None:
                self.loss_mask = sequence.local(self.loss_mask)

    def loss(self, logits):
        """The micro-batch's loss (this rank's share of it under sequence parallelism)."""
        if self.sequence is not None:
            import torch.nn.functional as F

            ce = F.cross_entropy(logits.float().flatten(0, 1), self.labels.flatten(), reduction="none")
            mask = None if self.loss_mask is None else self.loss_mask.flatten()
            return self.sequence.share(ce, mask)
        if self.loss_mask is None:
            return cross_entropy(logits, self.labels)
        return masked_cross_entropy(logits, self.labels, self.loss_mask)

    def _masks(self, array, device, eod_id: int, data) -> None:
        import numpy as np
        import torch

        from llmtools.data.doc_mask import document_masks

        masks = document_masks(
            np.asarray(array)[:, :-1],
            eod_id,
            reset_position_ids=data.reset_position_ids,
            reset_attention_mask=data.reset_attention_mask,
            eod_mask_loss=data.eod_mask_loss,
        )

        def t(a):
            return torch.from_numpy(np.ascontiguousarray(a)).to(device=device)

        if data.reset_position_ids:
            self.kwargs["position_ids"] = t(masks["position_ids"])
        if data.reset_attention_mask:
            self.kwargs["segment_ids"] = t(masks["segment_ids"])
        if data.eod_mask_loss:
            self.loss_mask = t(masks["loss_mask"])


def eod_id_of(tokenizer: dict | None, where: str) -> int:
    """The EOD id of the data's tokenizer identity (refused when the data does not record one)."""
    eod = (tokenizer or {}).get("eod_id") if isinstance(tokenizer, dict) else None
    if isinstance(eod, bool) or not isinstance(eod, int) or eod < 0:
        raise InputError(
            f"{where}: data.reset_position_ids/reset_attention_mask/eod_mask_loss need the EOD id, "
            "and the data's sidecar records no tokenizer eod_id (re-tokenize it with llm-prep json2bin)"
        )
    return eod


class PretrainTask(Task):
    name = "pretrain"
    per_source = True

    def __init__(self, config) -> None:
        super().__init__(config)
        self._plan = None  # llmtools.data.train_streams.TrainStreams of the train split
        self._mix = None  # the MixFile of data.mix, read once for every split
        self._train = None  # the RunData the trainer reads
        self._eod: int | None = None  # the EOD id when document masking is on
        self.sequence = None  # this rank's SequenceSlice under sequence parallelism (set by the engine)

    def _masking(self, opened):
        """Remember the data's EOD id when document masking is on (every split names the same one)."""
        if self.config.data.document_masking:
            self._eod = eod_id_of(opened.tokenizer, self.where)
        return opened

    def inputs(self, batch, device) -> Inputs:
        return Inputs(batch, device, self._eod, self.config.data, self.sequence)

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
            from llmtools.formats.mix import MixFile

            if self._mix is None:  # read and checked once for every split
                self._mix = MixFile.read(data.mix)
            if split == "train":
                from llmtools.data.train_streams import TrainStreams

                return self._open_train(TrainStreams.from_mix(self._mix))
            opened = BlendedGPTDataset.from_mix(self._mix, split=split)
            self._check_seq_length(opened.seq_length)
            return self._masking(opened)
        # the plan's arguments: the train split is planned here (its ledger), the others by the dataset
        planned = (
            data.prefixes,
            data.weights or [1.0] * len(data.prefixes),
            data.seq_length,
            samples_for(data.seq_length),
        )
        options = {"seed": data.seed, "split": data.split, "cache_dir": data.cache_dir}
        if split == "train":
            from llmtools.data.mix import plan_prefixes
            from llmtools.data.train_streams import TrainStreams

            plan = plan_prefixes(*planned, **options)
            return self._open_train(TrainStreams.from_mix_plan(plan, "data.prefixes"))
        return self._masking(BlendedGPTDataset.from_prefixes(*planned, **options, split_name=split))

    def _check_seq_length(self, seq_length: int) -> None:
        data = self.config.data
        if data.mix is not None and data.seq_length is not None and data.seq_length != seq_length:
            raise InputError(
                f"{self.where}: data.seq_length={data.seq_length} contradicts seq_length={seq_length} "
                f"of {data.mix}"
            )

    def _open_train(self, plan):
        from llmtools.data.reconcile import open_run_data

        self._check_seq_length(plan.seq_length)
        self._plan = plan
        self._train, _ = open_run_data(plan, None, 0)
        return self._masking(self._train)

    # -- the data ledger ---------------------------------------------------------------------------
    def ledger(self) -> DataLedger | None:
        return self._train

    def resume_data(
        self, saved: dict | None, consumed: int, *, reset: bool, quarantine: list[dict], where: str
    ) -> DataResume:
        from llmtools.data.ledger import Ledger
        from llmtools.data.reconcile import open_run_data

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

        b = self.inputs(batch, device)
        with torch.no_grad():
            logits = model(b.tokens, **b.kwargs).float()
            per_token = F.cross_entropy(logits.flatten(0, 1), b.labels.flatten(), reduction="none")
        per_token = per_token.view(b.labels.shape)
        if b.loss_mask is None:
            return per_token.mean(dim=1).tolist()
        mask = b.loss_mask.to(per_token.dtype)
        return ((per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)).tolist()

    def loss(self, model, batch, device) -> LossOutput:
        b = self.inputs(batch, device)
        return LossOutput(b.loss(model(b.tokens, **b.kwargs)))

    def evaluate(self, model, batch, device, byte_lengths=None) -> tuple[LossOutput, TokenScores]:
        b = self.inputs(batch, device)
        scores = score_tokens(model(b.tokens, **b.kwargs), b.labels, b.loss_mask, byte_lengths=byte_lengths)
        if self.metric_names:  # a task built on this one reports its metrics from its own loss()
            return self.loss(model, batch, device), scores
        return LossOutput(scores.nats / scores.tokens.clamp(min=1.0)), scores
