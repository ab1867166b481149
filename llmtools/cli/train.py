"""``llm-train``: pretrain or continue-pretrain a LLaMA-family model with DeepSpeed ZeRO."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import typer

from llmtools import launch_channel
from llmtools.cli._common import emit, log, new_app, run, skip_native_teardown
from llmtools.errors import UsageError
from llmtools.formats import jsonfile

EXAMPLES = """
Examples:

\b
  # one process, no launcher (the shipped tiny config and ZeRO-2, on CPU; data: make pretrain's mix)
  llm-train tiny --deepspeed zero2 -o runs/tiny

\b
  # see a shipped config, or every key at its default with what it means; start your own from one
  llm-train --print-config tiny
  llm-train --print-config default
  llm-train --print-config tiny > my.yaml

\b
  # override any key; unknown keys are refused with a suggestion
  llm-train tiny --deepspeed zero1 \\
      --set training.train_steps=50 --set optimizer.lr=1e-3 --set data.mix=out/mix.json

\b
  # two processes on one machine, started by llm-train itself (torchrun's options); it ends as one
  # process does: 0, 2 for a refusal, 128 + the signal for a stop (resume line last), 1 for a crash
  llm-train --nproc-per-node 2 tiny --deepspeed zero2 -o runs/tiny2
  # stock torchrun and the deepspeed launcher work too (the exit status is then the launcher's)
  torchrun --nproc_per_node 2 --master_port 29512 -m llmtools.cli.train tiny --deepspeed zero2 -o runs/tiny2
  deepspeed --num_gpus 2 --master_port 29513 --module llmtools.cli.train tiny --deepspeed zero3 -o runs/tiny3

\b
  # many machines: the DeepSpeed launcher with a hostfile, or srun under Slurm (one task per GPU)
  deepspeed --hostfile hosts --module llmtools.cli.train 1b --deepspeed ds.json -o runs/1b
  srun --ntasks-per-node 8 llm-train 1b --deepspeed ds.json -o runs/1b

\b
  # elastic: one llm-train per host; a lost worker restarts the job from the newest checkpoint
  llm-train --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint node1:29400 --rdzv-id run1 \\
      --max-restarts 3 1b --deepspeed ds.json -o runs/1b --resume auto
  # the same under Slurm, with requeue on preemption: configs/slurm/train.sbatch of the source repository

\b
  # continue an interrupted run from its newest complete checkpoint
  llm-train tiny --deepspeed zero2 -o runs/tiny --resume auto

\b
  # change the mix of a running job: every source of both mixes continues where it stopped, new ones start
  llm-train tiny --deepspeed zero2 -o runs/tiny --resume auto --set data.mix=out/mix2.json

\b
  # check the config, data and DeepSpeed config without training (prints the resolved DeepSpeed config)
  llm-train tiny --deepspeed zero2 --dry-run

\b
  # a name (tiny, zero2) is a shipped file; a path has a '/' or an extension (my.yaml, ./tiny, ds.json)
