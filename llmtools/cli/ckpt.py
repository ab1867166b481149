"""``llm-ckpt``: list, verify, inspect, prune, convert and evaluate training checkpoints."""

from __future__ import annotations

from pathlib import Path

import typer

from llmtools.cli._common import emit, log, new_app, run
from llmtools.errors import InputError
from llmtools.formats import jsonfile

app = new_app("llm-ckpt", "List, verify, inspect, prune and convert training checkpoints.")


@app.callback()
def _root() -> None:
    """List, verify, inspect, prune and convert training checkpoints (RUN/checkpoints/step_XXXXXXXX)."""


LIST_HELP = """List the checkpoints of a run: step, tokens, time, complete, verified, size.

complete = meta.json says the save finished; verified = every file has its recorded size and sha256.
--resume auto picks the newest verified one.

\b
Examples:
  llm-ckpt list out/run
  llm-ckpt list out/run --json | jq '.[] | select(.verified) | .step'
  llm-ckpt list out/run --quick          # sizes only, no checksums
"""


@app.command("list", help=LIST_HELP, no_args_is_help=True)
def list_(
    run_dir: Path = typer.Argument(..., help="A run folder (or its checkpoints folder)."),
    as_json: bool = typer.Option(False, "--json", help="A JSON array instead of a table."),
    quick: bool = typer.Option(False, "--quick", help="Check sizes only, not checksums."),
) -> None:
    from llmtools.ckpt.inspect import format_table, list_run

    rows = list_run(run_dir, checksums=not quick)
    if as_json:
        emit(jsonfile.output(jsonfile.nulls(rows)))
    elif rows:
        emit(format_table(rows))
    else:
        log(f"{run_dir}: no checkpoints yet")


VERIFY_HELP = """Verify a checkpoint: meta.json, file sizes and sha256 checksums, parameter shapes,
and that it is safe to load.

The files meta.json lists must be exactly those in the folder (none outside it, no symlink out,
none unlisted), and every .pt file may name only the types llmtools checkpoints hold (checked without
loading it): a checkpoint that verifies is safe to resume from, convert or inspect.
Exit 0 and print the path when it is intact; exit 2 naming what is wrong otherwise. Given a run
folder, every checkpoint in it is verified (exit 2 if any fails).

\b
Examples:
  llm-ckpt verify out/run/checkpoints/step_00000100
  llm-ckpt verify out/run
"""


@app.command("verify", help=VERIFY_HELP, no_args_is_help=True)
def verify_(
    path: Path = typer.Argument(..., help="A checkpoint folder, or a run folder to verify all of them."),
    as_json: bool = typer.Option(
        False, "--json", help="JSON: path, ok, problems (one object per checkpoint)."
    ),
) -> None:
    from llmtools.ckpt import layout
    from llmtools.ckpt.verify import verify

    if not path.exists():
        raise InputError(f"{path}: no such checkpoint")
    if (
        (path / layout.META).exists()
        or layout.is_checkpoint(path)
        or layout.model_states_file(path).is_file()
    ):
        reports = [verify(path)]
    else:
        ckpt_dir = layout.ckpt_dir_of(path)
        targets = [p for _, p in layout.list_checkpoints(ckpt_dir)]
        if not targets:
            raise InputError(f"{path}: neither a checkpoint nor a run folder with checkpoints")
        reports = [verify(target, found_in=ckpt_dir) for target in targets]
    for report in reports:
        if as_json:
            emit(jsonfile.output({"path": str(report.path), "ok": report.ok, "problems": report.problems}))
        elif report.ok:
            emit(f"{report.path}: ok")
    bad = [r for r in reports if not r.ok]
    if bad:
        for report in bad[:-1]:
            log(f"llm-ckpt: error: {report.first_problem()}")
        more = f" ({len(bad)} of {len(reports)} checkpoints fail)" if len(reports) > 1 else ""
        raise InputError(bad[-1].first_problem() + more)


INSPECT_HELP = """Show what a checkpoint holds: model config, parameter count, dtypes, optimizer state,
world size, ZeRO stage, data position. Reads no tensor data.

--data prints the run's data ledger instead: per source the samples and tokens consumed, its share,
epochs, cursor, samples passed over (quarantine), quarantined and repeated, and whether it is still
drawn from; then the stages blended so far (mixture schedules, mixes changed on resume) and resets.

\b
Examples:
  llm-ckpt inspect out/run/checkpoints/step_00000100
  llm-ckpt inspect out/run --json          # the newest verified checkpoint of the run
  llm-ckpt inspect out/run --data          # what the run drew from each source
  llm-ckpt inspect out/run --data --json | jq '.sources[] | {name, tokens, epochs}'
"""


