"""``llm-log``: training logs to TensorBoard event files (``tb``), experiment trackers (``wandb``, ``mlflow``),
curves (``plot``) and tables (``summary``)."""

from __future__ import annotations

import signal
from pathlib import Path

import typer

from llmtools.cli._common import emit, log, new_app, run
from llmtools.formats import jsonfile

app = new_app("llm-log", "Training logs to TensorBoard event files, plots and summaries.")

FORMATS_HELP = (
    "Log format: auto (default; detected per file), jsonl (llm-train metrics.jsonl), megatron, "
    "deepspeed, mindformers, generic (key=value / key: value lines)."
)
PATTERN_HELP = (
    "Regular expression for --format generic (implied): lines it matches are metric lines; named groups "
    "(one a step: step/iteration/iter/global_step) are the fields, else key=value pairs are taken."
)
LOGS_HELP = "Log files: metrics.jsonl, trainer stdout logs, .gz/.zst, or - for stdin."
SEQ_HELP = (
    "Tokens per sample, for logs that count only samples (Megatron-LM, DeepSpeed): adds consumed "
    "tokens and tokens/s."
)

TB_HELP = """Write TensorBoard event files: every scalar of every record at its step and wall time.

Scalars go under train/* and eval/* (the tags of llm-train's own TensorBoard logger); resumes,
checkpoints, loss spikes and NaN losses become markers/* scalars and text entries under 'events'.
Each LOG becomes the run LOGDIR/NAME (NAME from the file, or --run for all of them). Re-running
adds only what is new (a state file in the run folder remembers what was converted); --follow keeps
converting a growing log, survives rotation and truncation, and stops cleanly on Ctrl-C. Prints the
event files written; counts of lines read (train, eval, event, other, invalid, torn) go to stderr.

\b
Examples:
  llm-log tb run/metrics.jsonl --logdir tb/             # -> tb/run/events.out.tfevents.*
  llm-log tb megatron.log ds.log.gz --logdir tb/        # formats detected per file
  llm-log tb run/metrics.jsonl --logdir tb/ --follow    # live; Ctrl-C to stop
  ssh node1 tail -f train.log | llm-log tb - --logdir tb/ --run node1
  llm-log tb app.log --logdir tb/ --pattern 'it=(?P<step>\\d+) loss=(?P<loss>\\S+)'
  tensorboard --logdir tb/
"""

PLOT_HELP = """Plot training curves: loss (raw and smoothed, eval loss as markers), learning rate,
grad norm and throughput, in four panels; several LOGs are overlaid with a legend.

\b
Examples:
  llm-log plot run/metrics.jsonl -o curves.png
  llm-log plot runA/metrics.jsonl runB/metrics.jsonl -o compare.png --x tokens
  llm-log plot megatron.log -o curves.png --smooth 0.95 --title "345M, 8xA100"
  llm-log plot megatron.log -o tokens.png --x tokens --seq-length 2048   # Megatron counts samples
"""

SUMMARY_HELP = """A table per run: steps, tokens, first/last/min loss, final eval perplexity, mean tokens/s
and MFU, loss spikes, resumes and gaps in the step sequence, and how many lines of each kind were read.

\b
Examples:
  llm-log summary run/metrics.jsonl
  llm-log summary runA/metrics.jsonl megatron.log --json | jq '.[].eval_ppl'
  zcat old.log.gz | llm-log summary - --format deepspeed
"""


@app.callback()
def _root() -> None:
    """Training logs to TensorBoard event files, plots and summaries."""


def _spikes(threshold: float, window: int):
    from llmtools.logs.analysis import SpikeConfig

    return SpikeConfig(threshold=threshold, window=window)


def _report_counts(counts, quiet: bool) -> None:
    for problem in counts.first_problems:
        log(f"llm-log: warning: {problem}")
    if not quiet:
        log(f"llm-log: {counts.describe()}")


