"""``llm-prep decontaminate``: evaluation text out of training JSONL (lm-eval's n-gram overlap). Two
subcommands: ``index`` builds the file of evaluation n-grams once, ``run`` uses it (or builds one in
memory from ``--eval``). Registered on ``llm-prep``."""

from __future__ import annotations

import typer

from llmtools.cli._common import log, report
from llmtools.cli.prep_curate import check_documents_and_output

app = typer.Typer(
    name="decontaminate",
    help="Remove benchmark text from training JSONL, as lm-eval's decontamination finds it (index, run).",
    no_args_is_help=True,
    add_completion=False,
)

INDEX_HELP = """Build the index of evaluation n-grams (once; every run then memory-maps it).

\b
EVAL: a task file (JSONL of multiple-choice {context, choices, gold} or perplexity {text} examples:
the files llm-ckpt eval reads), a folder of them (each *.jsonl one task), plain JSONL with --key
(the string under KEY of each line is one text), or a text file (the whole file one text). Each file
is one task, named after the file. n-grams are made as lm-eval's Janitor makes them: ASCII letters
lowered, punctuation deleted, split on whitespace, --ngram words (13).

\b
Examples:
  llm-prep decontaminate index tasks/ -o eval.ngrams
  llm-prep decontaminate index mmlu.jsonl gsm8k.jsonl --key question -o qa.ngrams --ngram 8
"""

RUN_HELP = """Remove (--mode drop) or cut out (--mode cut) evaluation n-grams from training documents.

\b
INPUT: JSONL files, globs, @list.txt, - for stdin; .gz/.zst (as json2bin reads them).
--index FILE: an index from `llm-prep decontaminate index`; or --eval PATH (repeatable, as the index
command's EVAL) to build one in memory for this run.
--mode drop removes every document holding an evaluation n-gram. --mode cut removes the contaminated
spans as lm-eval's Janitor.clean does: --window characters on each side of each n-gram, kept pieces
longer than --min-chunk characters joined with nothing between them, and a document with more than
--too-dirty contaminated n-grams removed whole (defaults 200, 200, 10: lm-eval's).
-o OUT: the kept documents (- for stdout, then --stats is required); beside it OUT.removed (per
document: the rule, the tasks hit, the first n-gram hit as it stands in the document) and
OUT.stats.json (its steps[0].report: per task, documents and characters hit, dropped or cut).
--shard I/N, --skip-bad, --force: as llm-prep filter.

\b
Examples:
  llm-prep decontaminate run corpus.jsonl --index eval.ngrams -o clean.jsonl
  llm-prep decontaminate run raw.jsonl --eval tasks/ --mode cut -o clean.jsonl
  llm-prep decontaminate run raw.jsonl --index eval.ngrams -o - --stats dc.stats.json \\
      | llm-prep json2bin - -t tok/ -o data/web --provenance dc.stats.json
  llm-prep decontaminate run @files.txt --index eval.ngrams -o out/web.jsonl --shard 3/64
"""


@app.command("index", help=INDEX_HELP, no_args_is_help=True)
def index_cmd(
    evals: list[str] = typer.Argument(None, help="Task files, task folders, JSONL (--key) or text files.", metavar="EVAL..."),
    output: str = typer.Option(None, "-o", "--output", help="The index file to write."),
    ngram: int = typer.Option(13, "--ngram", help="Words per n-gram (lm-eval: 13)."),
    key: str = typer.Option(None, "--key", help="Read JSONL evaluation files as plain JSON lines, the text under KEY."),
    force: bool = typer.Option(False, "--force", help="Replace an earlier index of ours."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout instead of the path."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress and no summary on stderr."),
) -> None:  # fmt: skip
    import time

    from llmtools.cli.claim import claim, input_paths
    from llmtools.errors import UsageError
    from llmtools.prep.curate.decontam.build import IndexResult, index_output, write_index
    from llmtools.prep.curate.decontam.sources import open_sources

    if not output:
        raise UsageError("-o/--output: give the index file to write (e.g. eval.ngrams)")
    sources = open_sources(list(evals or []), key)
    out = index_output(output, force)
    claim(out.claimed(), inputs=input_paths(evals), force=force)
    started = time.perf_counter()
    with out:
        header = write_index(sources, ngram, out.path(output), progress=not quiet)
        paths = out.commit()
    report(
        "llm-prep decontaminate index",
        IndexResult(paths, header, time.perf_counter() - started),
        as_json,
        quiet,
    )


