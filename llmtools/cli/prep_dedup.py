"""``llm-prep dedup``: exact and MinHash near-duplicate removal, in stages for a Slurm array.
Registered on ``llm-prep``."""

from __future__ import annotations

import typer

from llmtools.cli._common import emit, report

DEDUP_HELP = """Remove duplicate documents: identical texts (exact) and MinHash LSH near duplicates, as
datatrove's MinHash pipeline finds and removes them (FineWeb's settings by default).

\b
Stages (STAGE, first argument; default all):
  signatures  one unit per input: MinHash signatures (word 5-grams of datatrove's simplified text,
              xxhash 64-bit, 14 bands x 8 hashes) and the hash of the normalised text
  buckets     one unit per band (+ one for exact): pairs of documents with an equal band
  clusters    one task: union-find over the pairs; which member of each cluster stays
  apply       one unit per input: the kept documents, the removed ones, the stats
  all         the four in order, on this machine
--shard I/N (or the Slurm array variables) runs shard I of N of a stage (signatures and apply:
the inputs as json2bin cuts them; buckets: a range of bands); configs/slurm/dedup-*.sbatch run them
on arrays. A killed stage, run again, redoes only what is missing. Every stage takes the same inputs
and options (checked against OUT/plan.json); stages after signatures may leave them out.

\b
INPUT: JSONL files, globs, @list.txt (.gz/.zst read directly); not stdin (read more than once).
--source NAME=FILES (repeatable) dedups several sources together: a document in two of them is kept
in the one named first, removed from the other, and counted once; the stats say how many documents
each pair of sources shared. Plain INPUT arguments form a source named "corpus".
Kept: the cluster member datatrove keeps (the root of its union-find: union by size over the pairs in
band order); across sources, a member of the first-ranked source. Exact duplicates: texts equal after
Unicode NFC and collapsing whitespace (128-bit BLAKE2b); they also join texts too short for a shingle.

\b
-o OUT (a folder):
  OUT/kept/SOURCE/NNNNNN-NAME.jsonl   kept lines, byte for byte as read (one per input)
        ... .removed                  one JSON line per removed document: place, rule, cluster, kept one
        ... .stats.json               curation stats of that output (json2bin --provenance takes it)
  OUT/clusters.jsonl                  one line per cluster: id, size, members, the kept one
  OUT/stats.json                      per source: exact and near duplicates, bytes removed; per pair
                                      of sources; the pairs of each band; the config and its curve
  OUT/plan.json, OUT/work/            the run's record and the stages' files
--explain prints the LSH threshold (1/b)^(1/r) and the probability 1-(1-s^r)^b of catching a pair of
Jaccard similarity s, then exits. With --plan-tokens N and INPUT (a sample of the corpus), it also
dedups the sample in a temporary folder and prints the stage plan of a run over N tokens in --tasks
tasks: per stage the tasks, bytes read and written and memory per task, scaled from the sample.
Bad lines stop with FILE:LINE and exit 2; --skip-bad skips and counts them (as llm-prep filter).

\b
Examples:
  llm-prep dedup 'crawl/*.jsonl.zst' -o dedup/
  llm-prep dedup --source wiki='wiki/*.jsonl' --source web=@web-files.txt -o dedup/
  llm-prep dedup --explain --bands 20 --rows 5
  llm-prep dedup --explain --plan-tokens 15T --tasks 1000 'crawl/sample/*.jsonl'
  llm-prep dedup signatures 'crawl/*.jsonl' -o dedup/ --shard 3/64     # a Slurm array task
  llm-prep dedup buckets -o dedup/ --shard 0/15 && llm-prep dedup clusters -o dedup/
"""


