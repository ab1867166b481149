"""The run's data part: how the task's train data starts, continues from a checkpoint, shows in the train
records and passes over quarantined samples (:func:`data_part` picks it for the task).

A task whose data keeps a ledger (pretraining: one cursor per source, :mod:`llmtools.data.ledger`) gets
:class:`LedgerData`: on resume it picks its data up from the checkpoint's ledger (continuing a changed
mix, or refusing one it cannot continue, before any compute); its tokens per source are in every train
record; and when the health gate trips, the offending samples are appended to ``RUN/quarantine.jsonl``
and the run passes over their documents from there on (as a resume would). Any other task's data
(:class:`PlainData`) continues by the global sample position alone, its fingerprint guarding a resume.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from llmtools.ckpt import dist, layout
from llmtools.ckpt.request import ResumeRequest
from llmtools.ckpt.verify import read_meta
from llmtools.errors import InputError
from llmtools.formats.quarantine import make_record, quarantine_path, read_records
from llmtools.train.plan import TrainPlan, check_data_length
from llmtools.train.state import data_fingerprint


def _steps_done(reset_data: bool, meta: dict) -> int | None:
    """With --reset-data, the steps the checkpoint trained (the data restarts for the steps left)."""
    step = meta.get("step")
    if not reset_data or not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return None
    return step


class PlainData:
    """Train data without a ledger: nothing to decide before compute but its length, nothing recorded
    per source, no samples to quarantine."""

    keeps_ledger = False
    """Whether the data keeps per-source cursors (a resume then continues a changed mix by its rules)."""
    quarantines = False
    """Whether a tripped health gate names samples to pass over (the data can tell them apart)."""

    def __init__(self, plan: TrainPlan, run_dir: Path, reset_data: bool) -> None:
        self.plan, self.run_dir, self.reset_data = plan, run_dir, reset_data
        self.quarantine_records: list[dict] = []  # the run's records (the checkpoint's, and every one since)

    def precheck(self, request: ResumeRequest | None, force: bool) -> None:
        """Before torch: how a resumed run's data continues (a mix it cannot continue, a quarantine file
        of another run, data too short for the steps: exit 2 in about a second), and the data's length."""
        plan = self.plan
        path = (
            request.likely_checkpoint(layout.checkpoints_dir(self.run_dir)) if request is not None else None
        )
        meta = None
        if path is not None:
            try:
                meta = read_meta(path)
            except InputError:
                meta = None  # the manager names what is wrong with it when it resolves --resume
        if meta is None or meta.get("init_only"):
            if not force:  # --force: rank 0 has removed (or removes) the file
                self._refuse_a_foreign_quarantine()
            if request is not None:
                check_data_length(plan.config, plan.train_data, plan.steps)
            return
        decided = self._decide(Path(path), meta)
        if decided is not None:
            plan.data_resume = (Path(path), decided)
            plan.train_data = decided.data
        check_data_length(plan.config, plan.train_data, plan.steps, done=_steps_done(self.reset_data, meta))

    def _refuse_a_foreign_quarantine(self) -> None:
        pass

    def _decide(self, path: Path, meta: dict):
        return None

    def start(self) -> None:
        """A fresh run's data, before its first step."""

    def resume(self, path: Path):
        """The data continued from checkpoint ``path``, once it has loaded; the decision to announce
        (:class:`~llmtools.train.tasks.base.DataResume`), or None."""
        return None

    def record(self, consumed_samples: int) -> dict[str, Any]:
        """What a train record shows of the data at ``consumed_samples``."""
        return {}


