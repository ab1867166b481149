"""The interface every training task implements; the trainer knows tasks only through it.

A task answers four questions, and nothing else about it is visible to the loop:

- **its data**: :meth:`Task.open_data` opens one split as a :class:`TaskData`, an object that carries
  its own ``seq_length``, tokenizer identity and vocabulary size and hands out host-side batches
  (``batch(indices)``). The sequence length is the data's: the trainer reads it from there and nowhere
  else. How many samples a run needs depends on that length when the run is given in tokens, so the
  trainer passes ``samples_for(seq_length) -> int`` and the task asks it once it knows the length.
- **the loss of a micro-batch**: :meth:`Task.loss` runs the model on one batch and returns a
  :class:`LossOutput`: the scalar to back-propagate and the task's own metrics (scalar tensors).
- **the metrics it adds**: :attr:`Task.metric_names`, the keys of ``LossOutput.metrics``; the trainer
  averages them over micro-batches, ranks and the logging window into the train records.
- **what evaluation scores**: :meth:`Task.evaluate` returns, besides the loss, the :class:`TokenScores`
  of a language-modelling task (sums over its scored tokens: count, nats, top-1 hits, bytes), from
  which the eval record's token-weighted loss, perplexity, token accuracy and bits per byte are made;
  a task that scores no tokens (a preference loss) returns none and is evaluated on its loss alone.
- **its client state**: :meth:`Task.state_dict` / :meth:`Task.load_state_dict`, saved with every
  checkpoint and given back on resume.
- optionally, **a data ledger** (:meth:`Task.ledger`): a task whose data is a blend of sources keeps
  one cursor per source. Then the trainer records the ledger in every checkpoint and the tokens per
  source in ``metrics.jsonl``, lets the task pick its data up on resume (:meth:`Task.resume_data`,
  which may continue a changed mix), and quarantines the samples of a batch that trips the health gate
  (:meth:`DataLedger.describe`, :meth:`Task.sample_losses`).
- **work before the first step** (optional): :meth:`Task.prepare` is called once on every rank with the
  run's starting weights, after the engine is built and before a checkpoint is loaded into it. The
  preference task computes (or reloads) its reference log-probabilities there, in one pass over its data.

The preference task (``task: dpo``) opens paired chosen/rejected data whose ``batch()`` also returns the
reference log-probabilities :meth:`Task.prepare` attached to it, computes its loss from both halves, and
reports its rewards and margins as metrics, all without a change to the trainer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol

if TYPE_CHECKING:
    from llmtools.train.config import TrainConfig


class TaskData(Protocol):
    """One split of a task's data, as the trainer sees it."""

    seq_length: int
    """Tokens per sample the model sees (its inputs; the labels are shifted by one)."""
    tokenizer: dict | None
    """The tokenizer identity recorded beside the data (a sidecar's ``tokenizer``), or None."""
    vocab_size: int | None
    """The tokenizer's vocabulary size, checked against the model's embedding; None when unknown."""

    def __len__(self) -> int: ...

    def batch(self, indices) -> Any:
        """Host-side arrays of samples ``indices``, in the form the task's :meth:`Task.loss` takes."""
        ...


class DataLedger(Protocol):
    """The per-source accounting of a task's train data (see :mod:`llmtools.data.ledger`)."""

    run: str | None
    """The run's id (kept in the ledger; a new run gets one before its first checkpoint)."""

    def state(self, position: int, step: int | None = None) -> dict:
        """The ledger when ``position`` samples have been consumed (kept in every checkpoint)."""
        ...

    def consumed_tokens(self, position: int) -> dict[str, int]:
        """Tokens consumed from each source up to ``position`` (metrics.jsonl)."""
        ...

    def describe(self, positions) -> list[dict]:
        """The samples at ``positions``: source, stream position, documents with token offsets."""
        ...


class DataResume(NamedTuple):
    """What :meth:`Task.resume_data` decided: the train data from the resumed position on, the lines to
    print, and a metrics event's fields (None: nothing worth an event)."""

    data: Any
    lines: list[str]
    event: dict | None


class LossOutput(NamedTuple):
    """The loss of one micro-batch and the task's metrics for it (scalar tensors, not detached)."""

    loss: Any
    metrics: dict[str, Any] = {}


class TokenScores(NamedTuple):
    """Sums over the scored tokens of one micro-batch (0-dim tensors): the number of tokens, their
    cross-entropy in nats, the top-1 hits, and the UTF-8 bytes they stand for (None when unknown)."""

    tokens: Any
    nats: Any
    correct: Any
    bytes: Any = None


