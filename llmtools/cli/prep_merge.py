"""``llm-prep merge``: many tokenized datasets -> one, in bounded memory. Registered on ``llm-prep``."""

from __future__ import annotations

import typer

from llmtools.cli._common import log, report

DATASET_FILES = (".bin", ".idx", ".json")

MERGE_HELP = """Concatenate tokenized datasets (.bin/.idx) into one, in the order given, in bounded memory.

The output is byte for byte what Megatron-LM's tools/merge_datasets.py writes for the same datasets in
the same order (megatron-core's IndexedDatasetBuilder.add_index + finalize), without holding the
index in memory: sizes and document indices stream through, the token bytes are copied by the
kernel (copy_file_range). Writes OUT.bin, OUT.idx and a merged sidecar OUT.json (tokenizer, the
inputs of every part, summed counts, the parts it came from) and prints their paths.

PREFIX: dataset prefixes (foo, foo.bin or foo.idx), globs ('data/web-*_text_document',
'shards/*.idx'; sorted), or @list.txt (one prefix or glob per line, # comments). Megatron's spelling
--input DIR (every dataset in DIR, sorted by name) works too.

Refused with exit 2 and nothing written: a missing or corrupt input (index checked in full as it
streams), different token dtypes or tokenizers (naming the first offender), and for shards of one
json2bin --shard run, a shard missing or given twice (--partial for a staged merge of some shards;
the output records which shards it holds, and a later merge checks the rest).

\b
Examples:
  llm-prep merge 'data/web-*-of-00064_text_document' -o data/web_text_document
  llm-prep merge @shards.txt -o data/all_text_document --json
  llm-prep merge --input shards/ --output-prefix data/merged_text_document     # merge_datasets.py's flags
  llm-prep merge 'data/web-0000[0-3]-of-00008_text_document' -o stage/a --partial
"""


def merge_cmd(
    prefixes: list[str] = typer.Argument(
        None, metavar="PREFIX...", help="Datasets to concatenate, in order: prefixes, globs, @list.txt."
    ),
    output: str = typer.Option(
        None, "-o", "--output", "--output-prefix", help="Output prefix: writes OUT.bin, OUT.idx, OUT.json."
    ),
    input_dir: str = typer.Option(
        None, "--input", metavar="DIR", help="Megatron's spelling: every dataset in DIR, sorted by name."
    ),
    partial: bool = typer.Option(
        False, "--partial", help="Allow some shards of a json2bin --shard run only (a staged merge)."
    ),
    multimodal: bool = typer.Option(False, "--multimodal", hidden=True),
    force: bool = typer.Option(
        False,
        "--force",
        help="Replace an earlier llmtools output (and remove a killed run's .tmp-* leftovers).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout instead of paths."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress bar and no summary on stderr."),
) -> None:
    import glob
    import os

    from llmtools.errors import UsageError
    from llmtools.prep.merge import merge

    if multimodal:
        raise UsageError("--multimodal: merging multimodal datasets (per-sequence modes) is not supported")
    if output is None:
        raise UsageError("-o/--output OUT is required")
    items = list(prefixes or [])
    if input_dir is not None:
        if not os.path.isdir(input_dir):
            raise UsageError(
                f"--input {input_dir}: not a directory (merge_datasets.py's --input is a folder)"
            )
        items.append(os.path.join(glob.escape(input_dir), "*"))
    if not items:
        raise UsageError("give the datasets to merge: PREFIX... (globs, @list.txt) or --input DIR")
    from llmtools.cli.claim import claim, input_paths
    from llmtools.formats.pathlists import expand_prefixes
    from llmtools.prep.merge import merge_output

    sources = [f"{p}{suffix}" for p in expand_prefixes(items) for suffix in DATASET_FILES]
    # the pair's markers are claimed too: they are written when no input has a sidecar
    claim(merge_output(output).claimed(), inputs=input_paths([*items, *sources]), force=force)
    result = merge(items, output, force=force, partial=partial, progress=False if quiet else None)
    for note in result.notes:
        log(f"llm-prep merge: note: {note}")
    report("llm-prep merge", result, as_json, quiet)


def register(app: typer.Typer) -> None:
    """Add ``merge`` to the ``llm-prep`` app."""
    app.command("merge", help=MERGE_HELP, no_args_is_help=True)(merge_cmd)
