"""Summaries of checkpoints for ``llm-ckpt list`` and ``llm-ckpt inspect`` (no tensor data is read)."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

from llmtools.ckpt import layout
from llmtools.ckpt.verify import verify
from llmtools.errors import InputError


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def list_run(run: str | Path, checksums: bool = True) -> list[dict[str, Any]]:
    """One row per checkpoint folder of a run (or checkpoints folder), oldest first."""
    ckpt_dir = layout.ckpt_dir_of(run)
    if not ckpt_dir.is_dir():
        raise InputError(f"{run}: no checkpoints folder here (expected {layout.checkpoints_dir(run)})")
    latest = layout.read_latest(ckpt_dir)
    rows = []
    for step, path in layout.list_checkpoints(ckpt_dir):
        report = verify(path, checksums=checksums, shapes=False, found_in=ckpt_dir)
        meta = report.meta or {}
        created = meta.get("time")
        rows.append(
            {
                "step": step,
                "path": str(path),
                "tokens": meta.get("consumed_tokens"),
                "samples": meta.get("consumed_samples"),
                "time": created,
                "created": meta.get("created"),
                "complete": report.complete,
                "verified": report.ok,
                "problem": report.first_problem() or None,
                "size": folder_size(path),
                "world_size": meta.get("world_size"),
                "zero_stage": meta.get("zero_stage"),
                "latest": path.name == latest,
            }
        )
        if created is None:
            rows[-1]["time"] = path.stat().st_mtime
    return rows


def human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1000
    return f"{size}B"


def format_table(rows: list[dict[str, Any]]) -> str:
    header = ("step", "tokens", "time", "complete", "verified", "size", "")
    lines = [header]
    for row in rows:
        when = _dt.datetime.fromtimestamp(row["time"], _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        lines.append(
            (
                str(row["step"]),
                "-" if row["tokens"] is None else f"{row['tokens']:,}",
                when,
                "yes" if row["complete"] else "NO",
                "yes" if row["verified"] else "NO",
                human_size(row["size"]),
                "latest" if row["latest"] else (row["problem"] or "") if not row["verified"] else "",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    out = []
    for line in lines:
        cells = [
            cell.rjust(width) if i in (0, 1, 5) else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=False))
        ]
        out.append("  ".join(cells + [line[-1]]).rstrip())
    return "\n".join(out)


def inspect_checkpoint(path: str | Path) -> dict[str, Any]:
    """Config, parameter count, dtypes, optimizer state, world size of one checkpoint."""
    from llmtools.ckpt import tensor_shards
    from llmtools.ckpt.convert import resolve_checkpoint
    from llmtools.ckpt.expert_parallel import is_expert_parallel
    from llmtools.ckpt.reader import CheckpointReader

    # Verified (all but the sha256s: only the pickles are read here, and they are checked for safety).
    path = resolve_checkpoint(path, checksums=False)
    report = verify(path, checksums=False, shapes=False)
    meta = report.meta or {}
    expert_parallel = is_expert_parallel(meta)
    shards = tensor_shards.degree(meta)
    with CheckpointReader(path, mp_rank=0 if shards > 1 else None) as reader:
        shapes = reader.param_shapes()
        dtypes: dict[str, int] = {}
        if shards > 1:
            # DeepSpeed AutoTP: shard 0's files, the whole model counted from meta.json's record
            for source in reader.sources().values():
                key = str(source.dtype).removeprefix("torch.")
                dtypes[key] = dtypes.get(key, 0) + 1
            total = tensor_shards.whole_parameters({k: list(v) for k, v in shapes.items()}, meta)
            kind = f"tensor-parallel ({shards} shards, DeepSpeed AutoTP; shard 0 read): {reader.kind}"
        elif expert_parallel:
            # DeepSpeed's expert-parallel layout: the shapes recorded are rank 0's share of the experts.
            from llmtools.model.presets import load_model_config

            total = load_model_config(meta["model"]).num_parameters()
            kind = f"expert-parallel ({meta['expert_parallel']} ranks per expert group, DeepSpeed AutoEP)"
        else:
            for source in reader.sources().values():
                key = str(source.dtype).removeprefix("torch.")
                dtypes[key] = dtypes.get(key, 0) + 1
            total, kind = sum(_numel(s) for s in shapes.values()), reader.kind
        optimizer = reader.optimizer_summary()
        zero_stage, world = reader.zero_stage, reader.world_size
        module = reader.model_states
        info = {
            "path": str(path),
            "step": meta.get("step", module.get("global_steps")),
            "consumed_samples": meta.get("consumed_samples"),
            "consumed_tokens": meta.get("consumed_tokens"),
            "complete": report.complete,
            "world_size": meta.get("world_size", world),
            "zero_stage": meta.get("zero_stage", zero_stage),
            "precision": meta.get("precision"),
            "model": meta.get("model"),
            "tokenizer": meta.get("tokenizer"),
            "num_parameters": total,
            "num_tensors": len(shapes),
            "master_weights": {"kind": kind, "dtypes": dtypes},
            "optimizer": optimizer,
            "lr_scheduler": module.get("lr_scheduler")
            if isinstance(module.get("lr_scheduler"), dict)
            else None,
            "deepspeed": module.get("ds_version"),
            "size": folder_size(path),
            "init_only": bool(meta.get("init_only")),
        }
    return info


def _numel(shape) -> int:
    total = 1
    for size in shape:
        total *= int(size)
    return total


def format_inspect(info: dict[str, Any]) -> str:
    lines = [
        f"checkpoint   {info['path']}",
        f"step         {info['step']}  (samples {info['consumed_samples']}, tokens {info['consumed_tokens']})",
        f"complete     {info['complete']}",
        f"world size   {info['world_size']}  ZeRO stage {info['zero_stage']}  precision {info['precision']}",
        f"parameters   {info['num_parameters']:,} in {info['num_tensors']} tensors "
        f"(master weights: {info['master_weights']['kind']}, {info['master_weights']['dtypes']})",
        f"optimizer    {info['optimizer'].get('state_numel_rank0')} (rank 0), groups "
        f"{info['optimizer'].get('param_groups')}",
        f"size         {human_size(info['size'])}",
    ]
    if info.get("model"):
        model = ", ".join(f"{k}={v}" for k, v in info["model"].items())
        lines.append(f"model        {model}")
    if info.get("tokenizer"):
        tok = info["tokenizer"]
        lines.append(f"tokenizer    {tok.get('name')} vocab {tok.get('vocab_size')} {tok.get('hash')}")
    if info.get("lr_scheduler"):
        lines.append(f"lr scheduler {info['lr_scheduler']}")
    return "\n".join(lines)
