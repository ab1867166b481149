"""The parts of a training run that a checkpoint keeps, and the table of them (:func:`run_state`).

Each part saves and takes back its own entries of the client state DeepSpeed pickles
(:class:`llmtools.ckpt.state.RunState` merges them; the entry names and values are the checkpoint
format, unchanged). A new checkpointed part is a class with ``state_dict()`` / ``load_state_dict()``
(and a ``summary()`` when meta.json should show it) plus one entry in :func:`run_state`.

Where each part is read back on resume, once: progress, the task, the health gate, the tracker ids from
the client state (:meth:`RunState.load_state_dict`); the data ledger from meta.json, before any compute
(:mod:`llmtools.train.data_part`); the RNG states from the rank's own RNG file (the checkpoint
manager's); the quarantine from ``RUN/quarantine.jsonl``. The config, the model and tokenizer identity,
the LoRA settings and the expert-parallel layout are records of what was trained: the resume policy and
``llm-ckpt`` read them from meta.json, nothing loads them back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmtools.ckpt.state import RunState
from llmtools.formats import jsonfile

if TYPE_CHECKING:
    from llmtools.train.health import HealthGate
    from llmtools.train.plan import TrainPlan


@dataclass
class Progress:
    """How far the run has come: the last finished step and the data it consumed (kept in checkpoints)."""

    step: int = 0
    consumed_samples: int = 0
    consumed_tokens: int = 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "consumed_samples": self.consumed_samples,
            "consumed_tokens": self.consumed_tokens,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state.get("step", 0))
        self.consumed_samples = int(state.get("consumed_samples", 0))
        self.consumed_tokens = int(state.get("consumed_tokens", 0))


def data_fingerprint(plan: TrainPlan) -> str:
    """The data config's identity: without a ledger, a resume on other data needs --reset-data."""
    data = plan.config.data
    return jsonfile.dumps(
        {
            "mix": data.mix,
            "prefixes": data.prefixes,
            "weights": data.weights,
            "seq_length": plan.seq_length,
            "seed": data.seed,
            "split": data.split,
        },
        sort_keys=True,
    )


class _Record:
    """Entries that say what was trained (read from meta.json by the resume policy and ``llm-ckpt``);
    nothing is loaded back from them."""

    def __init__(self, entries: dict[str, Any]) -> None:
        self.entries = entries

    def state_dict(self) -> dict[str, Any]:
        return dict(self.entries)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def run_identity(plan: TrainPlan, resolved: dict | None) -> _Record:
    """The config, model and tokenizer a checkpoint is of, and its data's fingerprint."""
    return _Record(
        {
            "config_hash": plan.config.fingerprint(),
            "model": plan.model_config.to_dict(),
            "tokenizer": plan.tokenizer,
            "data_fingerprint": data_fingerprint(plan),
            "config": resolved,  # what a resume compares its config with
        }
    )


class _TaskState:
    """The task's own state (e.g. the reference a DPO run is measured against)."""

    def __init__(self, task) -> None:
        self.task = task

    def state_dict(self) -> dict[str, Any]:
        return {"task_state": self.task.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.task.load_state_dict(state.get("task_state") or {})


class _Trackers:
    """The W&B / MLflow runs a resume continues."""

    def __init__(self, trackers) -> None:
        self.trackers = trackers

    def state_dict(self) -> dict[str, Any]:
        return {"trackers": self.trackers.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.trackers.load_state_dict(state.get("trackers"))


class _Health:
    """The spike medians and the skip count: they decide the next updates (and what is quarantined)."""

    def __init__(self, gate: HealthGate, where: str) -> None:
        self.gate, self.where = gate, where

    def state_dict(self) -> dict[str, Any]:
        return {"health_state": self.gate.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # a checkpoint saved before the gate's state was kept: its windows fill up again
        self.gate.load_state_dict(state.get("health_state") or {}, f"{self.where}[health_state]")


class _DataLedger:
    """Where every source of the task's data continues (a task whose data keeps no ledger: nothing).
    Read back from meta.json[data][ledger], before compute, not from here."""

    def __init__(self, task, progress: Progress) -> None:
        self.task, self.progress = task, progress

    def state_dict(self) -> dict[str, Any]:
        ledger = self.task.ledger()
        if ledger is None:
            return {}
        return {"data_ledger": ledger.state(self.progress.consumed_samples, self.progress.step)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def summary(self, client_state: dict[str, Any]) -> dict[str, Any]:
        return {"data": {"ledger": client_state.get("data_ledger")}}


class _TensorLayout:
    """How a tensor-parallel run's weights are cut into shards (meta.json only: ``llm-ckpt convert`` puts
    the shards back together from it; nothing is loaded back)."""

    def __init__(self, layout: dict | None) -> None:
        self.layout = layout

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def summary(self, client_state: Mapping[str, Any]) -> dict[str, Any]:
        return {"tensor_parallel": self.layout} if self.layout else {}


def run_state(
    plan: TrainPlan,
    progress: Progress,
    gate: HealthGate,
    trackers,
    resolved: dict | None,
    where: str = "",
    tensor_layout: dict | None = None,
) -> RunState:
    """The table of a run's checkpointed parts, in the order their entries are saved."""
    cfg = plan.config
    return RunState(
        {
            "progress": progress,
            "identity": run_identity(plan, resolved),
            # llm-ckpt convert merges the adapters (or writes them alone) from this record
            "lora": _Record({"lora": cfg.lora.to_dict() if cfg.lora is not None else None}),
            "task": _TaskState(plan.task),
            "trackers": _Trackers(trackers),
            "health": _Health(gate, where),
            # the checkpoint holds DeepSpeed's expert-parallel layout (resume and llm-ckpt read it)
            "expert_parallel": _Record({"expert_parallel": cfg.model.expert_parallel}),
            "data_ledger": _DataLedger(plan.task, progress),
            "tensor_parallel": _TensorLayout(tensor_layout),
        }
    )
