"""Supervised fine-tuning (``task: sft``): the masked next-token loss over ``llm-prep sft`` data.

``data.prefixes`` names ONE prefix written by ``llm-prep sft`` (``PREFIX_input_ids_document`` ...) and
``data.seq_length`` the tokens per sample. Samples are the prep's documents (one conversation, or one
packed sequence with ``--pack``), visited in a seeded random order, epoch after epoch as the run needs.
The loss is the next-token cross-entropy where the loss mask is 1 (assistant tokens), averaged over
those tokens of the micro-batch. Packed sequences pass their segment ids and restarting position ids
to the model, which then attends only within each sample. There is no valid split yet.

No torch at import time (the train config checks ``task:`` against the table of tasks).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from llmtools.errors import InputError
from llmtools.train.tasks.base import LossOutput, Task, TokenScores, score_tokens


class EpochOrder:
    """Sample ``i`` -> document, over ``n`` documents visited epoch after epoch, each epoch in a fresh seeded
    permutation (the same on every rank)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = int(n), seed
        self._epochs: dict[int, np.ndarray] = {}

    def __call__(self, i: int) -> int:
        epoch, offset = divmod(int(i), self.n)
        order = self._epochs.get(epoch)
        if order is None:
            order = np.random.default_rng([self.seed, epoch]).permutation(self.n)
            self._epochs[epoch] = order
        return int(order[offset])


class SftTrainData:
    """``num_samples`` samples over an SFT prefix: ``batch(indices)`` -> the arrays of SftDataset.batch."""

    def __init__(self, prefix: str, seq_length: int, num_samples: int, seed: int = 1234) -> None:
        from llmtools.data.sft_dataset import SftDataset
        from llmtools.formats.sidecar import read_sidecar

        self.dataset = SftDataset(prefix)
        if len(self.dataset) == 0:
            raise InputError(f"{prefix}_input_ids_document: holds no samples")
        self.prefix, self.seq_length, self.num_samples, self.seed = (
            prefix,
            int(seq_length),
            int(num_samples),
            seed,
        )
        sidecar = read_sidecar(f"{prefix}_input_ids_document")
        self.tokenizer = (sidecar or {}).get("tokenizer")
        self.vocab_size = (self.tokenizer or {}).get("vocab_size")
        self.document_of = EpochOrder(len(self.dataset), seed)

    @property
    def packed(self) -> bool:
        return self.dataset.packed

    def __len__(self) -> int:
        return self.num_samples

    def batch(self, indices) -> dict[str, np.ndarray]:
        arrays = self.dataset.batch([self.document_of(i) for i in indices], self.seq_length)
        if not self.packed:  # one sample per row: plain causal attention and default positions
            del arrays["position_ids"], arrays["segment_ids"]
        return arrays


def masked_loss(logits, labels, loss_mask):
    """``sum(ce * mask) / sum(mask)`` in fp32 (0 when the micro-batch has no masked-in token)."""
    import torch.nn.functional as F

    ce = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none")
    mask = loss_mask.flatten().to(ce.dtype)
    return (ce * mask).sum() / mask.sum().clamp(min=1.0)


def to_tensors(batch: dict[str, np.ndarray], device, packed: bool) -> dict:
    import torch

    def t(name):
        return torch.from_numpy(np.ascontiguousarray(batch[name])).to(device=device, dtype=torch.long)

    out = {"tokens": t("tokens"), "labels": t("labels"), "loss_mask": t("loss_mask")}
    if packed:  # unpacked rows are one sample each: plain causal attention, default positions
        out["position_ids"], out["segment_ids"] = t("position_ids"), t("segment_ids")
    return out


class SftTask(Task):
    name = "sft"
    evaluates = False

    def open_data(self, split: str, samples_for: Callable[[int], int]) -> SftTrainData:
        """The one ``llm-prep sft`` prefix, cycled for as many samples as the run needs."""
        data = self.config.data
        if data.mix is not None or len(data.prefixes) != 1:
            raise InputError(
                f"{self.where}: data: task sft reads one prefix written by llm-prep sft: "
                "data.prefixes: [PREFIX] and data.seq_length (no data.mix)"
            )
        if data.document_masking:
            raise InputError(
                f"{self.where}: data.reset_position_ids/reset_attention_mask/eod_mask_loss: pretraining only "
                "(packed samples are kept apart by the segment ids llm-prep sft --pack wrote)"
            )
        seq_length = int(data.seq_length)
        return SftTrainData(data.prefixes[0], seq_length, samples_for(seq_length), seed=data.seed)

    def loss(self, model, batch: dict[str, np.ndarray], device) -> LossOutput:
        """The masked loss of one micro-batch (packed rows carry their segment and position ids)."""
        packed = "segment_ids" in batch
        b = to_tensors(batch, device, packed)
        kwargs = {"position_ids": b["position_ids"], "segment_ids": b["segment_ids"]} if packed else {}
        logits = model(b["tokens"], **kwargs)
        return LossOutput(masked_loss(logits, b["labels"], b["loss_mask"]))

    def evaluate(self, model, batch, device, byte_lengths=None) -> tuple[LossOutput, TokenScores]:
        """The scores of the masked-in (assistant) tokens."""
        packed = "segment_ids" in batch
        b = to_tensors(batch, device, packed)
        kwargs = {"position_ids": b["position_ids"], "segment_ids": b["segment_ids"]} if packed else {}
        scores = score_tokens(model(b["tokens"], **kwargs), b["labels"], b["loss_mask"], byte_lengths)
        if self.metric_names:  # a task built on this one reports its metrics from its own loss()
            return self.loss(model, batch, device), scores
        return LossOutput(scores.nats / scores.tokens.clamp(min=1.0)), scores
