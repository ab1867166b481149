"""``llm-ckpt inspect --data``: a checkpoint's data ledger as a report (:func:`ledger_report`) and a table."""

from __future__ import annotations

from llmtools.data.ledger import Ledger
from llmtools.errors import InputError


def ledger_report(meta: dict, path: str, records: list[dict]) -> dict:
    """The data ledger of the checkpoint ``path`` (its meta.json ``meta``) as a report: per source the
    samples and tokens consumed, share, epochs, cursor, passed-over, quarantined and repeated samples and
    its state now; the stages; the resets. ``records`` are the run's quarantine records (they count the
    samples named by a stop the checkpoint was saved at, before a resume applies them)."""
    where = f"{path}/meta.json[data.ledger]"
    raw = (meta.get("data") or {}).get("ledger") if isinstance(meta.get("data"), dict) else None
    if raw is None:
        raise InputError(
            f"{where}: missing: the checkpoint keeps no data ledger (saved by an older llmtools)"
        )
    ledger = Ledger.from_json(raw, where)
    step = meta.get("step") if isinstance(meta.get("step"), int) else raw.get("step")
    position = ledger.position
    batch = position // step if isinstance(step, int) and step > 0 and position % step == 0 else None
    current = ledger.stages[-1] if ledger.stages else None
    # the stage of the last sample drawn: its sources are still drawn from, the others stopped
    live = set(current.keys) if current is not None and current.start < position <= current.end else set()
    weights = dict(zip(current.keys, current.weights, strict=True)) if live else {}
    quarantined: dict[str, set] = {}
    for record in records:
        for sample in record["samples"]:
            quarantined.setdefault(sample["key"], set()).add((sample["segment"], sample["sample"]))
    total = sum(rec.drawn for rec in ledger.sources.values()) or 1
    sources = []
    for key, rec in ledger.sources.items():
        epochs = rec.position * ledger.seq_length / rec.spec.tokens_per_epoch
        named = len(quarantined.get(key, ())) or rec.quarantined
        sources.append(
            {
                "name": rec.spec.name,
                "key": key,
                "prefix": rec.spec.prefix,
                "samples": rec.drawn,
                "tokens": rec.drawn * ledger.seq_length,
                "share": rec.drawn / total,
                "epochs": round(epochs, 6),
                "position": rec.position,
                "skipped": rec.skipped,
                "quarantined": named,
                "quarantined_documents": sorted(rec.quarantined_documents),
                "repeated": rec.repeated,
                "passed_over": rec.passed_over,
                "state": f"weight {weights[key]:.4g}" if key in weights else "stopped",
            }
        )
    stages = []
    for k, stage in enumerate(ledger.stages):
        end = min(stage.end, position) if k == len(ledger.stages) - 1 else stage.end
        names = {key: ledger.sources[key].spec.name for key in stage.keys}
        stages.append(
            {
                "index": k,
                "start": stage.start,
                "end": stage.end,
                "done": end,
                "steps": [stage.start // batch + 1, -(-end // batch)] if batch else None,
                "plan": stage.origin.get("plan"),
                "path": stage.origin.get("path"),
                "plan_stage": stage.origin.get("stage"),
                "weights": {names[key]: w for key, w in zip(stage.keys, stage.weights, strict=True)},
            }
        )
    return {
        "checkpoint": str(path),
        "run": ledger.run,
        "step": step,
        "position": position,
        "tokens": position * ledger.seq_length,
        "seq_length": ledger.seq_length,
        "plan": ledger.plan,
        "sources": sources,
        "stages": stages,
        "resets": ledger.resets,
        "quarantine_records": len(records),
    }


def format_ledger(report: dict) -> str:
    """The report of :func:`ledger_report` as a table."""
    lines = [
        f"run        {report['run']}",
        f"checkpoint {report['checkpoint']} (step {report['step']}, {report['position']:,} samples, "
        f"{report['tokens']:,} tokens of {report['seq_length']} per sample)",
        f"plan       {report['plan'].get('path')} (plan {report['plan'].get('identity')}, taken up at sample "
        f"{report['plan'].get('base')})",
    ]
    header = (
        "source",
        "samples",
        "tokens",
        "share",
        "epochs",
        "position",
        "skipped",
        "quarantined",
        "repeated",
        "now",
    )
    rows = [header]
    for s in report["sources"]:
        rows.append(
            (
                s["name"],
                f"{s['samples']:,}",
                f"{s['tokens']:,}",
                f"{s['share']:.4f}",
                f"{s['epochs']:.2f}",
                f"{s['position']:,}",
                str(s["skipped"]),
                str(s["quarantined"]),
                str(s["repeated"]),
                s["state"],
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        cells = [
            c.ljust(w) if i in (0, 9) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    lines.append("stages")
    for st in report["stages"]:
        steps = f" steps {st['steps'][0]}-{st['steps'][1]}" if st["steps"] else ""
        mix = ", ".join(f"{name} {w:.3f}" for name, w in st["weights"].items())
        until = "" if st["done"] == st["end"] else f" (planned to {st['end']:,})"
        lines.append(
            f"  {st['index']}  samples [{st['start']:,}, {st['done']:,}){until}{steps}  {st['path']} "
            f"stage {st['plan_stage']}: {mix}"
        )
    for reset in report["resets"]:
        lines.append(f"reset      --reset-data at sample {reset.get('position')} (the data restarted from 0)")
    if report["quarantine_records"]:
        lines.append(f"quarantine {report['quarantine_records']} record(s) in the run's quarantine.jsonl")
    return "\n".join(lines)
