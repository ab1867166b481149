"""``llm-prep filter``: quality rules, language identification, PII scrubbing and length bounds over JSONL.
Registered on ``llm-prep``."""

from __future__ import annotations

import typer

from llmtools.cli._common import emit, log, report

FILTER_HELP = """Curate JSONL documents: remove those a rule rejects, scrub PII, keep the rest as they were.

Steps run in this order over each document, stopping at the first that removes it: length bounds
(--min-chars ... --max-tokens), language (--language), the quality rules (--recipe, then each --rule
in the order given), PII (--pii, which changes text and removes nothing). --set RULE.PARAM=VALUE sets a
parameter of any rule that runs (llm-prep filter --list-rules shows them all, with their defaults).

\b
INPUT: JSONL files, globs, @list.txt, - for stdin; .gz/.zst read directly (as json2bin reads them).
-o OUT: the kept documents, unchanged byte for byte unless a step changed their text or added
metadata; then the record is written again, its other keys as they were, with what the steps added
(language, language_score) in its "metadata" object (datatrove's place for it). -o - writes them to
stdout, for a pipe into llm-prep json2bin -; then --stats PATH is required.
Beside the output (written when the run completes, never half):
  OUT.removed      one JSON line per removed document: source, line, id (if the record has one),
                   step, rule, the measured values; its text too with --keep-removed-text
  OUT.stats.json   per rule: documents, characters and share removed; per language; text changes
                   per step (pass it to llm-prep json2bin --provenance to carry it into the sidecar)
--language en,de keeps documents whose score in one of them is above --language-threshold (0.65):
the score is py3langid's probability, decided as datatrove's LanguageFilter decides.
--pii email,ip[,phone] replaces e-mail and public IP addresses exactly as datatrove's PIIFormatter.
Bad lines stop the run with FILE:LINE and exit 2, leaving no output; --skip-bad skips and counts
them (as json2bin does; an empty text is a bad line here). --shard I/N cuts the inputs as json2bin
does: the N kept files, concatenated in shard order, are the one-machine output.

\b
Examples:
  llm-prep filter raw.jsonl -o clean.jsonl --language en --pii email,ip
  llm-prep filter 'crawl/*.jsonl.zst' -o web.jsonl --recipe fineweb --set gopher_quality.min_doc_words=30
  llm-prep filter raw.jsonl -o clean.jsonl --min-chars 200 --max-tokens 8192 -t tok/
  llm-prep filter raw.jsonl -o - --stats clean.stats.json --language en \\
      | llm-prep json2bin - -t tok/ -o data/web --provenance clean.stats.json
  llm-prep filter @files.txt -o out/web.jsonl --shard 3/64 --language en   # a Slurm array task
"""


def _items(values: list[str] | None) -> list[str]:
    return [v for item in values or [] for v in item.replace(",", " ").split()]


