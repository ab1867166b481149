"""Experiment trackers (W&B, MLflow) as metrics sinks: ``log(record, step)`` and ``close()``.

Each goes through its own library (the extra ``track``), offline first: W&B in offline mode into
``FOLDER/wandb`` unless ``WANDB_MODE`` says otherwise (``wandb sync`` uploads it later), MLflow into
``FOLDER/mlruns`` unless a tracking URI is given.

Once per timeline. A tracker run is named by its id (:class:`TrackerState`, kept with the checkpoint
or in ``llm-log``'s state); reopening it reads back, through the library's own reader, the training
step of the value each metric logged last, and records at or before it are dropped. A run that
continues from an earlier step (a rollback, or a replay after a kill) marks the later steps the tracker
has as superseded (:func:`mark_superseded`) and logs the new timeline's values at those steps again:
W&B plots against the training step (:data:`WANDB_STEP`) while its own ``_step`` keeps growing, MLflow
takes another value at a step it has; the value logged last at a step is the run's.
Events (``kind: event``) are keyed by step and name (W&B summary keys, MLflow tags), so a replayed event
replaces itself.

A tracker that fails while the run goes on (unreachable server, disk full) costs a warning and is
switched off; training never stops for it. What can be known before compute (an unknown name, a
library that is not installed) is :func:`check_available`'s business.
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmtools.dirfd import make_folder
from llmtools.errors import InputError
from llmtools.formats import jsonfile

TRACKERS = ("wandb", "mlflow")
# The training step as a W&B metric, every other metric's x axis (as HF Trainer does): W&B's own _step
# only grows, and a step logged again after a rollback gets a later _step at the same training step.
WANDB_STEP = "train/global_step"
SKIP = {"kind", "step", "time", "event", "message", "skipped"}
# A failing remote tracker must not hold a step for minutes: one try, a short timeout (MLflow's own
# defaults retry 7 times with backoff), unless the user set them.
MLFLOW_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def check_available(names: list[str], where: str) -> None:
    """Every tracker in ``names`` is known and its library installed (before any compute)."""
    for name in names:
        if name not in TRACKERS:
            continue  # tensorboard and unknown names are the config's business
        if importlib.util.find_spec(name) is None:
            raise InputError(
                f"{where}: {name} is not installed; pip install 'llmtools[track]' (or drop it from the list)"
            )


# The stores MLflow opens by a URI's scheme (a path has none); the SQL ones need the full mlflow
# (SQLAlchemy), where mlflow-skinny refuses them when it starts.
MLFLOW_SCHEMES = ("file", "http", "https", "databricks", "sqlite", "postgresql", "mysql", "mssql")
SQL_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")


def tracking_uri_problem(uri: str) -> str | None:
    """What is wrong with an MLflow tracking URI, as far as can be told without reaching it; None if
    nothing (an unreachable server is found later, and costs a warning)."""
    from urllib.parse import urlsplit

    if not uri.strip():
        return "empty; give a server (http://host:port), a folder or a file: URI"
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if not scheme:  # a path
        return None
    base = scheme.split("+", 1)[0]  # postgresql+psycopg2: SQLAlchemy's dialect+driver
    if base not in MLFLOW_SCHEMES:
        return (
            f"{uri!r}: unsupported scheme {scheme!r} (expected one of {', '.join(MLFLOW_SCHEMES)}, or a path)"
        )
    if base in ("http", "https") and not parts.hostname:
        return f"{uri!r}: no host"
    if base in SQL_SCHEMES and importlib.util.find_spec("sqlalchemy") is None:
        return f"{uri!r}: a SQL store needs the full mlflow (pip install mlflow), not mlflow-skinny"
    return None


def check_tracking_uri(uri: str | None, where: str) -> None:
    """``uri`` (when given) is a tracking URI MLflow can open, before any compute."""
    problem = None if uri is None else tracking_uri_problem(uri)
    if problem:
        raise InputError(f"{where}: {problem}")


def scalars(record: dict) -> dict[str, float]:
    """A record's numbers as ``{kind}/{name}`` (``{kind}/{group}/{member}`` for a group), the names
    TensorBoard gets."""
    kind = record.get("kind", "train")
    out: dict[str, float] = {}

    def put(tag: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return
        if isinstance(value, float) and not math.isfinite(value):
            return
        out[tag] = float(value)

    for key, value in record.items():
        if isinstance(value, dict):
            for member, item in value.items():
                put(f"{kind}/{key}/{member}", item)
        elif key not in SKIP:
            put(f"{kind}/{key}", value)
    return out


def flatten(config: dict, prefix: str = "") -> dict[str, str]:
    """``{section: {key: v}}`` -> ``{"section.key": "v"}`` (MLflow params are flat strings)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = jsonfile.dumps(value) if not isinstance(value, str) else value
    return out