@app.command("inspect", help=INSPECT_HELP, no_args_is_help=True)
def inspect_(
    path: Path = typer.Argument(..., help="A checkpoint folder (or a run folder: its newest verified one)."),
    as_json: bool = typer.Option(False, "--json", help="JSON instead of text."),
    data: bool = typer.Option(False, "--data", help="The run's data ledger: what it drew from each source."),
) -> None:
    if data:
        emit(_data_ledger(path, as_json))
        return
    from llmtools.ckpt.inspect import format_inspect, inspect_checkpoint

    info = inspect_checkpoint(path)
    emit(jsonfile.output(jsonfile.nulls(info), default=str) if as_json else format_inspect(info))


def _data_ledger(path: Path, as_json: bool) -> str:
    from llmtools.ckpt.convert import resolve_checkpoint
    from llmtools.ckpt.meta import read_meta
    from llmtools.data.ledger_report import format_ledger, ledger_report
    from llmtools.formats.quarantine import quarantine_path, read_records

    checkpoint = resolve_checkpoint(path)
    meta = read_meta(checkpoint)
    ledger = (meta.get("data") or {}).get("ledger") if isinstance(meta.get("data"), dict) else None
    run = ledger.get("run") if isinstance(ledger, dict) else None
    run_dir = checkpoint.parent.parent
    records = read_records(quarantine_path(run_dir), run, whose=f"the checkpoint {checkpoint.name}")
    report = ledger_report(meta, str(checkpoint), records)
    return jsonfile.output(jsonfile.nulls(report)) if as_json else format_ledger(report)


PRUNE_HELP = """Remove old checkpoints, keeping the newest K (and every N-th step with --keep-every).

The newest checkpoint that verifies is never removed. Folders that are not complete are left for
you to look at. Prints the removed paths.

\b
Examples:
  llm-ckpt prune out/run --keep 3
  llm-ckpt prune out/run --keep 2 --keep-every 1000
  llm-ckpt prune out/run --keep 1 --dry-run
"""