def filter_cmd(
    inputs: list[str] = typer.Argument(None, help="JSONL files, globs, @list.txt, or - for stdin.", metavar="INPUT..."),
    output: str = typer.Option(None, "-o", "--output", help="The kept documents (JSONL), or - for stdout."),
    stats: str = typer.Option(None, "--stats", help="The stats JSON (default OUT.stats.json; required with -o -)."),
    removed: str = typer.Option(None, "--removed", help="The removed documents (default OUT.removed, or beside --stats)."),
    text_key: str = typer.Option("text", "--text-key", help="The key that holds the text."),
    recipe: str = typer.Option(None, "--recipe", help="A named set of quality rules (see --list-rules)."),
    rules: list[str] = typer.Option(None, "--rule", help="A rule to run (repeatable, in order)."),
    settings: list[str] = typer.Option(None, "--set", metavar="RULE.PARAM=VALUE", help="Set a rule's parameter (repeatable)."),
    language: list[str] = typer.Option(None, "--language", help="Languages to keep: en,de (ISO 639-1)."),
    language_threshold: float = typer.Option(None, "--language-threshold", help="Keep above this probability (default 0.65)."),
    pii: str = typer.Option(None, "--pii", help="Replace PII: email,ip (datatrove's) and/or phone."),
    min_chars: int = typer.Option(None, "--min-chars", help="Remove documents of fewer characters."),
    max_chars: int = typer.Option(None, "--max-chars", help="Remove documents of more characters."),
    min_tokens: int = typer.Option(None, "--min-tokens", help="Remove documents of fewer tokens (-t)."),
    max_tokens: int = typer.Option(None, "--max-tokens", help="Remove documents of more tokens (-t)."),
    tokenizer: str = typer.Option(None, "-t", "--tokenizer", help="The tokenizer that counts tokens (as json2bin -t)."),
    keep_removed_text: bool = typer.Option(False, "--keep-removed-text", help="Write removed texts into OUT.removed."),
    shard: str = typer.Option(None, "--shard", metavar="I/N", help="Only shard I of N (from 0); default: the Slurm array task's."),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Skip bad lines and files, counting them, instead of stopping."),
    force: bool = typer.Option(False, "--force", help="Replace earlier outputs of llmtools (and a killed run's leftovers)."),
    list_rules: bool = typer.Option(False, "--list-rules", help="Print the rules, their parameters and the recipes; exit."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout instead of paths."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress and no summary on stderr."),
) -> None:  # fmt: skip
    import os

    from llmtools.cli.claim import claim, input_paths
    from llmtools.errors import UsageError
    from llmtools.prep.curate import registry as reg
    from llmtools.prep.curate.run import CurationConfig, run_curation
    from llmtools.prep.shards import parse_shard, shard_from_environment

    if list_rules:
        for line in _rule_table(reg.registry()):
            emit(line)
        return
    if not inputs:
        raise UsageError("give the documents: INPUT... (a JSONL file, a glob, or - for stdin)")
    if output is None:
        raise UsageError("-o/--output is required (a file, or - for stdout)")
    if output == "-" and as_json:
        raise UsageError("--json with -o -: stdout carries the documents; read the stats file instead")
    names: list[tuple[str, dict]] = []
    bounds = {"min_chars": min_chars, "max_chars": max_chars, "min_tokens": min_tokens, "max_tokens": max_tokens}
    if any(v is not None for v in bounds.values()):
        names.append(("length", {**bounds, "tokenizer": tokenizer}))
    elif tokenizer is not None:
        raise UsageError("-t/--tokenizer counts tokens for --min-tokens/--max-tokens; give one of them")
    langs = _items(language)
    if langs or language_threshold is not None:
        given: dict = {"languages": langs or None}
        if language_threshold is not None:
            given["threshold"] = language_threshold
        names.append(("language", given))
    if recipe is not None:
        names += [(name, dict(params)) for name, params in reg.recipe(recipe).rules]
    names += [(name, {}) for name in _items(rules)]
    if pii is not None:
        names.append(("pii", {"kinds": _items([pii])}))
    if not names:
        raise UsageError("nothing to do: give --recipe, --rule, --language, --pii or a length bound")
    chosen = reg.resolve(names, reg.parse_settings(settings or []))
    spec = parse_shard(shard) if shard is not None else shard_from_environment(os.environ)
    if spec is not None and shard is None and not quiet:
        log(f"llm-prep filter: shard {spec} from {spec.origin}")
    config = CurationConfig(
        inputs=list(inputs), output=output, stats=stats, removed=removed, text_key=text_key,
        keep_removed_text=keep_removed_text, skip_bad=skip_bad, force=force, shard=spec,
        progress=False if quiet else None,
    )  # fmt: skip
    claim(config.paths().dataset_output(force).claimed(), inputs=input_paths([*inputs, tokenizer]), force=force)
    steps = reg.build_steps(chosen)
    result = run_curation(config, steps, reg.describe(chosen))
    if output == "-":  # stdout holds the documents: the summary alone, on stderr
        if not quiet:
            log(f"llm-prep filter: {result.summary()}")
        return
    report("llm-prep filter", result, as_json, quiet)


def _rule_table(table) -> list[str]:
    lines = []
    for name in sorted(table.rules):
        rule = table.rules[name]
        lines.append(f"{name}: {rule.help}")
        for p in rule.params:
            lines.append(f"  {name}.{p.name} ({p.kind.__name__}, default {p.default!r}): {p.help}")
    for name in sorted(table.recipes):
        recipe = table.recipes[name]
        lines.append(f"recipe {name}: {recipe.help} [{', '.join(r for r, _ in recipe.rules)}]")
    return lines


def register(app: typer.Typer) -> None:
    app.command("filter", help=FILTER_HELP, no_args_is_help=True)(filter_cmd)