class _StopFlag:
    """First Ctrl-C / SIGTERM asks the follow loop to stop after a last commit; a second one aborts.

    A follow stopped by a signal still ends as every command a signal stops does (:meth:`finish`, once
    its results are out): exit 128 + the signal, so a script or scheduler sees it was stopped."""

    def __init__(self) -> None:
        self.stop = False
        self.signum: int | None = None

    def __call__(self, signum, frame) -> None:
        if self.stop:
            from llmtools.errors import Interrupted

            raise Interrupted(signum)
        self.stop, self.signum = True, signum
        log("llm-log: stopping (committing what was converted; Ctrl-C again to abort)")

    def finish(self) -> None:
        if self.signum is not None:
            from llmtools.errors import Interrupted

            raise Interrupted(self.signum)


@app.command("tb", help=TB_HELP, no_args_is_help=True)
def tb(
    logs: list[str] = typer.Argument(..., help=LOGS_HELP),
    logdir: Path = typer.Option(..., "--logdir", help="TensorBoard log folder; each run is a subfolder."),
    run_name: str = typer.Option(
        None, "--run", help="Run (subfolder) name for all LOGs; default: one per LOG, from its path."
    ),
    fmt: str = typer.Option("auto", "--format", help=FORMATS_HELP),
    pattern: str = typer.Option(None, "--pattern", help=PATTERN_HELP),
    follow: bool = typer.Option(
        False, "-f", "--follow", help="Keep converting as the logs grow (Ctrl-C stops)."
    ),
    poll: float = typer.Option(0.5, "--poll", help="With --follow: seconds between looks at the logs."),
    spike_threshold: float = typer.Option(
        0.25, "--spike-threshold", help="A loss above (1+T) x the recent median is a spike."
    ),
    spike_window: int = typer.Option(
        20, "--spike-window", help="How many recent losses the median is taken over."
    ),
    seq_length: int = typer.Option(None, "--seq-length", help=SEQ_HELP),
    as_json: bool = typer.Option(
        False, "--json", help="Print a JSON summary (runs, files, points, line counts)."
    ),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No counts on stderr."),
) -> None:
    from llmtools.cli.claim import claim, input_paths
    from llmtools.logs.tb import TbConfig, convert

    claim([logdir], inputs=input_paths(logs), adds=True)
    config = TbConfig(
        logdir=logdir,
        run=run_name,
        fmt=fmt,
        pattern=pattern,
        follow=follow,
        poll_s=poll,
        spikes=_spikes(spike_threshold, spike_window),
        seq_length=seq_length,
    )
    flag = _StopFlag()
    if follow:
        signal.signal(signal.SIGINT, flag)
        signal.signal(signal.SIGTERM, flag)
    result = convert(logs, config, should_stop=lambda: flag.stop, on_progress=None if quiet else log)
    _report_counts(result.counts, quiet)
    if as_json:
        emit(jsonfile.output({"runs": result.runs, "lines": result.counts.as_dict()}))
    else:
        for info in result.runs.values():
            emit(info["events_file"])
    flag.finish()


TRACK_HELP = """Upload a run to {title}: every metric at its step ({what}).

A LOG is a run folder of llm-train, a metrics.jsonl, or a Megatron-LM / DeepSpeed / MindFormers /
generic log (as for 'llm-log tb'); each becomes one {title} run named after it, with llm-train's own
names (train/loss, eval/eval_loss; events as keys event/<step>/<name>). Idempotent: DIR keeps the run
id of each LOG (.llm-log-trackers.json) and uploading again continues that run with only the steps it
lacks, so a second upload adds nothing; --follow keeps uploading a growing log until Ctrl-C. A
history rewritten since (llm-train --resume N --rollback, a replay after a kill) is found by comparing
the {title} run with the log: the steps from the first difference are marked superseded (an event
event/<step>/superseded) and logged again with the log's values.
Needs the extra 'track' (pip install 'llmtools[track]'). Prints one line per run: name, id, new points.

\b
Examples:
{examples}
"""
WANDB_HELP = TRACK_HELP.format(
    title="Weights & Biases",
    what="offline into DIR/wandb unless WANDB_MODE says otherwise; 'wandb sync DIR/wandb/offline-run-*' "
    "uploads it later",
    examples="  llm-log wandb runs/tiny --dir tracking/                # our run folder\n"
    "  llm-log wandb megatron.log --dir tracking/ --project 345m\n"
    "  llm-log wandb runs/tiny --dir tracking/ --follow         # live; Ctrl-C to stop",
)
MLFLOW_HELP = TRACK_HELP.format(
    title="MLflow",
    what="into the store --tracking-uri (or MLFLOW_TRACKING_URI) names, else the folder store DIR/mlruns",
    examples="  llm-log mlflow runs/tiny --dir tracking/\n"
    "  llm-log mlflow ds.log.gz --dir tracking/ --tracking-uri http://mlflow.internal:5000\n"
    "  llm-log mlflow runs/tiny --dir tracking/ --follow",
)


