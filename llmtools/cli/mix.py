"""``llm-mix``: blend tokenized sources by weight into a deterministic sample plan (mix.json + index cache).

The library (the planner and what it imports) is imported inside the commands, so ``--help`` stays cheap.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from llmtools.cli._common import emit, expand_multi_value_flags, log, new_app, run
from llmtools.formats import jsonfile

HELP = """Blend tokenized .bin/.idx sources into a sample plan, exactly as Megatron-LM would.

Writes mix.json (sources, weights, realized shares, epochs, samples per split, seed, split, the
tokenizer from the sidecars, the hash naming the index cache) and the index cache in one folder beside
it (mix.cache/ for mix.json; delete it freely, a run rebuilds it): the GPTDataset document / sample /
shuffle index of every source and split and the blend's dataset index and dataset sample index, as
.npy files named by the hash. The arrays equal those of
megatron-core 0.16 (BlendedMegatronDatasetBuilder, 2025-02+ surplus) for the same inputs.
Written paths go to stdout, one per line (mix.json first); --explain prints a table instead.

Megatron's spelling works too: --data-path 0.7 A 0.3 B (or prefixes only, weighed by size), and
per-split blends with --train-data-path / --valid-data-path / --test-data-path.

A mixture schedule blends the train split in stages: --stage UNTIL WEIGHTS... once per stage, each
running from the end of the one before until UNTIL (step:N with --global-batch-size, tokens:T,
samples:N, a share of the plan like 90%, or end). Within a stage the blend is Megatron's for its
weights; every source continues its own sample order across stages (nothing repeated or skipped until
its epoch ends). A weight of 0 leaves a source out of a stage; WEIGHTS may be @FILE, the weights
listed in FILE (a blend of many sources). The valid and test splits take --weights, or the last
stage's weights. --explain prints each stage.