class LedgerData(PlainData):
    """Train data whose ledger keeps one cursor per source (see the module docstring)."""

    keeps_ledger = True
    quarantines = True

    @property
    def ledger(self):
        return self.plan.task.ledger()

    def _refuse_a_foreign_quarantine(self) -> None:
        where = quarantine_path(self.run_dir)
        if read_records(where, None):
            raise InputError(
                f"{where}: holds quarantine records, but this run starts afresh: a quarantine file "
                "of another run (--force starts over and removes it)"
            )

    def _decide(self, path: Path, meta: dict):
        """The task's decision on continuing its data from checkpoint ``path`` (whose meta.json is
        ``meta``): the ledger is read from there, before any compute, and from nowhere else."""
        plan = self.plan
        data = meta.get("data") if isinstance(meta.get("data"), dict) else {}
        saved = data.get("ledger")
        consumed = meta.get("consumed_samples") or 0
        if not isinstance(consumed, int) or consumed < 0:
            raise InputError(f"{path}/meta.json[consumed_samples]: expected an integer >= 0")
        run = saved.get("run") if isinstance(saved, dict) and isinstance(saved.get("run"), str) else None
        records = read_records(quarantine_path(self.run_dir), run, whose=f"the checkpoint {path.name}")
        if saved is None and not self.reset_data:
            # Saved before checkpoints kept a ledger: no cursors, so only the same data can continue.
            current, before = data_fingerprint(plan), data.get("fingerprint")
            if before is not None and before != current:
                raise InputError(
                    f"{path}/meta.json[data]: the checkpoint was trained on data {before}, the config "
                    f"now has {current}, and it keeps no per-source cursors (it was saved by an older "
                    "llmtools); pass --reset-data to continue the step count and schedule on the new data "
                    "from its beginning"
                )
        return plan.task.resume_data(
            saved,
            consumed,
            reset=self.reset_data,
            quarantine=records,
            where=f"{path}/meta.json[data.ledger]",
        )

    def _name_run(self, ledger) -> None:
        """A run's id, the same on every rank (kept in its data ledger and its quarantine records)."""
        if ledger.run is None:
            ledger.run = dist.broadcast(uuid.uuid4().hex if dist.rank() == 0 else None)

    def start(self) -> None:
        self._name_run(self.ledger)

    def resume(self, path: Path):
        """The task's data from the checkpoint's ledger (decided before compute when it is the checkpoint
        the precheck read)."""
        plan = self.plan
        if plan.data_resume is not None and plan.data_resume[0] == path:
            decided = plan.data_resume[1]
        else:
            meta = read_meta(path)
            decided = self._decide(path, meta)
            check_data_length(plan.config, decided.data, plan.steps, done=_steps_done(self.reset_data, meta))
        plan.train_data = decided.data
        self._name_run(decided.data)
        self.quarantine_records = read_records(quarantine_path(self.run_dir), decided.data.run)
        return decided

    def record(self, consumed_samples: int) -> dict[str, Any]:
        return {"source_tokens": self.ledger.consumed_tokens(consumed_samples)}

    def quarantine_samples(
        self, losses: dict[int, float | None], step: int, rank: int, reason: str, note: str
    ):
        """This rank's offending samples (positions -> their own loss, None when not finite) described by
        the ledger, as the records of every rank (collective)."""
        from llmtools.train.distributed import gather_objects

        ledger = self.ledger
        samples = ledger.describe(sorted(losses))
        for sample in samples:
            sample["loss"] = losses[sample["position"]]
        gathered = gather_objects(samples)
        return [
            make_record(ledger.run, step, found_rank, reason, found, note)
            for found_rank, found in enumerate(gathered)
            if found
        ]

    def pass_over(self, records: list[dict], step: int, position: int):
        """The quarantine takes effect at once, on every rank, exactly as a resume from this step would
        apply it (the same ledger, the same records): an interrupted run and an uninterrupted one read
        the same samples. Returns the decision to announce; ExhaustedSource when a source has nothing left."""
        self.quarantine_records.extend(records)
        decided = self.plan.task.resume_data(
            self.ledger.state(position, step),
            position,
            reset=False,
            quarantine=self.quarantine_records,
            where=f"{quarantine_path(self.run_dir)} (step {step})",
        )
        self.plan.train_data = decided.data
        return decided


def data_part(plan: TrainPlan, run_dir: Path, reset_data: bool) -> PlainData:
    """The data part the run's task needs: with a ledger, or without."""
    kind = LedgerData if plan.task.ledger() is not None else PlainData
    return kind(plan, run_dir, reset_data)
