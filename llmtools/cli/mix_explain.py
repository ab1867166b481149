"""``llm-mix --explain`` for blends of many sources: one row per folder instead of one per source.

A blend of 1,000 shards explained source by source is 1,000 rows nobody reads; grouped by the folder
each prefix lies in, it is a handful, each with its number of sources, requested and realized share,
samples, tokens and the range of epochs drawn. Warnings that repeat per source are folded the same
way. Small blends keep the per-source table of :func:`llmtools.data.mix.explain`.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict

from llmtools.data import mix as lib
from llmtools.data.mix_config import MEGATRON_SEMANTICS
from llmtools.data.mix_report import epochs_drawn, stage_rows

GROUP_OVER = 20
"""More sources than this in a split: group rows by folder."""
SHOWN = 3


def explain(plan) -> str:
    """The table (per source, or per folder for many sources), then how each curated source was cleaned."""
    return _table(plan) + curation(plan)


def curation(plan) -> str:
    """Per source whose sidecar carries a ``curation`` block (json2bin --provenance): each stage, what it
    removed by rule and what it changed. Empty when no source has one."""
    from llmtools.formats.curation_stats import explain_lines

    lines = []
    for source in plan.sources:
        block = (source.sidecar or {}).get("curation")
        if not block:
            continue
        lines.append(f"  {source.prefix}")
        try:
            lines += [f"    {line}" for line in explain_lines(block)]
        except (KeyError, TypeError, AttributeError, ValueError):
            lines.append("    (its sidecar's curation record is not one this llmtools reads)")
    return "\n\ncuration (how each source was cleaned, from its sidecar):\n" + "\n".join(lines) if lines else ""


def _table(plan) -> str:
    if max((len(s.components) for s in plan.splits.values()), default=0) <= GROUP_OVER:
        return lib.explain(plan)
    seq = plan.config.seq_length
    lines = [
        f"plan {plan.hash}: seq_length {seq} (+1 token per sample), seed {plan.config.seed}, {MEGATRON_SEMANTICS}",
        f"{len(plan.sources):,} sources, grouped by folder (llm-mix --json lists every source)",
    ]
    for split in plan.splits.values():
        if split.stages is not None:
            lines += _explain_stages(plan, split)
            continue
        lines.append(
            f"\n[{split.name}] {split.size} samples (requested {split.requested}), {split.size * seq:,} tokens"
        )
        header = (
            f"  {'folder':<40} {'sources':>7} {'requested':>9} {'realized':>9} {'samples':>10} "
            f"{'tokens':>15} {'split tokens':>15} {'epochs':>11}"
        )
        lines.append(header)
        groups: dict[str, list] = defaultdict(list)
        for c in split.components:
            groups[_folder(plan, c.source)].append(c)
        for folder, comps in groups.items():
            drawn = sum(c.drawn for c in comps)
            lines.append(
                f"  {_short(folder):<40} {len(comps):>7} {sum(c.normalized_weight for c in comps):>9.4f} "
                f"{drawn / split.size:>9.4f} {drawn:>10} {drawn * seq:>15,} "
                f"{sum(c.indices.tokens_per_epoch for c in comps):>15,} "
                f"{_span([epochs_drawn(c, seq) for c in comps]):>11}"
            )
    return "\n".join(lines)


def _explain_stages(plan, split) -> list[str]:
    """A schedule over many sources: per stage (then for the whole schedule) one row per folder."""
    seq = plan.config.seq_length
    lines = [
        f"\n[{split.name}] {split.size} samples (requested {split.requested}), {split.size * seq:,} tokens, "
        f"{len(split.stages)} stages"
    ]
    header = (
        f"    {'folder':<40} {'sources':>7} {'requested':>9} {'realized':>9} {'samples':>10} "
        f"{'tokens':>15} {'epochs':>11}"
    )
    for title, length, rows in stage_rows(plan, split):
        lines += [f"  {title}", header]
        groups: dict[str, list] = defaultdict(list)
        for row in rows:
            groups[_folder(plan, row.source)].append(row)
        for folder, group in groups.items():
            drawn = sum(r.drawn for r in group)
            lines.append(
                f"    {_short(folder):<40} {len(group):>7} {sum(r.requested for r in group):>9.4f} "
                f"{drawn / length:>9.4f} {drawn:>10} {drawn * seq:>15,} {_span([r.epochs for r in group]):>11}"
            )
    return lines


def _folder(plan, source: int) -> str:
    return os.path.dirname(plan.sources[source].prefix) or "."


def _short(folder: str) -> str:
    return folder + "/" if len(folder) < 40 else "…" + folder[-38:] + "/"


def _span(epochs: list[float]) -> str:
    low, high = min(epochs), max(epochs)
    return f"{low:.2f}" if high - low < 0.005 else f"{low:.2f}-{high:.2f}"


def fold(messages: list[str], over: int = GROUP_OVER) -> list[str]:
    """``PREFIX: what`` messages that say the same thing (numbers aside) for many sources, as one line."""
    if len(messages) <= over:
        return list(messages)
    groups: dict[str, list[tuple[str, str]]] = defaultdict(list)
    order = []
    for message in messages:
        prefix, sep, rest = message.partition(": ")
        if not sep:
            prefix, rest = "", message
        key = re.sub(r"\d[\d,.]*", "#", rest)
        if key not in groups:
            order.append(key)
        groups[key].append((prefix, rest))
    out = []
    for key in order:
        items = groups[key]
        if len(items) == 1 or not items[0][0]:
            out += [f"{p}: {r}" if p else r for p, r in items]
            continue
        names = ", ".join(p for p, _ in items[:SHOWN]) + (
            f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
        )
        varies = key != items[0][1]  # the figures differ from source to source
        out.append(
            f"{len(items)} sources ({names}): {items[0][1]}"
            + (f" (figures of {items[0][0]})" if varies else "")
        )
    return out