class TrackerWarning(str):
    """The line a failing tracker warns with (``warning: NAME: ... failed (...); reporting to NAME stops
    here``); ``failure`` is what failed without the level, for a caller that reports it as an error
    (one level per line: never "error: ... warning: ...")."""

    failure: str

    def __new__(cls, failure: str, name: str) -> TrackerWarning:
        line = super().__new__(cls, f"warning: {failure}; reporting to {name} stops here")
        line.failure = failure
        return line


class TrackerState:
    """The ids of the tracker runs a training run reports to: a stateful part saved with each checkpoint,
    so that a resumed run continues the same tracker runs."""

    def __init__(self) -> None:
        self.ids: dict[str, str] = {}

    def state_dict(self) -> dict[str, str]:
        return dict(self.ids)

    def load_state_dict(self, state: dict | None) -> None:
        self.ids = {k: v for k, v in (state or {}).items() if k in TRACKERS and isinstance(v, str)}


class Tracker:
    """What both trackers share: the per-metric last step (exactly once), event keys, and switching
    itself off with a warning when its library fails."""

    name = "tracker"

    def __init__(self, warn: Callable[[str], None]) -> None:
        self.warn = warn
        self.alive = True
        self.last: dict[str, int] = {}  # metric -> last step the tracker run already has
        self._event_counts: dict[tuple[int, str], int] = {}
        self.run_id: str | None = None

    def _guard(self, what: str, call: Callable[[], Any]) -> Any:
        if not self.alive:
            return None
        from llmtools.dirfd import LinkRefused

        try:
            return call()
        except LinkRefused:
            raise  # someone planted a link where the tracker keeps its store: not a tracker failure
        except Exception as error:  # noqa: BLE001 - any failure of a tracker: warn, go on without it
            self.alive = False
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            self.warn(TrackerWarning(f"{self.name}: {what} failed ({first[:300]})", self.name))
            return None

    def new_metrics(self, record: dict, step: int) -> dict[str, float]:
        """The record's numbers the tracker run does not have yet (and remember them as had)."""
        fresh = {}
        for tag, value in scalars(record).items():
            if step > self.last.get(tag, -1):
                fresh[tag] = value
                self.last[tag] = step
        return fresh

    def rewind(self, step: int) -> None:
        """The run continues from ``step``: values at later steps are the new timeline's, to be logged."""
        self.last = {tag: min(last, step) for tag, last in self.last.items()}

    def event_key(self, record: dict, step: int) -> str:
        """``event/<step>/<name>`` (``.2``, ``.3``... for more of one name at one step, in order, so a
        replay gives the same keys)."""
        name = str(record.get("event", "event"))
        n = self._event_counts.get((step, name), 0) + 1
        self._event_counts[(step, name)] = n
        return f"event/{step:08d}/{name}" + (f".{n}" if n > 1 else "")

    def log(self, record: dict, step: int) -> None:
        if not self.alive:
            return
        if record.get("kind") == "event":
            key = self.event_key(record, step)
            self._guard("logging an event", lambda: self._event(key, str(record.get("message", ""))))
            return
        fresh = self.new_metrics(record, step)
        if fresh:
            self._guard("logging metrics", lambda: self._metrics(fresh, step))

    def finish(self, summary: dict[str, str], picture: Path | None) -> None:
        """The end of a run: the curves picture and the final checkpoint (path, hash) as the run's summary."""
        self._guard("recording the summary", lambda: self._summary(summary, picture))

    def close(self) -> None:
        if self.alive:
            self._guard("closing", self._close)

    def history(self) -> dict[str, dict[int, float]]:
        """``{metric: {step: value}}`` the tracker run holds, the value logged last at each step (read
        back through the library's own reader); {} when the tracker is off."""
        return self._guard("reading its history", self._history) or {}

    # -- what each library does ------------------------------------------------------------------
    def _metrics(self, values: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def _event(self, key: str, message: str) -> None:
        raise NotImplementedError

    def _summary(self, summary: dict[str, str], picture: Path | None) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError

    def _history(self) -> dict[str, dict[int, float]]:
        raise NotImplementedError


class WandbTracker(Tracker):
    """A W&B run (offline into ``folder/wandb`` unless ``WANDB_MODE`` says otherwise)."""

    name = "wandb"

    def __init__(
        self,
        folder: Path,
        project: str,
        run_name: str,
        run_id: str | None,
        config: dict | None,
        warn: Callable[[str], None],
    ) -> None:
        super().__init__(warn)
        self.folder = Path(folder)
        self.run = None
        self.wandb_step = 0  # the next W&B _step: above every one the run's earlier sessions used
        self._guard("starting", lambda: self._start(project, run_name, run_id, config))

    def _start(self, project: str, run_name: str, run_id: str | None, config: dict | None) -> None:
        os.environ.setdefault("WANDB_MODE", "offline")
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        self.folder.mkdir(parents=True, exist_ok=True)
        make_folder(self.folder / "wandb")  # W&B writes in there by path: never through a planted link
        if run_id is None:
            from wandb.sdk.lib.runid import generate_id

            run_id = generate_id()
        else:
            self.last = read_wandb_steps(self.folder / "wandb", run_id)
            rows = read_wandb_rows(self.folder / "wandb", run_id)
            self.wandb_step = 1 + max((wandb_step for wandb_step, _, _ in rows), default=-1)
        self.run = wandb.init(
            project=project,
            name=run_name,
            id=run_id,
            resume="allow",
            dir=str(self.folder),
            config=config,
            settings=wandb.Settings(console="off", x_disable_stats=True, init_timeout=60),
        )
        self.run_id = run_id
        self.run.define_metric(WANDB_STEP)
        self.run.define_metric("*", step_metric=WANDB_STEP, step_sync=True)
        for key, value in read_wandb_summary(self.folder / "wandb", run_id).items():
            self.run.summary[key] = value  # an offline resume starts an empty summary: carry it over

    def _metrics(self, values: dict[str, float], step: int) -> None:
        self.run.log({**values, WANDB_STEP: step}, step=self.wandb_step)
        self.wandb_step += 1

    def _event(self, key: str, message: str) -> None:
        self.run.summary[key] = message

    def _summary(self, summary: dict[str, str], picture: Path | None) -> None:
        import wandb

        for key, value in summary.items():
            self.run.summary[key] = value
        if picture is not None:
            self.run.summary["curves"] = wandb.Image(str(picture))

    def _close(self) -> None:
        self.run.finish()

    def _history(self) -> dict[str, dict[int, float]]:
        out: dict[str, dict[int, float]] = {}
        for step, row in read_wandb_history(self.folder / "wandb", self.run_id):
            for key, value in row.items():
                out.setdefault(key, {})[step] = value
        return out


def wandb_files(wandb_dir: Path, run_id: str) -> list[Path]:
    """The ``.wandb`` files of run ``run_id`` under ``wandb_dir`` (one per session), oldest first."""
    found = sorted(Path(wandb_dir).glob(f"*run-*-{run_id}/run-{run_id}.wandb"))
    return found


def wandb_records(path: Path):
    """Every record of one ``.wandb`` file, through W&B's own reader (protobuf ``Record``)."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    store = datastore.DataStore()
    store.open_for_scan(str(path))
    while True:
        data = store.scan_data()
        if data is None:
            break
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        yield record


def read_wandb_history(wandb_dir: Path, run_id: str) -> list[tuple[int, dict[str, Any]]]:
    """Every history row ``(training step, {key: value})`` of run ``run_id``'s offline files, in the
    order logged (a step logged again after a rollback comes later, with the new timeline's values)."""
    return [(step, row) for _, step, row in read_wandb_rows(wandb_dir, run_id)]


def read_wandb_rows(wandb_dir: Path, run_id: str) -> list[tuple[int, int, dict[str, Any]]]:
    """Every history row ``(_step, training step, {key: value})`` of run ``run_id``'s offline files, in
    order; the training step is :data:`WANDB_STEP`'s value (``_step`` in files written without it)."""
    rows = []
    for path in wandb_files(wandb_dir, run_id):
        try:
            for record in wandb_records(path):
                if record.WhichOneof("record_type") != "history":
                    continue
                row, step = {}, None
                for item in record.history.item:
                    key = item.key or "/".join(item.nested_key)
                    value = jsonfile.loads(item.value_json)
                    if key == "_step":
                        step = int(value)
                    elif not key.startswith("_"):
                        row[key] = value
                if record.history.HasField("step"):
                    step = int(record.history.step.num)
                if step is not None:
                    trained = row.pop(WANDB_STEP, step)
                    rows.append((step, int(trained), row))
        except Exception:  # noqa: BLE001, S112 - a session cut short by kill -9 ends in a torn block
            continue
    return rows


def read_wandb_steps(wandb_dir: Path, run_id: str) -> dict[str, int]:
    """The training step of the value each metric logged last."""
    last: dict[str, int] = {}
    for step, row in read_wandb_history(wandb_dir, run_id):
        for key in row:
            last[key] = step
    return last


def read_wandb_summary(wandb_dir: Path, run_id: str) -> dict[str, Any]:
    """The summary keys (events, final checkpoint) the run's earlier offline sessions wrote."""
    out: dict[str, Any] = {}
    for path in wandb_files(wandb_dir, run_id):
        try:
            for record in wandb_records(path):
                if record.WhichOneof("record_type") != "summary":
                    continue
                for item in record.summary.update:
                    key = item.key or "/".join(item.nested_key)
                    if key.startswith("event/") or key.startswith("checkpoint/"):
                        out[key] = jsonfile.loads(item.value_json)
        except Exception:  # noqa: BLE001, S112 - a torn last block
            continue
    return out


class MlflowTracker(Tracker):
    """An MLflow run in ``tracking_uri`` (default ``folder/mlruns``), experiment ``project``."""

    name = "mlflow"

    def __init__(
        self,
        folder: Path,
        project: str,
        run_name: str,
        run_id: str | None,
        config: dict | None,
        warn: Callable[[str], None],
        tracking_uri: str | None = None,
    ) -> None:
        super().__init__(warn)
        self.folder = Path(folder)
        for key, value in MLFLOW_ENV.items():
            os.environ.setdefault(key, value)
        self.uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or local_store(folder)
        if self.uri.startswith("file:") or "://" not in self.uri:
            # MLflow 3 keeps its folder store in maintenance and asks for this to open one; the folder
            # store is what mlflow-skinny has (SQLite needs the full mlflow)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = None
        self._guard("starting", lambda: self._start(project, run_name, run_id, config))

    def _start(self, project: str, run_name: str, run_id: str | None, config: dict | None) -> None:
        from mlflow.tracking import MlflowClient

        if self.uri == local_store(self.folder):  # MLflow writes in there by path: never through a link
            self.folder.mkdir(parents=True, exist_ok=True)
            make_folder(self.folder.resolve() / "mlruns")
        self.client = client = MlflowClient(tracking_uri=self.uri)
        if run_id is not None:
            run = client.get_run(run_id)
            if run.info.status != "RUNNING":
                client.update_run(run_id, status="RUNNING")
            for key in run.data.metrics:
                # the step of the value logged last (a step logged again after a rollback is later)
                history = client.get_metric_history(run_id, key)
                self.last[key] = max(history, key=lambda m: (m.timestamp, m.step)).step if history else -1
            self.run_id = run_id
            return
        experiment = client.get_experiment_by_name(project)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(project)
        run = client.create_run(experiment_id, run_name=run_name)
        self.run_id = run.info.run_id
        if config:
            from mlflow.entities import Param

            params = [Param(k, v[:6000]) for k, v in flatten(config).items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
                client.log_batch(self.run_id, params=params[i : i + 100])

    def _metrics(self, values: dict[str, float], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def _event(self, key: str, message: str) -> None:
        self.client.set_tag(self.run_id, key, message[:5000])

    def _summary(self, summary: dict[str, str], picture: Path | None) -> None:
        for key, value in summary.items():
            self.client.set_tag(self.run_id, key, value)
        if picture is not None:
            self.client.log_artifact(self.run_id, str(picture))

    def _close(self) -> None:
        self.client.set_terminated(self.run_id)

    def _history(self) -> dict[str, dict[int, float]]:
        out: dict[str, dict[int, float]] = {}
        for key in self.client.get_run(self.run_id).data.metrics:
            # in the order logged (a stable sort: the history lists a metric's values as they came)
            for metric in sorted(self.client.get_metric_history(self.run_id, key), key=lambda m: m.timestamp):
                out.setdefault(key, {})[metric.step] = metric.value
        return out


def backfill(trackers: list[Tracker], metrics_path: Path, upto: int) -> int:
    """Log the records of ``metrics.jsonl`` up to step ``upto`` that the trackers lack (a resumed run:
    W&B's offline writer loses what it had not flushed when the run was killed; metrics.jsonl is flushed
    after every record). Returns the number of records read."""
    if not trackers or not Path(metrics_path).is_file():
        return 0
    count = 0
    with open(metrics_path, encoding="utf-8") as handle:
        for line in handle:
            try:
                record = jsonfile.loads(line)
            except ValueError:
                continue  # a line torn by the kill; the step it was about is replayed by training
            step = record.get("step") if isinstance(record, dict) else None
            if not isinstance(step, int) or step > upto:
                continue
            count += 1
            for tracker in trackers:
                tracker.log(record, step)
    return count


def mark_superseded(trackers: list[Tracker], step: int) -> None:
    """A run that continues from ``step`` while a tracker run already has later steps (a rollback, or a
    replay after a kill): those values belong to a timeline the run no longer has. An event at ``step``
    says which steps are superseded, and the tracker logs the new timeline's values at them again (the
    value logged last at a step is the run's, as in metrics.jsonl)."""
    for tracker in trackers:
        later = max(tracker.last.values(), default=-1)
        if later > step:
            message = (
                f"steps {step + 1}..{later} logged here before this resume are superseded: the run "
                f"continued from step {step} and logs them again after this event with the new values "
                f"(its metrics.jsonl holds the history as it stands)"
            )
            tracker.log({"kind": "event", "step": step, "event": "superseded", "message": message}, step)
        tracker.rewind(step)


def local_store(folder: Path) -> str:
    """MLflow's local file store in ``folder/mlruns``."""
    return (Path(folder).resolve() / "mlruns").as_uri()


IDS_FILE = "trackers.json"


def folder_ids(folder: Path) -> dict[str, str]:
    """The tracker run ids recorded in the run folder (``RUN/trackers.json``), {} when none."""
    try:
        raw = jsonfile.loads((Path(folder) / IDS_FILE).read_text(encoding="utf-8"), ours=True)
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    return {k: v for k, v in raw.items() if k in TRACKERS and isinstance(v, str)}


def open_trackers(
    names: list[str],
    folder: Path,
    project: str,
    run_name: str,
    state: TrackerState,
    config: dict | None,
    warn: Callable[[str], None],
    tracking_uri: str | None = None,
) -> list[Tracker]:
    """Start (or continue, with the ids in ``state``) a tracker run for each of ``names``; the ids of the
    runs started are put in ``state``. A tracker that fails to start is left out with a warning.

    One tracker run per run folder: the ids are also kept in ``folder/trackers.json`` (written as soon as
    a run is opened), so a run started over in its folder before any checkpoint held the ids (killed
    early, then ``--resume auto``) continues the same tracker runs instead of opening new ones and
    leaving the first RUNNING forever."""
    from llmtools.fsutil import write_text_atomic

    known = folder_ids(folder)
    for name, run_id in known.items():
        state.ids.setdefault(name, run_id)
    opened: list[Tracker] = []
    for name in names:
        if name == "wandb":
            tracker: Tracker = WandbTracker(folder, project, run_name, state.ids.get(name), config, warn)
        elif name == "mlflow":
            tracker = MlflowTracker(
                folder, project, run_name, state.ids.get(name), config, warn, tracking_uri
            )
        else:
            continue
        if tracker.alive and tracker.run_id is not None:
            state.ids[name] = tracker.run_id
            opened.append(tracker)
    ids = {**known, **{t.name: t.run_id for t in opened}}
    if ids != known:
        write_text_atomic(Path(folder) / IDS_FILE, jsonfile.dumps(ids, indent=1) + "\n")
    return opened
