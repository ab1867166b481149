"""Preference training (``task: dpo``): DPO and its IPO and hinge variants over ``llm-prep pref`` pairs.

``data.prefixes`` names ONE prefix written by ``llm-prep pref`` and ``data.seq_length`` the longest sequence
the model sees (prompt + answer; longer ones are cut). A sample is a pair; pairs are visited in a seeded
random order, epoch after epoch as the run needs. Each micro-batch runs its chosen and rejected sequences
through the model in ONE forward (``2 x micro_batch_size`` rows), and ``log pi(y | x)`` is the sum of the
answer tokens' log-probabilities (where the pref loss mask is 1).

The reference model is the run's starting point. Its log-probabilities are computed ONCE, before the first
step, in one pass over the pairs with the starting weights (with LoRA: the base, adapters switched off),
and stored in the run folder (:mod:`~llmtools.train.tasks.reference`); training then holds no second model.

Losses (``dpo.loss``), with ``h = [log pi(y_w|x) - log ref(y_w|x)] - [log pi(y_l|x) - log ref(y_l|x)]`` for
the chosen answer ``y_w`` and the rejected one ``y_l``, averaged over the pairs of a micro-batch:

* ``sigmoid`` (DPO, Rafailov et al. 2023, eq. 7): ``-log sigmoid(beta h)``; with ``label_smoothing`` eps the
  conservative DPO of Mitchell (2023), ``-(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)``, as
  TRL's ``sigmoid`` loss computed it up to v0.28 (TRL >= 0.29 moved label smoothing to other losses);
* ``ipo`` (Azar et al. 2023, eq. 17): ``(h' - 1 / (2 beta))^2`` where ``h'`` uses log-probabilities averaged
  over each answer's tokens, as TRL does (its authors' normalisation);
* ``hinge`` (SLiC, Zhao et al. 2023): ``max(0, 1 - beta h)``.

Metrics, named as TRL names them: ``rewards/chosen`` and ``rewards/rejected`` (``beta`` x the log-ratio,
mean over pairs), ``rewards/accuracies`` (share of pairs whose chosen reward is higher), ``rewards/margins``
(mean chosen - rejected reward), ``logps/chosen``, ``logps/rejected`` (mean summed log-probabilities).

No torch at import time (the train config imports :class:`DpoSection`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from llmtools.errors import InputError
from llmtools.train.resume_rules import APPLY, NEVER, OTHER_RUN, Rule, config_section, ruled
from llmtools.train.tasks.base import LossOutput, RunContext, Task
from llmtools.train.tasks.sft import EpochOrder

LOSSES = ("sigmoid", "ipo", "hinge")
METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
)


MAX_BETA = 100.0


@config_section(
    whole=Rule(NEVER, "preference settings where the checkpoint had none (another task)", OTHER_RUN)
)
class DpoSection:
    """``dpo:`` in the train config (only with ``task: dpo``): the preference loss and its reference."""

    beta: float = ruled(Rule(APPLY, "the preference loss and rewards use it from the next step on"), 0.1)
    """How far the policy may move from the reference: higher keeps it closer (IPO: the tau of the paper)."""
    loss: Literal["sigmoid", "ipo", "hinge"] = ruled(
        Rule(APPLY, "the preference loss from the next step on"), "sigmoid"
    )
    """sigmoid (DPO), ipo, or hinge (SLiC)."""
    label_smoothing: float = ruled(Rule(APPLY, "the preference loss uses it from the next step on"), 0.0)
    """Assumed share of flipped preference labels, in [0, 0.5) (conservative DPO; sigmoid only)."""
    reference: str | None = ruled(
        Rule(APPLY, "read from there; used only if computed from the run's starting weights and data"),
        None,
        # an input of the run, and where it is read from does not change the weights
        metadata={"input": True, "fingerprint": False},
    )
    """A stored reference folder to use (another run's RUN/reference); refused unless computed from the same
    starting weights, model config, data and seq_length. Default: RUN/reference, computed when missing."""

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise InputError(f"dpo.loss: {self.loss!r} is not one of {', '.join(LOSSES)}")
        if not (math.isfinite(self.beta) and self.beta > 0):
            raise InputError(f"dpo.beta: must be a finite number > 0, got {self.beta}")
        if self.beta > MAX_BETA:
            # beta scales the log-ratio inside a sigmoid: far above this every loss is 0 or inf
            raise InputError(
                f"dpo.beta: {self.beta:g} is out of range: at most {MAX_BETA:g} (usually 0.01 .. 0.5)"
            )
        if not (0.0 <= self.label_smoothing < 0.5):
            raise InputError(f"dpo.label_smoothing: must be in [0, 0.5), got {self.label_smoothing}")
        if self.label_smoothing and self.loss != "sigmoid":
            raise InputError(
                f"dpo.label_smoothing: only with dpo.loss: sigmoid (conservative DPO); loss {self.loss} has none"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "beta": self.beta,
            "loss": self.loss,
            "label_smoothing": self.label_smoothing,
            "reference": self.reference,
        }


# ---------------------------------------------------------------------------------------------------
# The loss
# ---------------------------------------------------------------------------------------------------
def sequence_logps(logits, labels, loss_mask):
    """Per row: the sum of ``log p(label)`` where ``loss_mask`` is 1, in fp32 (logits upcast as the LM
    loss does)."""
    import torch.nn.functional as F

    per_token = -F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none")
    return (per_token.view_as(labels) * loss_mask.to(per_token.dtype)).sum(-1)


def preference_losses(
    chosen_logps,
    rejected_logps,
    ref_chosen_logps,
    ref_rejected_logps,
    *,
    beta: float,
    loss: str = "sigmoid",
    label_smoothing: float = 0.0,
    chosen_tokens=None,
    rejected_tokens=None,
):
    """The loss of every pair (see the module docstring); ``*_tokens`` (answer lengths) are needed by ipo."""
    import torch
    import torch.nn.functional as F

    chosen_ratio = chosen_logps - ref_chosen_logps
    rejected_ratio = rejected_logps - ref_rejected_logps
    if loss == "sigmoid":
        h = beta * (chosen_ratio - rejected_ratio)
        return -(1 - label_smoothing) * F.logsigmoid(h) - label_smoothing * F.logsigmoid(-h)
    if loss == "hinge":
        return torch.relu(1 - beta * (chosen_ratio - rejected_ratio))
    if loss == "ipo":
        if chosen_tokens is None or rejected_tokens is None:
            raise ValueError("the ipo loss needs the answers' token counts")
        h = chosen_ratio / chosen_tokens.clamp(min=1) - rejected_ratio / rejected_tokens.clamp(min=1)
        return (h - 1 / (2 * beta)) ** 2
    raise ValueError(f"unknown preference loss {loss!r} (one of {', '.join(LOSSES)})")


def preference_metrics(
    chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta: float
) -> dict:
    """TRL's metrics of a micro-batch (detached scalar tensors)."""
    import torch

    with torch.no_grad():
        chosen_rewards = beta * (chosen_logps.detach() - ref_chosen_logps)
        rejected_rewards = beta * (rejected_logps.detach() - ref_rejected_logps)
        return {
            "rewards/chosen": chosen_rewards.mean(),
            "rewards/rejected": rejected_rewards.mean(),
            "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean(),
            "rewards/margins": (chosen_rewards - rejected_rewards).mean(),
            "logps/chosen": chosen_logps.detach().mean(),
            "logps/rejected": rejected_logps.detach().mean(),
        }


def to_tensors(batch: dict[str, np.ndarray], device) -> dict:
    import torch

    out = {
        name: torch.from_numpy(np.ascontiguousarray(batch[name])).to(device=device, dtype=torch.long)
        for name in ("tokens", "labels", "loss_mask")
    }
    if "ref_logps" in batch:
        out["ref_logps"] = torch.from_numpy(np.ascontiguousarray(batch["ref_logps"])).to(
            device=device, dtype=torch.float32
        )
    return out


def pair_logps(model, batch: dict[str, np.ndarray], device):
    """``(chosen, rejected)`` summed answer log-probs of a pair batch (chosen rows first), and the tensors."""
    b = to_tensors(batch, device)
    logps = sequence_logps(model(b["tokens"]), b["labels"], b["loss_mask"])
    chosen, rejected = logps.chunk(2)
    return chosen, rejected, b


# ---------------------------------------------------------------------------------------------------
# The data
# ---------------------------------------------------------------------------------------------------
class PrefTrainData:
    """``num_samples`` pairs over an ``llm-prep pref`` prefix; ``batch(indices)`` adds each pair's reference
    log-probs once :meth:`attach_reference` has given them."""

    def __init__(self, prefix: str, seq_length: int, num_samples: int, seed: int = 1234) -> None:
        from llmtools.data.pref_dataset import PrefDataset
        from llmtools.formats.pref_layout import side_prefix
        from llmtools.formats.sidecar import read_sidecar

        self.dataset = PrefDataset(prefix)
        if len(self.dataset) == 0:
            raise InputError(f"{prefix}: holds no preference pairs")
        self.prefix, self.seq_length, self.num_samples = prefix, int(seq_length), int(num_samples)
        cut = self.dataset.unreachable_answers(self.seq_length)
        if cut.size:
            raise InputError(
                f"{prefix}: {cut.size} of {len(self.dataset)} pairs (the first: pair {int(cut[0])}) have no answer "
                f"token within data.seq_length={self.seq_length}: their prompt fills it. Raise data.seq_length, "
                f"or prepare with llm-prep pref --max-length {self.seq_length + 1} (which drops them)"
            )
        sidecar = read_sidecar(f"{side_prefix(prefix, 'chosen')}_input_ids_document")
        self.tokenizer = (sidecar or {}).get("tokenizer")
        self.vocab_size = (self.tokenizer or {}).get("vocab_size")
        self.document_of = EpochOrder(len(self.dataset), seed)
        self.reference: np.ndarray | None = None

    @property
    def pairs(self) -> int:
        return len(self.dataset)

    def __len__(self) -> int:
        return self.num_samples

    def attach_reference(self, logps: np.ndarray) -> None:
        if logps.shape != (self.pairs, 2):
            raise ValueError(f"reference log-probs of shape {logps.shape} for {self.pairs} pairs")
        self.reference = logps

    def pair_batch(self, pairs) -> dict[str, np.ndarray]:
        """The chosen then rejected rows of pairs ``pairs`` (document indices), without reference."""
        return self.dataset.batch(pairs, self.seq_length)

    def batch(self, indices) -> dict[str, np.ndarray]:
        if self.reference is None:
            raise RuntimeError(
                "preference batches need the reference log-probs (Task.prepare was not called)"
            )
        pairs = [self.document_of(i) for i in indices]
        arrays = self.pair_batch(pairs)
        arrays["ref_logps"] = self.reference[pairs]
        return arrays


# ---------------------------------------------------------------------------------------------------
# The task
# ---------------------------------------------------------------------------------------------------
class DpoTask(Task):
    name = "dpo"
    evaluates = False
    metric_names = METRICS
    # what TRL's progress shows of a preference run: how often, and by how much, the chosen answer wins
    line_metrics = (("rewards/accuracies", "reward acc"), ("rewards/margins", "margin"))
    sequences_per_sample = 2
    section = "dpo"
    section_type = DpoSection

    def __init__(self, config) -> None:
        super().__init__(config)
        self.settings: DpoSection = config.task_sections.get(self.section) or DpoSection()
        self.data: PrefTrainData | None = None
        self.reference_weights: str | None = None  # sha256 of the weights the reference was computed from

    @classmethod
    def refuse_resumed_change(cls, key: str, old: Any, new: Any) -> str | None:
        if key == "model.init_from":
            # DPO measures its rewards against a reference computed from the starting weights: refused
            # here, before that reference is computed or config.yaml rewritten
            return (
                "a DPO run's reference was computed from the weights it started from: resume with "
                f"model.init_from {old!r}, or {OTHER_RUN} with the new starting weights"
            )
        return None

    def open_data(self, split: str, samples_for: Callable[[int], int]) -> PrefTrainData:
        """The one ``llm-prep pref`` prefix, cycled for as many pairs as the run needs."""
        data = self.config.data
        if data.mix is not None or len(data.prefixes) != 1:
            raise InputError(
                f"{self.where}: data: task dpo reads one prefix written by llm-prep pref: "
                "data.prefixes: [PREFIX] and data.seq_length (no data.mix)"
            )
        if data.document_masking:
            raise InputError(
                f"{self.where}: data.reset_position_ids/reset_attention_mask/eod_mask_loss: pretraining only "
                "(its rows are single pairs, never packed)"
            )
        seq_length = int(data.seq_length)
        self.data = PrefTrainData(data.prefixes[0], seq_length, samples_for(seq_length), seed=data.seed)
        return self.data

    def prepare(self, model, run: RunContext) -> None:
        """The reference log-probs: reloaded when stored for exactly these starting weights and data, else
        computed in one pass and stored in ``RUN/reference``."""
        from llmtools.train.tasks.reference import reference_logps

        logps, self.reference_weights = reference_logps(
            model, self.data, run, lora=self.config.lora is not None, stored=self.settings.reference
        )
        self.data.attach_reference(logps)

    def loss(self, model, batch: dict[str, np.ndarray], device) -> LossOutput:
        s = self.settings
        chosen, rejected, b = pair_logps(model, batch, device)
        ref_chosen, ref_rejected = b["ref_logps"].unbind(-1)
        chosen_tokens, rejected_tokens = b["loss_mask"].sum(-1).chunk(2)
        losses = preference_losses(
            chosen,
            rejected,
            ref_chosen,
            ref_rejected,
            beta=s.beta,
            loss=s.loss,
            label_smoothing=s.label_smoothing,
            chosen_tokens=chosen_tokens,
            rejected_tokens=rejected_tokens,
        )
        metrics = preference_metrics(chosen, rejected, ref_chosen, ref_rejected, s.beta)
        return LossOutput(losses.mean(), metrics)

    def state_dict(self) -> dict[str, Any]:
        return {"reference_weights": self.reference_weights}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A checkpoint trained against a reference from other starting weights (an ``init_from`` changed
        since) cannot continue: its rewards would be measured against another model."""
        saved = state.get("reference_weights")
        if saved is not None and self.reference_weights is not None and saved != self.reference_weights:
            raise InputError(
                f"{self.where}: the checkpoint was trained against a reference computed from starting weights "
                f"sha256 {saved[:12]}, but this run starts from {self.reference_weights[:12]} "
                "(model.init_from or the model changed): resume with the weights it started from"
            )