def score_tokens(logits, labels, mask=None, byte_lengths=None) -> TokenScores:
    """:class:`TokenScores` of next-token predictions ``logits`` for ``labels`` (where ``mask`` is 1)."""
    import torch.nn.functional as F

    flat_labels = labels.flatten()
    flat_logits = logits.flatten(0, 1)
    nats = F.cross_entropy(flat_logits.float(), flat_labels, reduction="none")
    hits = flat_logits.argmax(dim=-1) == flat_labels
    if mask is None:
        keep = None
        count = nats.new_tensor(float(flat_labels.numel()))
    else:
        keep = mask.flatten().to(nats.dtype)
        nats, hits, count = nats * keep, hits & (keep > 0), keep.sum()
    scored_bytes = None
    if byte_lengths is not None:
        per_token = byte_lengths[flat_labels].to(nats.dtype)
        scored_bytes = (per_token if keep is None else per_token * keep).sum()
    return TokenScores(count, nats.sum(), hits.sum().to(nats.dtype), scored_bytes)


@dataclass(frozen=True)
class RunContext:
    """What :meth:`Task.prepare` may know about the run: where it writes, who this rank is, how to say so."""

    run_dir: Path
    rank: int
    world_size: int
    device: str
    micro_batch_size: int
    log: Callable[[str], None]
    """A line on stderr from rank 0 (silent with --quiet)."""
    quiet: bool = False


class Task(ABC):
    """One kind of training (pretraining, SFT, ...): its data, its loss, its metrics, its state."""

    name: ClassVar[str]
    """What ``task:`` in the train config says to pick this task."""
    evaluates: ClassVar[bool] = True
    """Whether the task has a valid split to evaluate on (``eval.every``)."""
    metric_names: ClassVar[tuple[str, ...]] = ()
    """The keys of :attr:`LossOutput.metrics`: added to the train (and eval) records."""
    per_source: ClassVar[bool] = False
    """Whether its valid samples are a source's text, so ``eval.per_source`` can score each source."""
    line_metrics: ClassVar[tuple[tuple[str, str], ...]] = ()
    """``(key, label)`` of the metrics also shown on the stderr step line, in this order."""
    sequences_per_sample: ClassVar[int] = 1
    """Sequences of ``seq_length`` tokens the model runs per sample (a preference pair: 2); tokens per step
    and throughput count them all."""
    section: ClassVar[str | None] = None
    """The task's own section of the train config (``dpo:``), allowed only with this task."""
    section_type: ClassVar[type | None] = None
    """The dataclass of that section (its fields declare their resume rules, llmtools.train.resume_rules)."""

    def __init__(self, config: TrainConfig) -> None:
        self.config = config

    @classmethod
    def refuse_resumed_change(cls, key: str, old: Any, new: Any) -> str | None:
        """Why a resumed run of this task cannot take a config change the resume rules allow, with the way
        out (the message's tail after the key and both values); None: it can."""
        return None

    @property
    def where(self) -> str:
        """The train config's file, for error messages."""
        return self.config.source or "<train config>"

    @abstractmethod
    def open_data(self, split: str, samples_for: Callable[[int], int]) -> TaskData:
        """Open ``split`` ("train" or "valid"), with at least ``samples_for(seq_length)`` samples when
        the data can be sized (a mix is what it is: the trainer checks its length). Raises InputError
        naming the file and key."""

    @abstractmethod
    def loss(self, model, batch, device) -> LossOutput:
        """The loss of one micro-batch through ``model`` (a module or a DeepSpeed engine)."""

    def evaluate(self, model, batch, device, byte_lengths=None) -> tuple[LossOutput, TokenScores | None]:
        """The loss of one valid micro-batch (no gradients), and the :class:`TokenScores` of a task that
        predicts tokens; ``byte_lengths`` (a tensor over the vocabulary, or None) counts their bytes."""
        return self.loss(model, batch, device), None

    def prepare(self, model, run: RunContext) -> None:  # noqa: B027 - nothing to do unless overridden
        """Once, on every rank, before the first step: ``model`` (the engine) holds the run's starting
        weights (a checkpoint to resume from is loaded only afterwards). May compute over the opened data;
        every rank must make the same collective calls."""

    def state_dict(self) -> dict[str, Any]:
        """What the task needs to continue exactly after a resume (kept in each checkpoint)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 - stateless unless overridden
        """Take back what :meth:`state_dict` returned when the checkpoint was saved."""

    def ledger(self) -> DataLedger | None:
        """The train data's per-source ledger, when the task keeps one (None: resumes compare the data's
        fingerprint instead)."""
        return None

    def resume_data(
        self, saved: dict | None, consumed: int, *, reset: bool, quarantine: list[dict], where: str
    ) -> DataResume:
        """Continue the train data from a checkpoint's ledger ``saved`` (None: it has none) at ``consumed``
        samples; only called when :meth:`ledger` is not None. InputError when it cannot."""
        raise NotImplementedError(f"task {self.name} keeps no data ledger")

    def sample_losses(self, model, batch, device) -> list[float] | None:
        """The loss of each sample of a micro-batch (no gradients), to find the samples that made a step's
        loss non-finite; None when the task cannot tell them apart (the whole batch is quarantined)."""
        return None