@app.command("run", help=RUN_HELP, no_args_is_help=True)
def run_cmd(
    inputs: list[str] = typer.Argument(None, help="JSONL files, globs, @list.txt, or - for stdin.", metavar="INPUT..."),
    output: str = typer.Option(None, "-o", "--output", help="The kept documents (JSONL), or - for stdout."),
    index: str = typer.Option(None, "--index", help="An index from llm-prep decontaminate index."),
    evals: list[str] = typer.Option(None, "--eval", help="Evaluation sets to index in memory (instead of --index)."),
    ngram: int = typer.Option(None, "--ngram", help="Words per n-gram with --eval (default 13; an index has its own)."),
    key: str = typer.Option(None, "--key", help="With --eval: read JSONL evaluation files as plain JSON lines, the text under KEY."),
    mode: str = typer.Option("drop", "--mode", help="drop: remove the document; cut: remove the spans (lm-eval's Janitor)."),
    window: int = typer.Option(200, "--window", help="cut: characters removed on each side of an n-gram."),
    min_chunk: int = typer.Option(200, "--min-chunk", help="cut: a kept piece must be longer than this."),
    too_dirty: int = typer.Option(10, "--too-dirty", help="cut: more contaminated n-grams than this remove the document."),
    stats: str = typer.Option(None, "--stats", help="The stats JSON (default OUT.stats.json; required with -o -)."),
    removed: str = typer.Option(None, "--removed", help="The removed documents (default OUT.removed, or beside --stats)."),
    text_key: str = typer.Option("text", "--text-key", help="The key that holds the text."),
    keep_removed_text: bool = typer.Option(False, "--keep-removed-text", help="Write removed texts into OUT.removed."),
    shard: str = typer.Option(None, "--shard", metavar="I/N", help="Only shard I of N (from 0); default: the Slurm array task's."),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Skip bad lines and files, counting them, instead of stopping."),
    force: bool = typer.Option(False, "--force", help="Replace earlier outputs of llmtools (and a killed run's leftovers)."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout instead of paths."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress and no summary on stderr."),
) -> None:  # fmt: skip
    import os

    from llmtools.cli.claim import claim, input_paths
    from llmtools.errors import UsageError
    from llmtools.prep.curate.decontam.build import open_index
    from llmtools.prep.curate.decontam.match import CutRules
    from llmtools.prep.curate.decontam.step import MODES, Decontaminate
    from llmtools.prep.curate.run import CurationConfig, run_curation
    from llmtools.prep.shards import parse_shard, shard_from_environment

    check_documents_and_output(inputs, output, as_json)
    if (index is None) == (not evals):
        raise UsageError("give the evaluation n-grams: --index FILE, or --eval PATH (not both)")
    if index is not None and (ngram is not None or key is not None):
        raise UsageError("--ngram and --key go with --eval; an index was built with its own")
    if mode not in MODES:
        raise UsageError(f"--mode: expected one of {', '.join(MODES)}, got {mode!r}")
    for flag, value in (("--window", window), ("--min-chunk", min_chunk), ("--too-dirty", too_dirty)):
        if value < 0:
            raise UsageError(f"{flag}: expected a number >= 0, got {value}")
    spec = parse_shard(shard) if shard is not None else shard_from_environment(os.environ)
    if spec is not None and shard is None and not quiet:
        log(f"llm-prep decontaminate: shard {spec} from {spec.origin}")
    config = CurationConfig(
        inputs=list(inputs), output=output, stats=stats, removed=removed, text_key=text_key,
        command="decontaminate", keep_removed_text=keep_removed_text, skip_bad=skip_bad, force=force,
        shard=spec, progress=False if quiet else None,
    )  # fmt: skip
    claim(
        config.paths().dataset_output(force).claimed(),
        inputs=input_paths([*inputs, index, *(evals or [])]),
        force=force,
    )
    rules = CutRules(window=window, min_chunk=min_chunk, too_dirty=too_dirty)
    with open_index(index, list(evals or []), ngram or 13, key, progress=not quiet) as (ngrams, described):
        step = Decontaminate(ngrams, mode, rules)
        params = {
            **described,
            "mode": mode,
            **({"window": window, "min_chunk": min_chunk, "too_dirty": too_dirty} if mode == "cut" else {}),
        }
        result = run_curation(config, [step], [{"name": step.name, "params": params}])
    if output == "-":
        if not quiet:
            log(f"llm-prep decontaminate: {result.summary()}")
        return
    report("llm-prep decontaminate", result, as_json, quiet)


def register(parent: typer.Typer) -> None:
    parent.add_typer(app, name="decontaminate")
