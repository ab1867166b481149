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

GROUP_OVER = 20
"""More sources than this in a split: group rows by folder."""
SHOWN = 3


def explain(plan) -> str:
    from llmtools.data import mix as lib

    if max((len(s.components) for s in plan.splits.values()), default=0) <= GROUP_OVER:
        return lib.explain(plan)
    seq = plan.config.seq_length
    lines = [
        f"plan {plan.hash}: seq_length {seq} (+1 token per sample), seed {plan.config.seed}, {lib.MEGATRON_SEMANTICS}",
        f"{len(plan.sources):,} sources, grouped by folder (llm-mix --json lists every source)",
    ]
    for split in plan.splits.values():
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
            groups[os.path.dirname(plan.sources[c.source].prefix) or "."].append(c)
        for folder, comps in groups.items():
            name = folder + "/" if len(folder) < 40 else "…" + folder[-38:] + "/"
            drawn = sum(c.drawn for c in comps)
            epochs = [lib.epochs_drawn(c, seq) for c in comps]
            span = (
                f"{min(epochs):.2f}"
                if max(epochs) - min(epochs) < 0.005
                else f"{min(epochs):.2f}-{max(epochs):.2f}"
            )
            lines.append(
                f"  {name:<40} {len(comps):>7} {sum(c.normalized_weight for c in comps):>9.4f} "
                f"{drawn / split.size:>9.4f} {drawn:>10} {drawn * seq:>15,} "
                f"{sum(c.indices.tokens_per_epoch for c in comps):>15,} {span:>11}"
            )
    lines += [f"note: {n}" for n in fold(plan.notes)]
    lines += [f"warning: {w}" for w in fold(plan.warnings)]
    return "\n".join(lines)


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
