"""``llm-export``: hand tokenized data to other ecosystems. ``llm-export hf`` writes a Hugging Face dataset."""

from __future__ import annotations

import typer

from llmtools.cli._common import emit, new_app, run
from llmtools.formats import jsonfile

app = new_app("llm-export", "Export tokenized data (.bin/.idx or mix.json) to other formats.")

HF_HELP = """Export a tokenized prefix (.bin/.idx) or a mix.json to a Hugging Face dataset folder.

One row per document (column input_ids, the narrowest integer type that holds the vocabulary), or
with --packed fixed-length training blocks with input_ids and labels (labels == input_ids: Hugging
Face causal-LM models shift them). A mix.json is always exported as its training samples, in plan
order, seq_length + 1 tokens each: exactly what llm-train's dataset yields. The default layout is what
datasets.save_to_disk writes (open it with datasets.load_from_disk(DIR)); --format parquet writes
DIR/data/train-*.parquet (datasets.load_dataset("parquet", data_files=...) or load_dataset(DIR)).
DIR also gets a dataset card (README.md) and llmtools.json (provenance). It appears only when complete.

\b
Examples:
  llm-export hf data/wiki_text_document -o hf/wiki
  llm-export hf data/wiki_text_document -o hf/wiki --format parquet --shard-size 200MB
  llm-export hf data/wiki_text_document -o hf/wiki-text --text --tokenizer tokenizer.json
  llm-export hf data/wiki_text_document -o hf/wiki-2048 --packed --seq-length 2048
  llm-export hf mix.json -o hf/mix-train              # the plan's training samples, in plan order
  llm-export hf mix.json -o hf/mix-valid --split valid --format parquet --json
"""


@app.callback()
def _root() -> None:
    """Export tokenized data (.bin/.idx or mix.json) to other formats."""


@app.command("hf", help=HF_HELP, no_args_is_help=True)
def hf(
    source: str = typer.Argument(..., help="A .bin/.idx prefix (foo, foo.bin or foo.idx) or a mix.json."),
    output: str = typer.Option(
        ..., "-o", "--output", help="Output folder (new or empty, or an earlier export with --force)."
    ),
    format: str = typer.Option("arrow", "--format", help="arrow (save_to_disk folder) or parquet."),
    text: bool = typer.Option(False, "--text", help="Add a detokenized 'text' column (needs --tokenizer)."),
    tokenizer: str = typer.Option(
        None,
        "--tokenizer",
        help="Tokenizer for --text: tokenizer.json, HF folder, vocab.json, .model or 'byte'.",
    ),
    packed: bool = typer.Option(
        False, "--packed", help="Fixed-length blocks with input_ids and labels instead of documents."
    ),
    seq_length: int = typer.Option(
        None, "--seq-length", help="Block length for --packed (a mix.json carries its own)."
    ),
    shard_size: str = typer.Option(
        "500MB", "--shard-size", help="Approximate shard size: 500MB, 2GB, 1GiB, bytes."
    ),
    split: str = typer.Option(
        "train", "--split", help="For a mix.json: train, valid or test; also the split name written."
    ),
    force: bool = typer.Option(False, "--force", help="Replace an earlier export (an llmtools output)."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary instead of the output path."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress bar."),
) -> None:
    from llmtools.cli.claim import claim, input_paths
    from llmtools.export.hf_export import ExportConfig, export_hf, input_files, parse_size

    config = ExportConfig(
        source=source,
        output=output,
        format=format,
        text=text,
        tokenizer=tokenizer,
        packed=packed,
        seq_length=seq_length,
        shard_size=parse_size(shard_size),
        split=split,
        force=force,
        progress=False if quiet else None,
    )
    inputs = [*input_files(config), *input_paths([tokenizer])]
    claim([config.output], inputs=inputs, force=force, kinds={"llmtools.hf-export"})
    result = export_hf(config)
    emit(jsonfile.output(result.to_dict()) if as_json else str(result.output))


def main() -> None:
    run(app, "llm-export")


if __name__ == "__main__":
    main()
