"""The run folder: refuse to train over an existing run, and record the fully resolved configs."""

from __future__ import annotations

import json
from pathlib import Path

from llmtools.errors import UsageError
from llmtools.fsutil import write_text_atomic
from llmtools.train.plan import TrainPlan


def prepare_run_dir(run_dir: Path, resume: str | None, force: bool, rank: int = 0) -> None:
    """Refuse to train over an existing run unless resuming (or --force, which starts over: rank 0 clears).

    Every rank checks, so a refusal stops every rank alike (no rank is left waiting for the others).
    """
    if force and rank != 0:
        return
    existing = [run_dir / name for name in ("metrics.jsonl", "checkpoints") if (run_dir / name).exists()]
    if existing and resume is None:
        if not force:
            raise UsageError(
                f"{run_dir}: already holds a run ({existing[0].name}); --resume auto continues it, "
                "--force starts over, -o picks another folder"
            )
        import shutil

        for name in ("metrics.jsonl", "config.yaml", "ds_config.json", "quarantine.jsonl"):
            (run_dir / name).unlink(missing_ok=True)
        for name in ("checkpoints", "tensorboard"):
            shutil.rmtree(run_dir / name, ignore_errors=True)


def write_resolved(plan: TrainPlan, run_dir: Path) -> None:
    """RUN/config.yaml (the fully resolved train config) and RUN/ds_config.json."""
    import yaml

    resolved = plan.config.to_dict()
    resolved["model"] = {
        "preset": plan.config.model.preset,
        "init_from": plan.config.model.init_from,
        **plan.model_config.to_dict(),
    }
    resolved["data"]["seq_length"] = plan.seq_length
    resolved["training"]["train_steps"] = plan.steps
    resolved["schedule"]["total_steps"] = plan.total_steps
    resolved["resolved"] = {
        "world_size": plan.world_size,
        "grad_accumulation": plan.grad_accumulation,
        "zero_stage": plan.zero_stage,
        "tokens_per_step": plan.tokens_per_step,
        "num_parameters": plan.model_config.num_parameters(),
        "tokenizer": plan.tokenizer,
        "config_hash": plan.config.fingerprint(),
    }
    header = f"# written by llm-train from {plan.config.source}; every default filled in\n"
    write_text_atomic(run_dir / "config.yaml", header + yaml.safe_dump(resolved, sort_keys=False))
    write_text_atomic(run_dir / "ds_config.json", json.dumps(plan.ds_config, indent=2) + "\n")