def _upload(
    tracker: str, logs, folder, project, tracking_uri, fmt, pattern, follow, poll, seq_length, as_json, quiet
):
    from llmtools.cli.claim import claim, input_paths
    from llmtools.logs.upload import UploadConfig, upload

    claim([folder], inputs=input_paths(logs), adds=True)
    config = UploadConfig(
        tracker=tracker,
        folder=folder,
        project=project,
        tracking_uri=tracking_uri,
        fmt=fmt,
        pattern=pattern,
        follow=follow,
        poll_s=poll,
        seq_length=seq_length,
    )
    flag = _StopFlag()
    if follow:
        signal.signal(signal.SIGINT, flag)
        signal.signal(signal.SIGTERM, flag)
    result = upload(logs, config, should_stop=lambda: flag.stop, on_progress=None if quiet else log)
    _report_counts(result.pop("counts"), quiet)
    if as_json:
        emit(jsonfile.output(result))
    else:
        for name, info in result["runs"].items():
            emit(f"{name}\t{info['id']}\t{info['points']} new points")
    flag.finish()


_DIR_HELP = "Folder for the tracker's local files (W&B offline runs, MLflow's folder store) and the state."


@app.command("wandb", help=WANDB_HELP, no_args_is_help=True)
def wandb_command(
    logs: list[str] = typer.Argument(..., help="Run folders, metrics.jsonl files or trainer logs."),
    folder: Path = typer.Option(..., "--dir", help=_DIR_HELP),
    project: str = typer.Option("llmtools", "--project", help="The W&B project."),
    fmt: str = typer.Option("auto", "--format", help=FORMATS_HELP),
    pattern: str = typer.Option(None, "--pattern", help=PATTERN_HELP),
    follow: bool = typer.Option(
        False, "-f", "--follow", help="Keep uploading as the logs grow (Ctrl-C stops)."
    ),
    poll: float = typer.Option(0.5, "--poll", help="With --follow: seconds between looks at the logs."),
    seq_length: int = typer.Option(None, "--seq-length", help=SEQ_HELP),
    as_json: bool = typer.Option(
        False, "--json", help="Print a JSON summary (runs, ids, points, line counts)."
    ),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No counts on stderr."),
) -> None:
    _upload("wandb", logs, folder, project, None, fmt, pattern, follow, poll, seq_length, as_json, quiet)


@app.command("mlflow", help=MLFLOW_HELP, no_args_is_help=True)
def mlflow_command(
    logs: list[str] = typer.Argument(..., help="Run folders, metrics.jsonl files or trainer logs."),
    folder: Path = typer.Option(..., "--dir", help=_DIR_HELP),
    project: str = typer.Option("llmtools", "--project", help="The MLflow experiment."),
    tracking_uri: str = typer.Option(
        None, "--tracking-uri", help="MLflow store or server; default MLFLOW_TRACKING_URI, else DIR/mlruns."
    ),
    fmt: str = typer.Option("auto", "--format", help=FORMATS_HELP),
    pattern: str = typer.Option(None, "--pattern", help=PATTERN_HELP),
    follow: bool = typer.Option(
        False, "-f", "--follow", help="Keep uploading as the logs grow (Ctrl-C stops)."
    ),
    poll: float = typer.Option(0.5, "--poll", help="With --follow: seconds between looks at the logs."),
    seq_length: int = typer.Option(None, "--seq-length", help=SEQ_HELP),
    as_json: bool = typer.Option(
        False, "--json", help="Print a JSON summary (runs, ids, points, line counts)."
    ),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No counts on stderr."),
) -> None:
    _upload(
        "mlflow", logs, folder, project, tracking_uri, fmt, pattern, follow, poll, seq_length, as_json, quiet
    )


