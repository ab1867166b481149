"""``llm-log plot``: training curves of one or more runs, overlaid, in four panels and the rows their logs
call for.

Panels: loss (raw, faint, and an exponential moving average, bold; eval loss as markers), learning
rate, gradient norm (with an fp16 run's loss scale, dotted, on a right-hand axis), throughput
(tokens/s, or samples/s when a log has no token counts). Rows added when a log has them:

* a mixture-of-experts run's router: its load-balancing loss and the expert-load imbalance
  (coefficient of variation of the load: mean over layers, solid; worst layer, dashed);
* the update's size and the parameters (``update_ratio``, the norm of each step's update over the
  parameters' norm, log scale; ``params_norm``, which Megatron-LM logs too);
* eval quality beyond the loss (``eval_accuracy``, top-1 token accuracy; ``eval_bpb``, bits per byte);
* last, tokens per source (llm-train's ``source_tokens``): each source's share of the tokens consumed
  between two records (the realized mix, stage by stage) and its tokens consumed so far (over 20
  sources: the 19 largest by tokens, the others summed into one band).

The x axis is steps or consumed tokens. matplotlib runs headless (Agg); the PNG is written atomically.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from llmtools import __version__
from llmtools.errors import InputError, UsageError
from llmtools.fsutil import atomic_path, check_writable
from llmtools.logs.analysis import SpikeDetector
from llmtools.logs.records import Record

PANELS = ("loss", "lr", "grad_norm", "throughput")
SOURCE_PANELS = ("share", "source_tokens")  # drawn when the logs carry tokens per source
SOURCE_TOKENS = "source_tokens/"
MAX_SOURCES_DRAWN = 20  # more sources than this: the 19 largest, and the rest as one
MOE_PANELS = ("moe_aux_loss", "moe_load_cv")
MOE_SERIES = ("moe_aux_loss", "moe_z_loss", "moe_load_cv", "moe_load_cv_max")
# Rows of one series per panel, drawn when some log has them: (train or eval, ((key, title, log y), ...)).
SERIES_ROWS = (
    (
        "train",
        (
            ("update_ratio", "update / parameter norm per step", True),
            ("params_norm", "parameter norm", False),
        ),
    ),
    (
        "eval",
        (
            ("eval_accuracy", "eval token accuracy (top-1)", False),
            ("eval_bpb", "eval bits per byte", False),
        ),
    ),
)
TRAIN_SERIES = ("loss_scale", *(key for kind, row in SERIES_ROWS if kind == "train" for key, _, _ in row))
EVAL_SERIES = tuple(key for kind, row in SERIES_ROWS if kind == "eval" for key, _, _ in row)


@dataclass
class PlotConfig:
    output: Path
    x: str = "steps"
    smooth: float | None = None  # EMA weight; None: a time constant of ~0.5% of the run's points
    title: str | None = None
    force: bool = False
    dpi: int = 100
    width: float = 12.0
    height: float = 8.0

    def __post_init__(self) -> None:
        self.output = Path(self.output)
        if self.x not in ("steps", "tokens"):
            raise UsageError(f"--x must be 'steps' or 'tokens', got {self.x!r}")
        if self.smooth is not None and not 0 <= self.smooth < 1:
            raise UsageError(f"--smooth must be in [0, 1), got {self.smooth}")
        if self.output.suffix.lower() != ".png":
            raise UsageError(f"-o/--output: {self.output} must end in .png")
        if not (20 <= self.dpi <= 600):
            raise UsageError(f"--dpi must be between 20 and 600, got {self.dpi}")


@dataclass
class Curves:
    """The series of one run, kept as compact arrays (a million points is 8 MB per series)."""

    name: str
    series: dict[str, tuple[array, array]] = field(default_factory=dict)
    has_tokens: bool = False

    def _append(self, key: str, x: float, y: float) -> None:
        xs, ys = self.series.setdefault(key, (array("d"), array("d")))
        # x going back is a resume from an earlier checkpoint: the new values supersede the old
        # ones from that point on (what TensorBoard shows too), so the curve never zig-zags.
        while xs and xs[-1] >= x:
            xs.pop()
            ys.pop()
        xs.append(x)
        ys.append(y)

    def add(self, record: Record, x_axis: str, last_tokens: list) -> None:
        values = record.values
        if "consumed_tokens" in values:
            last_tokens[0] = values["consumed_tokens"]
            self.has_tokens = True
        if x_axis == "tokens":
            if last_tokens[0] is None:
                return
            x = last_tokens[0]
        else:
            x = record.step
        if record.kind == "eval":
            for name in ("eval_loss", *EVAL_SERIES):
                value = values.get(name)
                if value is not None and math.isfinite(value):
                    self._append(name, x, value)
            return
        if record.kind != "train":
            return
        for name in ("loss", "lr", "grad_norm"):
            value = values.get(name)
            if value is not None and math.isfinite(value):
                self._append(name, x, value)
        for name in ("tokens_per_s", "samples_per_s", *MOE_SERIES, *TRAIN_SERIES):
            value = values.get(name)
            if value is not None and math.isfinite(value):
                self._append(name, x, value)
        for name, value in values.items():
            if name.startswith(SOURCE_TOKENS) and math.isfinite(value):
                self._append(name, x, value)

    def sources(self) -> list[str]:
        """The sources whose tokens the log records, in order of appearance."""
        return [key[len(SOURCE_TOKENS) :] for key in self.series if key.startswith(SOURCE_TOKENS)]

    def shares(self) -> dict[str, tuple[list[float], list[float]]]:
        """Per source: its share of the tokens consumed between consecutive records, at each record."""
        names = self.sources()
        if not names:
            return {}
        table: dict[float, dict[str, float]] = {}
        for name in names:
            xs, ys = self.series[SOURCE_TOKENS + name]
            for x, y in zip(xs, ys, strict=True):
                table.setdefault(x, {})[name] = y
        points = sorted(table)
        out: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in names}
        previous = {name: 0.0 for name in names}
        for x in points:
            row = table[x]
            delta = {name: row.get(name, previous[name]) - previous[name] for name in names}
            total = sum(max(d, 0.0) for d in delta.values())
            if total > 0:
                for name in names:
                    out[name][0].append(x)
                    out[name][1].append(max(delta[name], 0.0) / total)
            previous.update(row)
        return out

    def points(self, key: str) -> int:
        return len(self.series[key][0]) if key in self.series else 0

    def lump_sources(self, keep: set[str], other: str) -> None:
        """The tokens of every source not in ``keep`` summed into one series named ``other`` (each
        source's last count carried forward between its own records)."""
        lumped = [n for n in self.sources() if n not in keep]
        if not lumped:
            return
        table: dict[float, dict[str, float]] = {}
        for name in lumped:
            xs, ys = self.series.pop(SOURCE_TOKENS + name)
            for x, y in zip(xs, ys, strict=True):
                table.setdefault(x, {})[name] = y
        last: dict[str, float] = {}
        for x in sorted(table):
            last.update(table[x])
            self._append(SOURCE_TOKENS + other, x, sum(last.values()))


def _draw_sources(runs: list[Curves], ax_share, ax_tokens, colors, drawn: dict) -> None:
    """Per-source share of the tokens of each logging window (one run: stacked areas; several: one line
    style per run) and tokens consumed so far: one color per source."""
    styles = ("-", "--", ":", "-.")
    names: list[str] = []
    for run in runs:
        names += [n for n in run.sources() if n not in names]
    if len(names) > MAX_SOURCES_DRAWN:
        # a blend of hundreds of shards: the largest sources by name, the rest as one band
        tokens = {n: max((r.series[SOURCE_TOKENS + n][1][-1] for r in runs if n in r.sources()), default=0)
                  for n in names}  # fmt: skip
        keep = set(sorted(names, key=lambda n: -tokens[n])[: MAX_SOURCES_DRAWN - 1])
        other = f"{len(names) - len(keep)} other sources"
        for run in runs:
            run.lump_sources(keep, other)
        names = [n for n in names if n in keep] + [other]
    color_of = {name: colors[i % len(colors)] for i, name in enumerate(names)}
    for index, run in enumerate(runs):
        style = styles[index % len(styles)]
        label = (lambda name: name) if len(runs) == 1 else (lambda name, r=run.name: f"{r}: {name}")
        shares = run.shares()
        if len(runs) == 1 and shares:
            xs = next(iter(shares.values()))[0]
            ax_share.stackplot(
                xs,
                *[ys for _, ys in shares.values()],
                labels=list(shares),
                colors=[color_of[name] for name in shares],
                step="pre",
                alpha=0.8,
            )
        for name, (xs, ys) in shares.items():
            if len(runs) > 1:
                ax_share.plot(
                    xs,
                    ys,
                    style,
                    color=color_of[name],
                    linewidth=1.2,
                    label=label(name),
                    drawstyle="steps-pre",
                )
            drawn["share"][f"{run.name}:{name}"] = len(xs)
        for name in run.sources():
            xs, ys = run.series[SOURCE_TOKENS + name]
            ax_tokens.plot(xs, ys, style, color=color_of[name], linewidth=1.2, label=label(name))
            drawn["source_tokens"][f"{run.name}:{name}"] = len(xs)
    ax_share.set_ylim(0, 1)
    ax_share.set_title("data mix: share of each source's tokens per log window")
    ax_tokens.set_title("tokens consumed per source")


def _draw_moe(row, run: Curves, color: str, drawn: dict) -> None:
    ax_aux, ax_cv = row
    if run.points("moe_aux_loss"):
        xs, ys = run.series["moe_aux_loss"]
        ax_aux.plot(xs, ys, color=color, linewidth=1.2, label=run.name)
        drawn["moe_aux_loss"][run.name] = len(xs)
    for key, style in (("moe_load_cv", "-"), ("moe_load_cv_max", "--")):
        if run.points(key):
            xs, ys = run.series[key]
            label = run.name if key == "moe_load_cv" else f"{run.name} (worst layer)"
            ax_cv.plot(xs, ys, style, color=color, linewidth=1.2, label=label)
            drawn["moe_load_cv"][run.name] = drawn["moe_load_cv"].get(run.name, 0) + len(xs)


def auto_smoothing(points: int) -> float:
    """An EMA weight whose time constant is ~0.5% of the points: none for a short log, strong for a long one."""
    return max(0.0, 1.0 - 200.0 / points) if points else 0.0


def ema(values: array, alpha: float) -> list[float]:
    """TensorBoard-style smoothing with debiasing, so the curve starts at the first value."""
    out = []
    last = 0.0
    for i, value in enumerate(values, 1):
        last = alpha * last + (1 - alpha) * value
        out.append(last / (1 - alpha**i) if alpha else value)
    return out


def plot_runs(runs: list[Curves], config: PlotConfig) -> dict:
    """Draw and write the PNG; returns what was drawn per panel (points per run), for callers and tests."""
    check_writable([config.output], config.force)
    if not any(run.points("loss") or run.points("lr") or run.points("eval_loss") for run in runs):
        hint = " (no consumed_tokens in the logs: use --x steps)" if config.x == "tokens" else ""
        raise InputError(
            "nothing to plot: no loss, lr or eval loss in " + ", ".join(r.name for r in runs) + hint
        )
    try:
        import matplotlib
    except ImportError:
        raise UsageError("llm-log plot needs matplotlib: pip install 'llmtools[plot]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    moe = any(run.points("moe_aux_loss") for run in runs)
    series_rows = [row for _, row in SERIES_ROWS if any(run.points(key) for run in runs for key, _, _ in row)]
    with_sources = any(run.sources() for run in runs)
    rows = 2 + int(moe) + len(series_rows) + int(with_sources)
    fig, axes = plt.subplots(
        rows, 2, figsize=(config.width, config.height * rows / 2), dpi=config.dpi, sharex=True
    )
    ax_loss, ax_lr, ax_gn, ax_tp = axes.flat[:4]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    panels = PANELS + (MOE_PANELS if moe else ()) + (SOURCE_PANELS if with_sources else ())
    drawn = {panel: {} for panel in panels}
    for row in series_rows:
        drawn.update({key: {} for key, _, _ in row})
    # A loss scale that never leaves 1 is a bf16/fp32 run's (Megatron-LM logs one): nothing to show.
    scaled = [run for run in runs if any(v != 1 for v in run.series.get("loss_scale", ((), ()))[1])]
    ax_scale = ax_gn.twinx() if scaled else None
    # The rows of single series sit between the MoE row and the sources row (always the last).
    series_axes = axes[2 + moe : 2 + moe + len(series_rows)]
    throughput_label = "tokens/s"
    for index, run in enumerate(runs):
        color = colors[index % len(colors)]
        if run.points("loss"):
            xs, ys = run.series["loss"]
            alpha = config.smooth if config.smooth is not None else auto_smoothing(len(ys))
            ax_loss.plot(xs, ys, color=color, alpha=0.3, linewidth=0.8)
            ax_loss.plot(xs, ema(ys, alpha), color=color, linewidth=1.8, label=run.name)
            detector = SpikeDetector()
            spikes = [(x, y) for x, y in zip(xs, ys, strict=True) if detector.check(y) is not None]
            if spikes:
                ax_loss.plot(
                    *zip(*spikes, strict=True), "x", color="red", markersize=7, label=f"{run.name} spikes"
                )
            drawn["loss"][run.name] = len(xs)
        if run.points("eval_loss"):
            xs, ys = run.series["eval_loss"]
            ax_loss.plot(xs, ys, "o--", color=color, markersize=4, linewidth=0.8, label=f"{run.name} (eval)")
            drawn["loss"][run.name] = drawn["loss"].get(run.name, 0) + len(xs)
        for key, ax in (("lr", ax_lr), ("grad_norm", ax_gn)):
            if run.points(key):
                xs, ys = run.series[key]
                ax.plot(xs, ys, color=color, linewidth=1.2, label=run.name)
                drawn[key][run.name] = len(xs)
        key = "tokens_per_s" if run.points("tokens_per_s") else "samples_per_s"
        if key == "samples_per_s":
            throughput_label = "tokens/s or samples/s" if drawn["throughput"] else "samples/s"
        if run.points(key):
            xs, ys = run.series[key]
            ax_tp.plot(
                xs, ys, color=color, linewidth=1.0, label=f"{run.name} ({key.replace('_per_s', '/s')})"
            )
            drawn["throughput"][run.name] = len(xs)
        if moe:
            _draw_moe(axes[2], run, color, drawn)
        for axes_row, row in zip(series_axes, series_rows, strict=True):
            for ax, (key, _, _) in zip(axes_row, row, strict=True):
                if run.points(key):
                    xs, ys = run.series[key]
                    style = "o--" if key.startswith("eval_") else "-"
                    ax.plot(xs, ys, style, color=color, linewidth=1.2, markersize=4, label=run.name)
                    drawn[key][run.name] = len(xs)
        if run in scaled:
            xs, ys = run.series["loss_scale"]
            ax_scale.plot(xs, ys, ":", color=color, linewidth=1.2, label=f"{run.name} loss scale")
            drawn["grad_norm"][run.name] = drawn["grad_norm"].get(run.name, 0) + len(xs)
    for axes_row, row in zip(series_axes, series_rows, strict=True):
        for ax, (key, title, log) in zip(axes_row, row, strict=True):
            ax.set_title(title)
            ys = [v for run in runs if run.points(key) for v in run.series[key][1]]
            if log and ys and all(v > 0 for v in ys):
                ax.set_yscale("log")
    if ax_scale is not None:
        ax_scale.set_yscale("log", base=2)
        ax_scale.set_ylabel("fp16 loss scale (dotted)")
        ax_scale.legend(fontsize=8, loc="lower right")
    if moe:
        axes[2][0].set_title("router load-balancing loss (k when balanced)")
        axes[2][1].set_title("expert load CV (layer mean solid, worst dashed)")
    if with_sources:
        _draw_sources(runs, axes[-1][0], axes[-1][1], colors, drawn)
    ax_loss.set_title("loss (raw, smoothed; eval o, spikes x)")
    ax_lr.set_title("learning rate")
    ax_gn.set_title("grad norm")
    ax_tp.set_title(f"throughput ({throughput_label})")
    if drawn["grad_norm"] and all(
        v > 0 for run in runs if run.points("grad_norm") for v in run.series["grad_norm"][1]
    ):
        ax_gn.set_yscale("log")
    xlabel = "consumed tokens" if config.x == "tokens" else "step"
    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
        if ax.lines or ax.collections:
            ax.legend(fontsize=8, loc="best")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray")
    for ax in axes[-1]:
        ax.set_xlabel(xlabel)
    fig.suptitle(config.title or ", ".join(run.name for run in runs))
    fig.tight_layout()
    try:
        with atomic_path(config.output, suffix=".png", durable=False) as tmp:
            # The Software text chunk marks the PNG as ours: what `llm-log plot --force` may replace.
            fig.savefig(tmp, format="png", metadata={"Software": f"llmtools {__version__} (llm-log plot)"})
    finally:
        plt.close(fig)
    return drawn