Many sources: a PREFIX may be a glob ('shards/web-*_text_document', 'shards/*.idx'; sorted) or
@list.txt (one prefix or glob per line); --weights then needs one weight per dataset named. A
--data-path value @FILE (or --data-args-path FILE, as Megatron spells it) reads the blend from FILE
('0.7 A 0.3 B', whitespace or newlines; # comments); globs there are for unweighted lists. With
more than 20 sources --explain groups them by folder.

\b
Examples:
  llm-mix data/wiki_text_document data/code_text_document --weights 0.7,0.3 \\
      --seq-length 2048 --num-samples 100000 -o out/mix.json
  llm-mix --data-path 0.7 data/wiki_text_document 0.3 data/code_text_document \\
      --seq-length 2048 --tokens 2B --valid-samples 2000 -o out/mix.json --explain
  llm-mix data/wiki_text_document --seq-length 1024 --num-samples 5000 --explain   # dry run
  llm-mix --train-data-path 1 data/wiki 1 data/code --valid-data-path data/held_out \\
      --seq-length 2048 --num-samples 50000 --valid-samples 500 -o mix.json
  llm-mix data/a data/b --weights 0.9,0.1 --seq-length 512 --num-samples 1000 \\
      -o mix.json --materialize out/train_samples      # also the blended samples as .bin/.idx
  llm-mix data/web data/code data/hq --seq-length 2048 --tokens 2B -o mix.json \\
      --stage 90% 0.7,0.3,0 --stage end 0.3,0.2,0.5   # anneal on hq in the last 10% of tokens
  llm-mix data/web data/code --seq-length 1024 --num-samples 64K --global-batch-size 64 \\
      --stage step:800 0.8 0.2 --stage end 0.5 0.5 --explain
  llm-mix 'shards/*_text_document' --seq-length 2048 --tokens 100B -o out/mix.json --explain
  llm-mix @shards.txt --seq-length 2048 --tokens 100B -o out/mix.json \
      --stage 90% @pretrain_weights.txt --stage end @anneal_weights.txt   # one weight per shard
  llm-mix --data-path @blend.txt --seq-length 4096 --num-samples 1M -o out/mix.json
"""

app = new_app("llm-mix", "Blend tokenized sources into a Megatron-identical sample plan.")

# Megatron's flags take a variable number of values; click options take one. main() rewrites
# `--data-path 0.7 A 0.3 B` into `--data-path 0.7 --data-path A ...` before typer sees it.
MULTI_VALUE_FLAGS = ("--data-path", "--train-data-path", "--valid-data-path", "--test-data-path")
# `--stage UNTIL W1 W2 ...` keeps its values together: one `--stage "UNTIL W1 W2 ..."` per stage.
GROUPED_FLAGS = ("--stage",)


@app.command(help=HELP, no_args_is_help=True)
def mix(
    prefixes: list[str] = typer.Argument(
        None, metavar="PREFIX...", help="Tokenized datasets (foo, foo.bin or foo.idx)."
    ),
    weights: str = typer.Option(
        None,
        "--weights",
        "-w",
        metavar="W1,W2,...",
        help="One weight per PREFIX, comma-separated (normalised); default: by size.",
    ),
    output: Path = typer.Option(
        None, "-o", "--output", metavar="MIX.json", help="mix.json to write (the index cache goes in MIX.cache/ beside it)."
    ),
    seq_length: str = typer.Option(
        None,
        "--seq-length",
        metavar="N",
        help="Tokens per sample (each sample holds one more, as in Megatron).",
    ),
    num_samples: str = typer.Option(
        None, "--num-samples", metavar="N", help="Training samples (10000, 10K, 2M)."
    ),
    tokens: str = typer.Option(
        None,
        "--tokens",
        metavar="T",
        help="Training tokens instead: samples = ceil(T / seq-length) (2B, 500M).",
    ),
    valid_samples: str = typer.Option(
        "0", "--valid-samples", metavar="N", help="Samples of the valid split (0: none)."
    ),
    test_samples: str = typer.Option(
        "0", "--test-samples", metavar="N", help="Samples of the test split (0: none)."
    ),
    seed: str = typer.Option("1234", "--seed", metavar="N", help="Seed of the shuffles (Megatron's --seed)."),
    split: str = typer.Option(
        "969,30,1",
        "--split",
        metavar="TRAIN,VALID,TEST",
        help="Train,valid,test proportions of each source's sequences.",
    ),
    data_path: list[str] = typer.Option(
        None,
        "--data-path",
        metavar="[W] PREFIX ...",
        help="Megatron spelling: W1 PREFIX1 W2 PREFIX2 ... (or prefixes only).",
    ),
    train_data_path: list[str] = typer.Option(
        None,
        "--train-data-path",
        metavar="[W] PREFIX ...",
        help="Per-split blend for train (Megatron spelling).",
    ),
    valid_data_path: list[str] = typer.Option(
        None, "--valid-data-path", metavar="[W] PREFIX ...", help="Per-split blend for valid."
    ),
    test_data_path: list[str] = typer.Option(
        None, "--test-data-path", metavar="[W] PREFIX ...", help="Per-split blend for test."
    ),
    data_args_path: str = typer.Option(
        None, "--data-args-path", metavar="FILE", help="Megatron: the --data-path blend read from FILE."
    ),
    explain: bool = typer.Option(
        False, "--explain", help="Print per source: requested vs realized share, epochs, tokens, warnings."
    ),
    materialize: str = typer.Option(
        None,
        "--materialize",
        metavar="PREFIX",
        help="Also write the train split's samples, in plan order, as PREFIX.bin/.idx.",
    ),
    allow_mixed_tokenizers: bool = typer.Option(
        False, "--allow-mixed-tokenizers", help="Blend sources whose sidecars name different tokenizers."
    ),
    max_epochs: float = typer.Option(
        4.0, "--max-epochs", metavar="E", help="Warn when a source is repeated more than this many epochs."
    ),
    surplus: float = typer.Option(
        0.005, "--surplus", metavar="S", help="Megatron's mid_level_dataset_surplus."
    ),
    stage: list[str] = typer.Option(
        None,
        "--stage",
        metavar="UNTIL WEIGHTS...",
        help="A stage of the train split's mixture schedule, until UNTIL (step:N, tokens:T, samples:N, "
        "90%, end) with one weight per PREFIX (repeat, in order).",
    ),
    global_batch_size: str = typer.Option(
        None,
        "--global-batch-size",
        metavar="N",
        help="Samples per training step: turns stage ends given in steps into samples.",
    ),
    force: bool = typer.Option(False, "--force", help="Replace earlier outputs of llmtools."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout instead of paths."),
) -> None:
    from llmtools.cli import mix_args
    from llmtools.cli.claim import claim
    from llmtools.data import mix as lib
    from llmtools.data.mix_json import plan_to_json
    from llmtools.errors import UsageError
    from llmtools.formats.indexed import strip_suffix
    from llmtools.formats.output_marks import marker_path

    if output is None and not explain:
        raise UsageError("-o/--output mix.json is required (or --explain for a dry run)")
    if materialize and output is None:
        raise UsageError("--materialize needs -o/--output")
    if seq_length is None:
        raise UsageError("--seq-length is required")
    if data_args_path is not None:
        if data_path:
            raise UsageError("give either --data-path or --data-args-path, not both")
        data_path = [f"@{data_args_path}"]
    per_split = {
        name: mix_args.read_data_path(values, flag)
        for name, values, flag in (
            ("train", train_data_path, "--train-data-path"),
            ("valid", valid_data_path, "--valid-data-path"),
            ("test", test_data_path, "--test-data-path"),
        )
        if values
    }
    blend = None
    if data_path:
        if prefixes or weights:
            raise UsageError("give either PREFIX... [--weights] or --data-path, not both")
        blend = mix_args.read_data_path(data_path, "--data-path")
    elif prefixes:
        from llmtools.formats.pathlists import expand_prefixes

        blend = lib.Blend(expand_prefixes(prefixes), mix_args.parse_weights(weights))
    elif weights:
        raise UsageError("--weights given but no PREFIX")
    if blend is not None and per_split:
        raise UsageError(
            "per-split blends (--train-data-path ...) replace PREFIX.../--data-path; give one or the other"
        )
    if blend is None and not per_split:
        raise UsageError("no data: give PREFIX... (or --data-path / --train-data-path)")
    if not (0 < max_epochs < float("inf")):
        raise UsageError(f"--max-epochs must be a positive finite number, not {max_epochs}")
    for name, each in [("PREFIX...", blend), *[(f"--{k}-data-path", b) for k, b in per_split.items()]]:
        _refuse_duplicates(each, name)
    config = lib.MixConfig(
        blend=blend,
        blend_per_split=per_split or None,
        seq_length=mix_args.parse_count(seq_length, "--seq-length"),
        num_samples=mix_args.parse_count(num_samples, "--num-samples"),
        tokens=mix_args.parse_count(tokens, "--tokens"),
        valid_samples=mix_args.parse_count(valid_samples, "--valid-samples", allow_zero=True),
        test_samples=mix_args.parse_count(test_samples, "--test-samples", allow_zero=True),
        seed=mix_args.parse_count(seed, "--seed", allow_zero=True),
        split=split,
        surplus=surplus,
        allow_mixed_tokenizers=allow_mixed_tokenizers,
        max_epochs=max_epochs,
        stages=mix_args.parse_stages(stage),
        global_batch_size=mix_args.parse_count(global_batch_size, "--global-batch-size"),
    )
    _refuse_impossible_size(config)
    outputs = [output] if output else []
    if materialize:
        written_prefix = [Path(f"{materialize}{suffix}") for suffix in (".bin", ".idx", ".json")]
        outputs += [*written_prefix, *map(marker_path, written_prefix[:2])]
    blends = [blend, *per_split.values()]
    sources = [strip_suffix(p) for b in blends if b is not None for p in b.prefixes]
    from llmtools.cli import mix_explain
    from llmtools.dirfd import refuse_link
    from llmtools.formats.mix import cache_folder_name
    from llmtools.locks import lock_output, remove_dead_temporaries_in

    # One writer per mix.json and per materialized prefix, from the existence check to the last rename.
    with lock_output([p for p in (output, materialize) if p]):
        if output is not None:  # its cache folder is this mix.json's alone: a killed writer's leftovers go
            remove_dead_temporaries_in(refuse_link(Path(output).parent / cache_folder_name(output)))
        inputs = [f"{p}{suffix}" for p in sources for suffix in (".bin", ".idx", ".json")]
        # the @FILE lists the command line names (sources, --data-path, stage weights) are inputs too
        flags = (prefixes, data_path, train_data_path, valid_data_path, test_data_path, stage)
        words = [word for values in flags for v in values or [] for word in str(v).replace(",", " ").split()]
        list_files = [word[1:] for word in words if word.startswith("@") and len(word) > 1]
        claim(outputs, inputs=[*inputs, *list_files], force=force)

        plan = lib.build_plan(config)
        # Said once, on stderr with the other diagnostics (--explain's table on stdout holds none of them).
        for note in mix_explain.fold(plan.notes):
            log(f"llm-mix: note: {note}")
        for warning in mix_explain.fold(plan.warnings):
            log(f"llm-mix: warning: {warning}")
        written: list[Path] = []
        if output is not None:  # mix.json is written last, after the cache and the materialized samples
            written += lib.save_plan(plan, output, materialize_to=materialize)
    if as_json:
        summary = plan_to_json(plan)
        summary.pop("config", None)
        summary["written"] = [str(p) for p in written]
        emit(jsonfile.output(summary))
    elif explain:
        emit(mix_explain.explain(plan))
        if len(written) > mix_explain.GROUP_OVER:
            log(f"llm-mix: wrote {written[0]} and {len(written) - 1} index cache files in {written[1].parent}")
        else:
            for path in written:
                log(f"llm-mix: wrote {path}")
    else:
        for path in written:
            emit(str(path))


def _refuse_duplicates(blend, flag: str) -> None:
    """The same source twice in one blend is almost always a slip (and would be sampled as two sources)."""
    if blend is None:
        return

    from llmtools.errors import UsageError
    from llmtools.formats.indexed import strip_suffix

    seen: dict[str, int] = {}
    for i, prefix in enumerate(blend.prefixes):
        key = os.path.realpath(strip_suffix(prefix))
        if key in seen:
            raise UsageError(
                f"{flag}: source {prefix!r} is given twice (positions {seen[key] + 1} and {i + 1}); "
                "give it once, with the sum of the weights"
            )
        seen[key] = i


BYTES_PER_SAMPLE = 34
"""At least what the plan's arrays take per sample: the blend's dataset index (2 bytes) and sample index
(8), and per source the sample index (8-16), shuffle index (8) and document index."""


def _refuse_impossible_size(config) -> None:
    """A sample count whose index arrays cannot fit in this machine's memory is refused by name, before
    numpy tries ("Unable to allocate 7.89 TiB")."""
    import math

    import psutil

    from llmtools.errors import UsageError

    train = config.num_samples or math.ceil((config.tokens or 0) / config.seq_length)
    total = train + (config.valid_samples or 0) + (config.test_samples or 0)
    need, have = total * BYTES_PER_SAMPLE, psutil.virtual_memory().total
    if need > have:
        flag = "--tokens" if config.tokens is not None else "--num-samples"
        raise UsageError(
            f"{flag}: {total:,} samples need at least {need / 2**30:,.1f} GiB for the plan's index arrays "
            f"({BYTES_PER_SAMPLE} bytes a sample); this machine has {have / 2**30:,.1f} GiB"
        )


def main(argv: list[str] | None = None) -> None:
    sys.argv[1:] = expand_multi_value_flags(
        list(sys.argv[1:] if argv is None else argv), MULTI_VALUE_FLAGS, grouped=GROUPED_FLAGS
    )
    run(app, "llm-mix")


if __name__ == "__main__":
    main()
