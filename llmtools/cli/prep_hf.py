"""``llm-prep hf2bin``: a local Hugging Face dataset -> Megatron ``.bin/.idx``. Registered on ``llm-prep``."""

from __future__ import annotations

import typer

from llmtools.cli._common import report

HF2BIN_HELP = """Convert a local Hugging Face dataset to Megatron-LM's indexed format (.bin/.idx + sidecar).

SOURCE: a save_to_disk folder (llm-export hf writes one), .parquet / .arrow files or a glob of them,
or a folder datasets.load_dataset opens offline (data files + README configs). Nothing is downloaded.
A text column is tokenized exactly as llm-prep json2bin does (same flags, errors and sidecar); a
column of token-id lists (input_ids) is written as it is, without a tokenizer, so
JSONL -> json2bin -> llm-export hf -> hf2bin gives byte-identical .bin/.idx.
Writes PREFIX_{column}_document.{bin,idx,json} and prints their paths.

\b
Examples:
  llm-prep hf2bin hf/wiki -o data/wiki2                       # input_ids copied as they are
  llm-prep hf2bin 'pq/train-*.parquet' -t tokenizer.json -o data/web --append-eod
  llm-prep hf2bin my_dataset_dir --split validation --json-keys body -t byte -o data/val
"""


def hf2bin_cmd(
    source: str = typer.Argument(
        ..., help="save_to_disk folder, .parquet/.arrow file(s) or glob, or a dataset folder."
    ),
    output: str = typer.Option(
        ...,
        "-o",
        "--output",
        "--output-prefix",
        help="Output prefix: writes PREFIX_{column}_document.{bin,idx,json}.",
    ),
    json_keys: list[str] = typer.Option(
        None,
        "--json-keys",
        "--column",
        help="Column(s) to convert; repeat or comma-separate (default: text, else input_ids).",
    ),
    split: str = typer.Option(None, "--split", help="Split to read (default: the only one, else train)."),
    tokenizer: str = typer.Option(
        None,
        "-t",
        "--tokenizer",
        help="Tokenizer (required for text columns): tokenizer.json, HF folder, vocab.json, .model or 'byte'.",
    ),
    append_eod: bool = typer.Option(
        False, "--append-eod", help="Append the EOD id to every non-empty document."
    ),
    workers: int = typer.Option(
        None, "--workers", "-w", help="Encoding processes for text columns (default: all cores)."
    ),
    special_tokens: str = typer.Option(
        "auto", "--special-tokens", help="auto | split | plain (as json2bin)."
    ),
    backend: str = typer.Option("auto", "--backend", help="auto | tokenizers | gigatoken (as json2bin)."),
    skip_bad: bool = typer.Option(
        False, "--skip-bad", help="Skip rows with a null text, counting them, instead of stopping."
    ),
    force: bool = typer.Option(False, "--force", help="Replace earlier outputs of llmtools."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout instead of paths."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress bar and no summary on stderr."),
) -> None:
    from llmtools.cli.claim import claim, input_paths
    from llmtools.prep.hf_import import Hf2BinConfig, hf2bin, hf2bin_outputs

    keys = [k.strip() for item in json_keys or [] for k in item.split(",") if k.strip()] or None
    config = Hf2BinConfig(source=source, output_prefix=output, json_keys=keys, split=split, tokenizer=tokenizer,
                          append_eod=append_eod, workers=workers, backend=backend, special_tokens=special_tokens,
                          skip_bad=skip_bad, force=force, progress=False if quiet else None)  # fmt: skip
    outputs, read = hf2bin_outputs(config)
    claim(outputs, inputs=[*read, *input_paths([tokenizer])], force=force)
    result = hf2bin(config)
    report("llm-prep hf2bin", result, as_json, quiet)


def register(app: typer.Typer) -> None:
    """Add ``hf2bin`` to the ``llm-prep`` app."""
    app.command("hf2bin", help=HF2BIN_HELP, no_args_is_help=True)(hf2bin_cmd)