"""


def _launcher(name: str, metavar: str, help: str):
    """An option of the launcher (torchrun's name and its underscore spelling): given, llm-train starts the
    workers itself (llmtools.train.launch reads them from the command line as torchrun's parser does)."""
    names = dict.fromkeys((f"--{name}", f"--{name.replace('-', '_')}"))
    return typer.Option(None, *names, metavar=metavar, help=help, show_default=False)


app = new_app("llm-train", "Pretrain a LLaMA-family model with DeepSpeed ZeRO.", single_command=True)


@app.command(
    help="Train a LLaMA-family model with DeepSpeed ZeRO 0-3 (one process or under a launcher).\n\n"
    "Writes RUN/config.yaml (fully resolved), RUN/ds_config.json, RUN/metrics.jsonl (one record per "
    "log step and eval; schemas/metrics.schema.json), RUN/checkpoints/ and, with --tensorboard, "
    "RUN/tensorboard/. Prints metrics.jsonl and the last checkpoint on stdout; progress on stderr. "
    "Bad config keys, types, DeepSpeed contradictions, a tokenizer that does not fit the model, or "
    "data that ends too early fail before any compute (exit 2). One llm-train per run folder: a second one "
    "exits 2 naming the first (RUN/run.lock). With --resume the config is compared with the checkpoint's: a "
    "key that may change is applied and announced (stderr, metrics.jsonl), one that may not is refused "
    "before anything is written, naming the flag that would allow it (--reset-data, --reshard). "
    "Checkpoints: every checkpoint.save_every steps, once checkpoint.save_every_minutes (default 30) of "
    "training have passed since the last one, and at the end, so a run killed without warning loses at most "
    "about 30 minutes. Evaluation: every eval.every steps (default 0: off; it needs a valid split, llm-mix "
    "--valid-samples, and protects no work).\n" + EXAMPLES,
    no_args_is_help=True,
)
def train(
    config: str | None = typer.Argument(
        None,
        metavar="CONFIG",
        help="Train config: a shipped one by name (tiny, tiny-sft, 125m, 1b, ...; --print-config NAME shows "
        "it) or a YAML file (a path: it has a '/' or ends in .yaml/.yml). Every key: docs/config-reference.md.",
        show_default=False,
    ),
    deepspeed: str | None = typer.Option(
        None,
        "--deepspeed",
        metavar="DS",
        help="DeepSpeed JSON config (a path: a '/' or .json), or a shipped one by name (zero0 ... zero3, "
        'zero2-offload); "auto" values are filled from the train config. Required to train.',
        show_default=False,
    ),
    output: Path | None = typer.Option(
        None, "-o", "--output", help="Run folder [default: runs/<config name>]."
    ),
    set_: list[str] = typer.Option(
        [], "--set", help="Override a config key: section.key=value (repeatable)."
    ),
    resume: str | None = typer.Option(
        None, "--resume", help="Continue from a checkpoint: auto | latest | STEP | PATH."
    ),
    init_from: str | None = typer.Option(
        None,
        "--init-from",
        help="Start from these weights (a Hugging Face folder, or one of our checkpoints or run folders): "
        "the same as --set model.init_from=DIR.",
    ),
    rollback: bool = typer.Option(
        False,
        "--rollback",
        help="With --resume STEP|PATH|latest older than the run's newest checkpoint: move the newer "
        "checkpoints into RUN/checkpoints/abandoned-<time>/ (never deleted) and continue from STEP.",
    ),
    reset_data: bool = typer.Option(
        False,
        "--reset-data",
        help="With --resume: keep the step count and LR schedule, start the (new) data from its beginning "
        "(without it, a changed mix continues every source where it stopped).",
    ),
    reshard: bool = typer.Option(
        False,
        "--reshard",
        help="With --resume: accept another ZeRO stage (1 <-> 2); the optimizer state is converted through a "
        "DeepSpeed universal checkpoint.",
    ),
    tensorboard: bool = typer.Option(
        False, "--tensorboard", help="Also write TensorBoard events to RUN/tensorboard/."
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Start over in a run folder that already holds a run of llmtools (its metrics, config and "
        "checkpoints are removed; nothing else).",
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Check everything, print the resolved DeepSpeed config, train nothing."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
    print_config: str | None = typer.Option(
        None,
        "--print-config",
        help="Print a shipped train config by name (tiny, ...), or 'default': every key at its default, each "
        "with what it means and what a resume may do with it; then exit.",
        show_default=False,
    ),
    local_rank: int | None = typer.Option(
        None,
        "--local_rank",
        "--local-rank",
        hidden=True,
        help="Set by the deepspeed launcher (LOCAL_RANK is used).",
    ),
    nproc_per_node: str | None = _launcher(
        "nproc-per-node", "N", "Launch: start N workers on this node (torchrun's)."
    ),
    nnodes: str | None = _launcher(
        "nnodes", "N|MIN:MAX", "Launch: the number of nodes, or MIN:MAX for an elastic job."
    ),
    node_rank: int | None = _launcher("node-rank", "I", "Launch: this node's rank (static rendezvous)."),
    master_addr: str | None = _launcher(
        "master-addr", "HOST", "Launch: node 0's address (static rendezvous)."
    ),
    master_port: int | None = _launcher("master-port", "PORT", "Launch: node 0's port (static rendezvous)."),
    rdzv_backend: str | None = _launcher("rdzv-backend", "NAME", "Launch: the rendezvous (static | c10d)."),
    rdzv_endpoint: str | None = _launcher("rdzv-endpoint", "HOST:PORT", "Launch: the rendezvous HOST:PORT."),
    rdzv_id: str | None = _launcher("rdzv-id", "ID", "Launch: the job's id, the same on every node."),
    rdzv_conf: str | None = _launcher("rdzv-conf", "K=V,...", "Launch: rendezvous settings KEY=VALUE,..."),
    local_addr: str | None = _launcher(
        "local-addr", "HOST", "Launch: this node's address as the others reach it."
    ),
    max_restarts: int | None = _launcher(
        "max-restarts", "N", "Launch: restart failed workers up to N times."
    ),
    shutdown_timeout: int | None = _launcher(
        "shutdown-timeout", "S", "Launch: seconds the workers get to save after a stop, then SIGKILL [30]."
    ),
) -> int | None:
    launcher_options = (nproc_per_node, nnodes, node_rank, master_addr, master_port, rdzv_backend, rdzv_endpoint,
                        rdzv_id, rdzv_conf, local_addr, max_restarts, shutdown_timeout)  # fmt: skip
    if print_config is not None:
        from llmtools.train.config_reference import config_text

        if config is not None:
            raise UsageError("--print-config: give no CONFIG beside it (--print-config NAME prints one)")
        emit(config_text(print_config).removesuffix("\n"))
        return
    if any(value is not None for value in launcher_options):
        return _launch()
    if config is None:
        raise UsageError("CONFIG: missing (a shipped name such as tiny, or a YAML file; see --print-config)")
    if deepspeed is None:
        raise UsageError("--deepspeed: missing (a shipped name such as zero2, or a DeepSpeed JSON file)")
    from llmtools.resources import locate, shown
    from llmtools.train.config import load_train_config
    from llmtools.train.deepspeed_config import load_ds_config

    if reset_data and resume is None:
        raise UsageError("--reset-data: only with --resume (it restarts the data of a resumed run)")
    if rollback and (resume is None or resume.strip() == "auto"):
        raise UsageError("--rollback: only with --resume STEP, PATH or latest (auto always takes the newest)")
    if reshard and resume is None:
        raise UsageError("--reshard: only with --resume (it converts the checkpoint a run resumes from)")
    if init_from is not None:  # a spelled-out flag for the most common override
        set_ = [*set_, f"model.init_from={init_from}"]
    # Each a path, or a shipped file by name (tiny, zero2): one rule, llmtools.resources.locate.
    cfg = load_train_config(config, set_)
    ds_raw = load_ds_config(deepspeed)
    config_path, ds_path = locate("train", config), locate("deepspeed", deepspeed)
    deepspeed = shown("deepspeed", deepspeed, ds_path)
    run_dir = output or Path("runs") / config_path.stem
    from llmtools.train.loop import RunOptions

    def claim() -> None:
        _claim_run_dir(run_dir, [config_path, ds_path], cfg, force)

    options = RunOptions(
        run_dir=run_dir,
        ds_source=str(deepspeed),
        tensorboard=tensorboard,
        resume=resume,
        force=force,
        reset_data=reset_data,
        reshard=reshard,
        rollback=rollback,
        # a new run claims the run folder's entries; a resumed one continues its own
        claim=claim if resume is None else None,
    )
    if dry_run:  # every check the run makes before compute, the same list (llmtools.train.loop.CHECKS)
        from llmtools.train.distributed import detect_environment
        from llmtools.train.loop import check_before_compute

        detect_environment()
        plan = check_before_compute(cfg, ds_raw, options, cpu=True).plan
        if int(os.environ.get("RANK", "0")) != 0:  # every rank checks; one prints (as one process does)
            return
        emit(
            jsonfile.output(
                {
                    "steps": plan.steps,
                    "total_steps": plan.total_steps,
                    "seq_length": plan.seq_length,
                    "grad_accumulation": plan.grad_accumulation,
                    "num_parameters": plan.model_config.num_parameters(),
                    "deepspeed": plan.ds_config,
                },
                indent=None if json_out else 2,
            )
        )
        return

    from llmtools.train.distributed import barrier, destroy
    from llmtools.train.loop import train as run_training

    try:
        result = run_training(cfg, ds_raw, options)
        # Every rank done before any tears its connections down: a gloo peer that closes while another
        # still finishes its last writes can make that one's transport thread fail at exit.
        barrier()
    finally:
        destroy()
        skip_native_teardown()
    # Stopped by a signal before the end, its state saved and resumable: the shell's 128 + the signal,
    # on every rank (a launcher sees what one process shows), after the results; the hint comes last.
    code = 128 + signal.Signals[result.stopped].value if result.stopped else 0
    # Under llm-train's own launcher every rank hands its resume line over; each node's launcher prints
    # one, after all its workers have ended (so it is the last line).
    handed = bool(result.stop_hint) and launch_channel.keep_hint(result.stop_hint)
    if int(os.environ.get("RANK", "0")) != 0:
        return code
    if json_out:
        emit(
            jsonfile.output(
                jsonfile.nulls(
                    {
                        "run_dir": str(result.run_dir),
                        "steps": result.steps,
                        "first_loss": result.first_loss,
                        "final_loss": result.final_loss,
                        "eval_loss": result.eval_loss,
                        "checkpoint": str(result.checkpoint) if result.checkpoint else None,
                        "stopped": result.stopped,
                    }
                )
            )
        )
    else:
        emit(str(result.run_dir / "metrics.jsonl"))
        if result.checkpoint:
            emit(str(result.checkpoint))
    if result.stop_hint and not handed:
        sys.stdout.flush()
        print(result.stop_hint, file=sys.stderr, flush=True)
    return code


def _launch() -> int:
    """Launcher options given: this process runs torch's elastic agent and the workers run the rest of
    the command line (llmtools.train.launch); it exits as one process would."""
    from llmtools.train.launch import launch, split_argv

    outcome = launch(*split_argv(sys.argv[1:]))
    sys.stdout.flush()
    for line in outcome.lines:
        log(line)
    return outcome.code


def _claim_run_dir(run_dir: Path, given: list[Path], cfg, force: bool) -> None:
    """A new run writes (and --force first removes) a run folder's metrics, config and checkpoints: only
    over an earlier run of ours, never over an input. Without --force an earlier run of ours is left to
    prepare_run_dir, whose refusal says how to continue it."""
    from llmtools.cli.claim import claim, input_paths
    from llmtools.formats.indexed import strip_suffix
    from llmtools.formats.output_marks import RUN_FILES, RUN_FOLDERS, RUN_PARTS, not_ours, run_folder_entries

    data = cfg.data
    prefixes = [strip_suffix(p) for p in (data.prefixes or [])]
    inputs = [*given, data.mix, cfg.model.init_from, *cfg.task_inputs()]
    inputs += [f"{p}{suffix}" for p in prefixes for suffix in (".bin", ".idx", ".json")]
    entries = [run_dir / name for name in (*RUN_FILES, *RUN_FOLDERS)]  # a fresh run writes these
    entries += [p for p in run_folder_entries(run_dir) if p not in entries]  # --force removes these too
    if not force:
        entries = [path for path in entries if not_ours(path)]
    claim(entries, inputs=input_paths(inputs), force=force, kinds=RUN_PARTS)


def _launcher_note() -> str:
    """A rank of several, stopped by a signal before it trained: a launcher (torchrun) stops every rank
    as soon as one ends, so the signal usually means another rank ended first, its own line says why.
    Under llm-train's own launcher nothing is added: that launcher knows whose stop it was."""
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or world in (None, "", "1") or launch_channel.folder() is not None:
        return ""
    return (
        f" (rank {rank} of {world}: a launcher stops every rank once one has ended; when another rank "
        "ended first, its own message says why)"
    )


def main() -> None:
    run(app, "llm-train", interrupted_note=_launcher_note, ending=launch_channel.finish)


if __name__ == "__main__":
    main()