@app.command("prune", help=PRUNE_HELP, no_args_is_help=True)
def prune_(
    run_dir: Path = typer.Argument(..., help="A run folder (or its checkpoints folder)."),
    keep: int = typer.Option(
        ..., "--keep", help="How many of the newest complete checkpoints to keep (>= 1)."
    ),
    keep_every: int = typer.Option(
        None, "--keep-every", help="Also keep checkpoints whose step is a multiple of N."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would be removed; remove nothing."),
) -> None:
    from llmtools.ckpt import layout
    from llmtools.ckpt.manager import CheckpointManager
    from llmtools.errors import UsageError

    if keep < 1:
        raise UsageError(f"--keep: must be >= 1, got {keep}")
    if keep_every is not None and keep_every < 1:
        raise UsageError(f"--keep-every: must be >= 1, got {keep_every}")
    ckpt_dir = layout.ckpt_dir_of(run_dir)
    if not ckpt_dir.is_dir():
        raise InputError(f"{run_dir}: no checkpoints folder here")
    if ckpt_dir.name != layout.CHECKPOINTS and not layout.list_checkpoints(ckpt_dir):
        raise InputError(
            f"{run_dir}: not a run folder (no {layout.CHECKPOINTS}/ folder and no step_* checkpoints in it)"
        )
    manager = CheckpointManager(
        ckpt_dir.parent, keep_last=keep, keep_every=keep_every, warn=lambda m: log(f"warning: {m}")
    )
    if dry_run:
        paths = manager.prune_plan()
    else:
        from llmtools.locks import lock_run

        with lock_run(ckpt_dir.parent):  # not while llm-train (or another prune) writes this run
            paths = manager.prune()
    for path in paths:
        emit(str(path))
    left = len(manager.checkpoints()) - (len(paths) if dry_run else 0)
    verb = "would remove" if dry_run else "removed"
    log(f"llm-ckpt prune: {verb} {len(paths)} checkpoint(s) of {ckpt_dir}, {left} left")


CONVERT_HELP = """Convert a checkpoint: to a Hugging Face model folder, to one consolidated safetensors
file, or to a DeepSpeed universal checkpoint (loads at any world size).

A LoRA run converts with its adapters merged into the base weights (W + alpha/r BA), or with
--adapter-only to adapter_model.safetensors + adapter_config.json, which peft.PeftModel loads.

--to hf writes config.json, generation_config.json, model.safetensors (or shards of --shard-size with
an index) and, with --tokenizer, the tokenizer files: transformers' AutoModelForCausalLM.from_pretrained
loads it with no code of ours. The model config comes from the checkpoint's meta.json (or --model).
Conversion streams tensor by tensor from DeepSpeed's files: memory stays near one tensor.
Given a run folder, its newest verified checkpoint is converted.

\b
Examples:
  llm-ckpt convert out/run/checkpoints/step_00000100 --to hf -o hf/tiny --tokenizer tokenizer.json
  llm-ckpt convert out/run --to hf -o hf/tiny-bf16 --dtype bf16 --shard-size 2GB
  llm-ckpt convert out/run --to safetensors -o model.safetensors
  llm-ckpt convert out/run/checkpoints/step_00000100 --to universal -o univ/step_100
  llm-ckpt convert out/lora-run --to hf -o hf/tiny-merged          # LoRA merged into the base
  llm-ckpt convert out/lora-run --to hf --adapter-only -o hf/tiny-adapter   # peft's adapter format
"""


@app.command("convert", help=CONVERT_HELP, no_args_is_help=True)
def convert_(
    checkpoint: Path = typer.Argument(
        ..., help="A checkpoint folder, or a run folder (its newest verified one)."
    ),
    to: str = typer.Option(..., "--to", help="hf, safetensors or universal."),
    output: Path = typer.Option(..., "-o", "--output", help="Output folder (file for --to safetensors)."),
    dtype: str = typer.Option("fp32", "--dtype", help="fp32, bf16 or fp16 (hf and safetensors)."),
    shard_size: str = typer.Option(
        "5GB", "--shard-size", help="Largest safetensors shard for --to hf: 5GB, 500MB, 2GiB."
    ),
    tokenizer: Path = typer.Option(
        None, "--tokenizer", help="tokenizer.json, .model, vocab.json or a tokenizer folder to copy in."
    ),
    model: str = typer.Option(None, "--model", help="Model preset or config file, when meta.json has none."),
    world_size: int = typer.Option(
        None, "--world-size", help="With --to universal: the world size you will resume with (any works)."
    ),
    force: bool = typer.Option(False, "--force", help="Replace an earlier output of llmtools."),
    adapter_only: bool = typer.Option(
        False, "--adapter-only", help="LoRA runs, --to hf: write only the adapter, in peft's format."
    ),
) -> None:
    from llmtools.ckpt.convert import ConvertConfig, convert
    from llmtools.cli.claim import claim, input_paths

    config = ConvertConfig(
        checkpoint=checkpoint,
        to=to,
        output=output,
        dtype=dtype,
        shard_size=shard_size,
        tokenizer=tokenizer,
        model=model,
        world_size=world_size,
        force=force,
        adapter_only=adapter_only,
    )
    kinds = {
        "hf": "llmtools.lora-adapter" if adapter_only else "llmtools.hf-model",
        "safetensors": "llmtools.safetensors",
        "universal": "llmtools.universal-checkpoint",
    }
    claim([output], inputs=input_paths([checkpoint, tokenizer]), force=force, kinds={kinds.get(to, to)})
    emit(str(convert(config)))


EVAL_HELP = """Evaluate a checkpoint with lm-evaluation-harness, without converting it first.

Tasks are local JSONL files (docs/evaluation.md): multiple choice ({context, choices, gold}: acc,
acc_norm) or perplexity ({text}: word_perplexity, byte_perplexity, bits_per_byte); nothing is
downloaded. The checkpoint (any ZeRO stage, dense or MoE, LoRA merged) is converted into a temporary
Hugging Face folder and scored with the run's own tokenizer. Prints the results as JSON and writes
them to RUN/eval/<checkpoint>.json. Needs the extra 'eval' (pip install 'llmtools[eval]').

\b
Examples:
  llm-ckpt eval runs/tiny --tasks tasks/arithmetic.jsonl
  llm-ckpt eval runs/tiny/checkpoints/step_00000200 --tasks a.jsonl --tasks b.jsonl --limit 100
"""


@app.command("eval", help=EVAL_HELP, no_args_is_help=True)
def eval_(
    checkpoint: Path = typer.Argument(
        ..., help="A checkpoint folder, or a run folder (its newest verified one)."
    ),
    tasks: list[str] = typer.Option(..., "--tasks", help="A task file (JSONL); repeat for more."),
    tokenizer: str = typer.Option(
        None,
        "--tokenizer",
        help="Tokenizer to score with; default: the one the checkpoint's data was made with.",
    ),
    limit: int = typer.Option(None, "--limit", help="At most N examples per task."),
    batch: int = typer.Option(8, "--batch", help="Sequences per forward."),
) -> None:
    from llmtools.ckpt import harness
    from llmtools.ckpt.convert import resolve_checkpoint
    from llmtools.dirfd import make_folder, refuse_link
    from llmtools.fsutil import write_text_atomic

    if limit is not None and limit < 1:
        raise InputError(f"--limit: must be >= 1, got {limit}")
    if batch < 1:
        raise InputError(f"--batch: must be >= 1, got {batch}")
    found = harness.check_ready(tasks)
    path = resolve_checkpoint(checkpoint)
    tok = _eval_tokenizer(path, tokenizer)
    where = harness.results_path(path)
    refuse_link(where.parent)  # a link at RUN/eval is refused before the work, and again when writing
    results = harness.evaluate_checkpoint(path, found, tok, limit=limit, batch=batch)
    report = {
        "checkpoint": str(path.resolve()),
        "tasks": {t.name: str(t.path) for t in found},
        "results": results,
    }
    make_folder(where.parent)  # RUN/eval: never a link someone put there
    write_text_atomic(where, harness.dumps(report))
    log(f"llm-ckpt: results in {where}")
    emit(jsonfile.output(report))


def _eval_tokenizer(path: Path, given: str | None):
    """The tokenizer ``llm-ckpt eval`` scores with: ``--tokenizer``, else the one meta.json records,
    found relative to the run (never the current folder) and refused unless it has the recorded hash."""
    from llmtools.ckpt.meta import read_meta, recorded_tokenizer
    from llmtools.tokenize.loader import load_tokenizer

    if given:
        try:
            return load_tokenizer(given, backend="tokenizers")
        except InputError as error:
            raise InputError(f"--tokenizer: {given}: {error}") from None
    recorded = recorded_tokenizer(path, read_meta(path))
    if recorded is None:
        raise InputError(f"{path}/meta.json[tokenizer]: records no tokenizer; pass --tokenizer")
    try:
        tok = load_tokenizer(recorded.source, backend="tokenizers")
    except InputError as error:
        raise InputError(f"{recorded.where}: {error} (pass --tokenizer)") from None
    if recorded.hash and tok.hash != recorded.hash:
        raise InputError(
            f"{recorded.where}: the tokenizer at {recorded.source} is not the one the checkpoint's data was "
            f"made with (sha256 {tok.hash[:12]}..., recorded {recorded.hash[:12]}...); pass --tokenizer"
        )
    return tok


IMPORT_HELP = """Bring a Hugging Face Llama/Qwen3 model folder in as a step-0 checkpoint.

The result is a weights-only checkpoint (meta.json says init_only): llm-train --resume PATH starts
from these weights with a fresh optimizer, at any ZeRO stage and world size; llm-ckpt convert turns
it back into the same HF folder.

\b
Examples:
  llm-ckpt import-hf hf/Qwen3-0.6B -o ckpt/qwen3-init
  llm-ckpt import-hf hf/tiny -o ckpt/tiny-init --force
"""


@app.command("import-hf", help=IMPORT_HELP, no_args_is_help=True)
def import_hf_(
    hf_dir: Path = typer.Argument(..., help="A Hugging Face model folder (config.json + safetensors)."),
    output: Path = typer.Option(..., "-o", "--output", help="The checkpoint folder to write."),
    force: bool = typer.Option(False, "--force", help="Replace an earlier output of llmtools."),
) -> None:
    from llmtools.ckpt.convert import import_hf
    from llmtools.cli.claim import claim

    if not hf_dir.is_dir():
        raise InputError(f"{hf_dir}: not a folder")
    claim([output], inputs=[hf_dir], force=force, kinds={"llmtools.checkpoint"})
    emit(str(import_hf(hf_dir, output, force=force)))


def main() -> None:
    import os

    # llm-ckpt only reads and writes files: DeepSpeed (imported to unpickle its checkpoints) needs no
    # accelerator, and would otherwise announce on stderr that it fell back to the CPU.
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    run(app, "llm-ckpt")


if __name__ == "__main__":
    main()