def dedup_cmd(
    args: list[str] = typer.Argument(None, help="[STAGE] then INPUT files, globs or @list.txt.", metavar="[STAGE] [INPUT]..."),
    output: str = typer.Option(None, "-o", "--output", help="The run folder (kept documents, clusters, stats)."),
    sources: list[str] = typer.Option(None, "--source", metavar="NAME=FILES", help="A named source (repeatable, first ranked first)."),
    text_key: str = typer.Option("text", "--text-key", help="The key that holds the text."),
    n_grams: int = typer.Option(5, "--n-grams", help="Words per shingle."),
    bands: int = typer.Option(14, "--bands", help="LSH bands (datatrove's num_buckets)."),
    rows: int = typer.Option(8, "--rows", help="Hashes per band (datatrove's hashes_per_bucket)."),
    seed: int = typer.Option(1, "--seed", help="Seed of the permutations (datatrove's)."),
    hash_fc: str = typer.Option("xxhash", "--hash", help="Shingle hash: xxhash or sha1."),
    precision: int = typer.Option(64, "--precision", help="Bits of the hashes: 64 or 32."),
    exact: bool = typer.Option(True, "--exact/--no-exact", help="Also remove identical normalised texts."),
    near: bool = typer.Option(True, "--near/--no-near", help="MinHash near duplicates."),
    norm_weekdays: bool = typer.Option(False, "--norm-weekdays", help="Simplified text: weekday names as one word."),
    norm_months: bool = typer.Option(False, "--norm-months", help="Simplified text: month names as one word."),
    shard: str = typer.Option(None, "--shard", metavar="I/N", help="Only shard I of N of the stage (from 0); default: the Slurm array task's."),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Skip bad lines and files, counting them, instead of stopping."),
    explain: bool = typer.Option(False, "--explain", help="Print the LSH threshold and catch probabilities; exit."),
    plan_tokens: str = typer.Option(None, "--plan-tokens", metavar="N", help="With --explain and a sample INPUT: the stage plan for a corpus of N tokens (15T)."),
    tasks: int = typer.Option(1000, "--tasks", min=1, help="With --plan-tokens: the tasks of each array."),
    bytes_per_token: float = typer.Option(4.0, "--bytes-per-token", min=0.01, help="With --plan-tokens: input bytes per token of the corpus."),
    force: bool = typer.Option(False, "--force", help="Start again in an OUT of an earlier dedup run with other inputs or options."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout instead of paths."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress and no summary on stderr."),
) -> None:  # fmt: skip
    import os
    from dataclasses import replace
    from pathlib import Path

    from llmtools.errors import UsageError
    from llmtools.formats import jsonfile
    from llmtools.prep.curate.dedup.config import DedupConfig
    from llmtools.prep.curate.dedup.layout import parse_sources
    from llmtools.prep.curate.dedup.normalise import TextNorm
    from llmtools.prep.curate.dedup.run import STAGES, open_run, run_dedup
    from llmtools.prep.shards import parse_shard, shard_from_environment

    norm = replace(TextNorm(), norm_weekdays=norm_weekdays, norm_monthnames=norm_months)
    config = DedupConfig(n_grams=n_grams, bands=bands, rows=rows, seed=seed, hash_fc=hash_fc, precision=precision,
                         norm=norm, exact=exact, near=near, text_key=text_key)  # fmt: skip
    args = list(args or [])
    stage = args.pop(0) if args and args[0] in STAGES else "all"
    if explain:
        info, text = config.explain(), _explain_text(config)
        if plan_tokens is not None:
            from llmtools.cli.mix_args import parse_count
            from llmtools.prep.curate.dedup import forecast

            if not (args or sources):
                raise UsageError("--plan-tokens: give INPUT files, a sample of the corpus, to measure")
            tokens = parse_count(plan_tokens, "--plan-tokens")
            measured = forecast.measure(config, parse_sources(sources or [], args), skip_bad)
            info["plan"] = forecast.stage_plan(config, measured, tokens, tasks, bytes_per_token)
            text += "\n" + forecast.plan_text(info["plan"])
        emit(jsonfile.output(info, indent=1) if as_json else text)
        return
    if not output:
        raise UsageError("-o/--output: give the run folder")
    spec = parse_shard(shard) if shard is not None else shard_from_environment(os.environ)
    given = parse_sources(sources or [], args) if (args or sources) else []
    plan = open_run(Path(output), config, given, skip_bad, force)
    result = run_dedup(Path(output), plan, stage, spec, progress=not quiet)
    report("llm-prep dedup", result, as_json, quiet)


def _explain_text(config) -> str:
    info = config.explain()
    lines = [
        f"MinHash LSH: {config.bands} bands x {config.rows} hashes, word {config.n_grams}-grams, "
        f"{config.hash_fc} {config.precision}-bit, seed {config.seed}",
        f"estimated Jaccard threshold (1/b)^(1/r): {info['threshold']:.4f}",
        "probability of catching a pair of Jaccard similarity s, 1-(1-s^r)^b:",
    ]
    lines += [f"  s={s}: {p:.4f}" for s, p in info["catch_probability"].items()]
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add ``dedup`` to the ``llm-prep`` app."""
    app.command("dedup", help=DEDUP_HELP, no_args_is_help=True)(dedup_cmd)