@app.command("plot", help=PLOT_HELP, no_args_is_help=True)
def plot(
    logs: list[str] = typer.Argument(..., help=LOGS_HELP),
    output: Path = typer.Option(..., "-o", "--output", help="PNG file to write."),
    x: str = typer.Option("steps", "--x", help="x axis: steps or tokens (consumed tokens)."),
    smooth: float = typer.Option(
        None, "--smooth", help="EMA weight of the smoothed loss, in [0, 1); default: ~0.5% of the points."
    ),
    names: list[str] = typer.Option(None, "--name", help="Legend name per LOG (repeat, in order)."),
    title: str = typer.Option(None, "--title", help="Figure title (default: the run names)."),
    fmt: str = typer.Option("auto", "--format", help=FORMATS_HELP),
    pattern: str = typer.Option(None, "--pattern", help=PATTERN_HELP),
    dpi: int = typer.Option(100, "--dpi", help="Resolution; the figure is 12x8 inches."),
    seq_length: int = typer.Option(None, "--seq-length", help=SEQ_HELP),
    force: bool = typer.Option(False, "--force", help="Replace a PNG llmtools drew earlier."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No counts on stderr."),
) -> None:
    from llmtools.cli.claim import claim, input_paths
    from llmtools.errors import InputError
    from llmtools.logs.plot import PlotConfig, plot_runs
    from llmtools.logs.runs import collect_curves

    claim([output], inputs=input_paths(logs), force=force)
    config = PlotConfig(output=output, x=x, smooth=smooth, title=title, force=force, dpi=dpi)
    runs, counts = collect_curves(logs, x=x, fmt=fmt, pattern=pattern, names=names, seq_length=seq_length)
    try:
        plot_runs(runs, config)
    except InputError as error:  # one line: what was read belongs in it
        raise InputError(f"{error} ({'; '.join(c.describe() for c in counts)})") from None
    for c in counts:
        _report_counts(c, quiet)
    emit(str(output))


@app.command("summary", help=SUMMARY_HELP, no_args_is_help=True)
def summary(
    logs: list[str] = typer.Argument(..., help=LOGS_HELP),
    names: list[str] = typer.Option(None, "--name", help="Run name per LOG (repeat, in order)."),
    fmt: str = typer.Option("auto", "--format", help=FORMATS_HELP),
    pattern: str = typer.Option(None, "--pattern", help=PATTERN_HELP),
    spike_threshold: float = typer.Option(
        0.25, "--spike-threshold", help="A loss above (1+T) x the recent median is a spike."
    ),
    spike_window: int = typer.Option(
        20, "--spike-window", help="How many recent losses the median is taken over."
    ),
    seq_length: int = typer.Option(None, "--seq-length", help=SEQ_HELP),
    as_json: bool = typer.Option(False, "--json", help="JSON: a list with one object per run."),
) -> None:
    from llmtools.logs.analysis import format_table
    from llmtools.logs.runs import summarize

    summaries = summarize(
        logs,
        fmt=fmt,
        pattern=pattern,
        names=names,
        spikes=_spikes(spike_threshold, spike_window),
        seq_length=seq_length,
    )
    for s in summaries:
        for problem in s.counts.first_problems:
            log(f"llm-log: warning: {problem}")
    dicts = [s.as_dict() for s in summaries]
    emit(jsonfile.output(jsonfile.nulls(dicts), indent=1) if as_json else format_table(dicts))


def main() -> None:
    run(app, "llm-log")


if __name__ == "__main__":
    main()
