"""What a built plan means for its sources: epochs read, warnings, and the per-stage tables.

The numbers ``llm-mix --explain`` and the plan's warnings show (a source repeated or starved, its
epochs), computed from a :class:`~llmtools.data.mix.BuiltMix`; nothing here changes a plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmtools.data.mix_sources import source_names

if TYPE_CHECKING:  # the planner imports this module: its types only in annotations
    from llmtools.data.mix import BuiltMix, Component, SplitPlan


def plan_warnings(plan: BuiltMix) -> list[str]:
    out = []
    seq = plan.config.seq_length
    for split in plan.splits.values():
        if split.stages is not None:
            out += _stage_warnings(plan, split)
            continue
        for c in split.components:
            src = plan.sources[c.source]
            epochs = epochs_drawn(c, seq)
            if c.drawn == 0:
                out.append(
                    f"{src.prefix}: weight {c.normalized_weight:.3g} is too small: it gets no sample of the "
                    f"{split.size} in the {split.name} blend"
                )
            elif epochs > plan.config.max_epochs:
                out.append(
                    f"{src.prefix}: repeated {epochs:.2f} epochs in the {split.name} split (more than {plan.config.max_epochs:g})"
                )
            elif epochs > 1:
                out.append(
                    f"{src.prefix}: exhausted: its {split.name} split is read {epochs:.2f} times (repeated data)"
                )
    return out


def _stage_warnings(plan: BuiltMix, split: SplitPlan) -> list[str]:
    out = []
    seq, limit = plan.config.seq_length, plan.config.max_epochs
    for k, st in enumerate(split.stages):
        for i, n in zip(st.sources, st.drawn, strict=True):
            if n == 0:
                out.append(
                    f"{plan.sources[i].prefix}: its weight in stage {k} ({st.spec.until.text()}) is too small: "
                    f"it gets no sample of the stage's {st.stage.end - st.stage.start}"
                )
    for i, (epochs, _) in source_epochs(split, seq).items():
        prefix = plan.sources[i].prefix
        if epochs > limit:
            out.append(f"{prefix}: repeated {epochs:.2f} epochs over the schedule (more than {limit:g})")
        elif epochs > 1:
            out.append(f"{prefix}: exhausted: its train split is read {epochs:.2f} times over the schedule")
    return out


def source_epochs(split: SplitPlan, seq_length: int) -> dict[int, tuple[float, int]]:
    """Per source of a staged split: (epochs its draws read, stream segments built)."""
    by_source: dict[int, list[Component]] = {}
    for c in split.components:
        by_source.setdefault(c.source, []).append(c)
    out = {}
    for i in sorted(by_source):
        parts = by_source[i]
        drawn = sum(c.drawn for c in parts)
        tpe = parts[0].indices.tokens_per_epoch
        built = sum(c.indices.num_epochs for c in parts)
        out[i] = ((drawn * seq_length + 1) / tpe if drawn else 0.0, built)
    return out


def epochs_drawn(c: Component, seq_length: int) -> float:
    """How many times the drawn samples read the split's tokens (each sample advances seq_length)."""
    tpe = c.indices.tokens_per_epoch
    return (c.drawn * seq_length + 1) / tpe if c.drawn else 0.0


@dataclass
class StageRow:
    """One source in one stage of a schedule (or over the whole schedule), as the explain tables show it."""

    source: int
    requested: float  # share of the stage's samples asked for
    drawn: int
    epochs: float  # epochs of its split read by the end of the stage


def stage_rows(plan: BuiltMix, split: SplitPlan) -> list[tuple[str, int, list[StageRow]]]:
    """Per stage of a staged split, then for the whole schedule: (title, samples, one row per source)."""
    seq = plan.config.seq_length
    gbs = plan.config.global_batch_size
    tpe = {c.source: c.indices.tokens_per_epoch for c in split.components}
    out = []
    for k, st in enumerate(split.stages):
        length = st.stage.end - st.stage.start
        steps = f", steps {st.stage.start // gbs + 1}-{-(-st.stage.end // gbs)}" if gbs else ""
        title = (
            f"stage {k}: {st.spec.start.text()} .. {st.spec.until.text()} = samples "
            f"[{st.stage.start}, {st.stage.end}){steps}, {length * seq:,} tokens"
        )
        rows = [
            StageRow(i, w, n, (end * seq + 1) / tpe[i] if end else 0.0)
            for i, w, n, end in zip(st.sources, st.stage.weights, st.drawn, st.ends, strict=True)
        ]
        out.append((title, length, rows))
    drawn: dict[int, int] = {}
    for c in split.components:
        drawn[c.source] = drawn.get(c.source, 0) + c.drawn
    requested: dict[int, float] = {}
    for st in split.stages:
        for j, w in zip(st.sources, st.stage.weights, strict=True):
            requested[j] = requested.get(j, 0.0) + w * (st.stage.end - st.stage.start)
    whole = [
        StageRow(i, requested.get(i, 0.0) / split.size, drawn[i], epochs)
        for i, (epochs, _) in source_epochs(split, seq).items()
    ]
    out.append(("whole schedule:", split.size, whole))
    return out


def explain_stages(plan: BuiltMix, split: SplitPlan) -> list[str]:
    """Per stage and source: requested and realized share, samples, tokens, epochs read by the stage's end."""
    seq = plan.config.seq_length
    names = source_names(plan.sources)
    lines = [
        f"\n[{split.name}] {split.size} samples (requested {split.requested}), {split.size * seq:,} tokens, "
        f"{len(split.stages)} stages"
    ]
    header = (
        f"    {'source':<32} {'requested':>9} {'realized':>9} {'samples':>10} {'tokens':>15} {'epochs':>7}"
    )
    for title, length, rows in stage_rows(plan, split):
        lines += [f"  {title}", header]
        for row in rows:
            name = names[row.source] if len(names[row.source]) <= 32 else "…" + names[row.source][-31:]
            lines.append(
                f"    {name:<32} {row.requested:>9.4f} {row.drawn / length:>9.4f} {row.drawn:>10} "
                f"{row.drawn * seq:>15,} {row.epochs:>7.2f}"
            )
    return lines
