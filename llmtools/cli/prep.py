"""``llm-prep``: raw text -> Megatron-LM indexed datasets, plus tokenizer training, inspection and cat.

A thin typer adapter: every command builds a config and calls a library function
(``llmtools.prep.json2bin``, ``llmtools.prep.tokenizer_train``, ``llmtools.prep.inspect``,
``llmtools.prep.sample_corpus``). Heavy libraries load inside the commands, so ``--help`` is instant.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from llmtools.cli._common import emit, log, new_app, report, run

app = new_app(
    "llm-prep", "Prepare training data: tokenize JSONL into Megatron .bin/.idx, train tokenizers, inspect."
)
tokenizer_app = new_app("llm-prep tokenizer", "Train tokenizers.")
app.add_typer(tokenizer_app, name="tokenizer", help="Train a byte-level BPE tokenizer (tokenizer train).")

TOKENIZER_HELP = "tokenizer.json, an HF tokenizer folder, a GPT-2 vocab.json (merges.txt beside it), a SentencePiece .model, or 'byte' (built in)."

JSON2BIN_HELP = """Tokenize JSONL documents into Megatron-LM's indexed format (.bin/.idx), byte-identical to
Megatron-LM's tools/preprocess_data.py for the same input, tokenizer and flags.

Writes PREFIX_{key}_document.bin/.idx and a sidecar PREFIX_{key}_document.json (tokenizer identity
and hash, inputs with checksums, counts) for every --json-keys key, and prints their paths.
INPUT: JSONL files, globs ('data/*.jsonl.zst'), '-' for stdin; .gz and .zst are read directly.
Several inputs go into one output, in the order given.

\b
Special tokens in the text (--special-tokens):
  auto   the tokenizer's normal call, as Megatron-LM does (default): HF tokenizers and GPT-2
         vocab.json+merges.txt turn a literal '<|endoftext|>' into its id (and an HF tokenizer adds
         its BOS/EOS); .model and byte tokenizers encode it as plain text
  split  special-token strings always become their ids
  plain  special-token strings are always plain text
Empty documents are kept as Megatron keeps them: a document index with no tokens (no EOD either).
Bad lines (malformed JSON, missing key, non-string, invalid UTF-8, truncated or empty file) stop the
run with FILE:LINE and exit 2, leaving no output; --skip-bad skips and counts them in the sidecar.

\b
Examples:
  llm-prep json2bin corpus.jsonl --tokenizer tokenizer.json -o data/corpus --append-eod
  llm-prep json2bin 'shards/*.jsonl.zst' -t gpt2/vocab.json -o data/web --workers 16 --append-eod
  zcat dump.jsonl.gz | llm-prep json2bin - -t byte -o data/dump --skip-bad --json
  llm-prep json2bin qa.jsonl -t tok/ -o data/qa --json-keys question,answer
"""


@app.command("json2bin", help=JSON2BIN_HELP, no_args_is_help=True)
def json2bin_cmd(
    inputs: list[str] = typer.Argument(
        ..., help="JSONL files, globs, or - for stdin (.gz/.zst ok).", metavar="INPUT..."
    ),
    tokenizer: str = typer.Option(..., "-t", "--tokenizer", help=TOKENIZER_HELP),
    output: str = typer.Option(
        ...,
        "-o",
        "--output",
        "--output-prefix",
        help="Output prefix: writes PREFIX_{key}_document.{bin,idx,json}.",
    ),
    json_keys: list[str] = typer.Option(
        ["text"], "--json-keys", help="JSON key(s) to tokenize: repeat, or 'a,b' / 'a b' in one argument."
    ),
    append_eod: bool = typer.Option(
        False, "--append-eod", help="Append the tokenizer's EOD id to every non-empty document."
    ),
    workers: int = typer.Option(
        None, "--workers", "-w", help="Encoding processes, or gigatoken threads (default: all cores)."
    ),
    special_tokens: str = typer.Option("auto", "--special-tokens", help="auto | split | plain (see above)."),
    backend: str = typer.Option(
        "auto",
        "--backend",
        help="auto (gigatoken when it gives identical ids, else tokenizers) | tokenizers | gigatoken.",
    ),
    skip_bad: bool = typer.Option(
        False, "--skip-bad", help="Skip bad lines and files, counting them by kind, instead of stopping."
    ),
    force: bool = typer.Option(
        False, "--force", help="Overwrite existing outputs (and remove a killed run's .tmp-* leftovers)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout instead of paths."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress bar and no summary on stderr."),
) -> None:
    from llmtools.prep.json2bin import Json2BinConfig, json2bin

    keys = _keys(json_keys)
    config = Json2BinConfig(
        inputs=inputs,
        tokenizer=tokenizer,
        output_prefix=output,
        json_keys=keys,
        append_eod=append_eod,
        workers=workers,
        backend=backend,
        special_tokens=special_tokens,
        skip_bad=skip_bad,
        force=force,
        progress=False if quiet else None,
    )
    result = json2bin(config=config)
    report("llm-prep json2bin", result, as_json, quiet)


INSPECT_HELP = """Summarize and validate a .bin/.idx pair: counts, dtype, tokens, document-length statistics.

The index is checked against itself and against the .bin (bad magic, truncated files, inconsistent
pointers, token ids outside the sidecar's vocabulary): a problem exits 2 naming the file and byte.

\b
Examples:
  llm-prep inspect data/corpus_text_document
  llm-prep inspect data/corpus_text_document.idx --json | jq .tokens
"""


@app.command("inspect", help=INSPECT_HELP, no_args_is_help=True)
def inspect_cmd(
    prefix: str = typer.Argument(..., help="Dataset prefix (foo, foo.bin or foo.idx)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable JSON on stdout."),
    no_validate: bool = typer.Option(False, "--no-validate", help="Skip the full O(n) consistency check."),
) -> None:
    from llmtools.prep.inspect import format_report, inspect_prefix

    report = inspect_prefix(prefix, validate=not no_validate)
    emit(json.dumps(report) if as_json else format_report(report))


CAT_HELP = """Print documents of a .bin/.idx: detokenized with --tokenizer, else as token ids.

Without --json, ids are printed one document per line; decoded texts are printed back to back,
each followed by a newline (use --json for one JSON object per document when texts hold newlines).

\b
Examples:
  llm-prep cat data/corpus_text_document --docs 0:5
  llm-prep cat data/corpus_text_document --docs 0:3 --tokenizer tokenizer.json
  llm-prep cat data/corpus_text_document --docs -1 --tokenizer byte --json
"""


@app.command("cat", help=CAT_HELP, no_args_is_help=True)
def cat_cmd(
    prefix: str = typer.Argument(..., help="Dataset prefix (foo, foo.bin or foo.idx)."),
    docs: str = typer.Option(
        None, "--docs", help="Documents: N, START:STOP or START:STOP:STEP (default: all)."
    ),
    tokenizer: str = typer.Option(
        None, "-t", "--tokenizer", help="Decode with this tokenizer: " + TOKENIZER_HELP
    ),
    as_json: bool = typer.Option(
        False, "--json", help='One JSON object per document: {"doc", "ids" or "text"}.'
    ),
) -> None:
    from llmtools.prep.inspect import iter_documents

    tok = None
    if tokenizer:
        from llmtools.tokenize import load_tokenizer

        tok = load_tokenizer(tokenizer, backend="tokenizers")
    for j, ids in iter_documents(prefix, docs):
        if tok is not None:
            text = tok.decode(ids)
            emit(json.dumps({"doc": j, "text": text}, ensure_ascii=False) if as_json else text)
        else:
            emit(json.dumps({"doc": j, "ids": ids.tolist()}) if as_json else " ".join(map(str, ids.tolist())))


TRAIN_HELP = """Train a byte-level BPE tokenizer (Hugging Face tokenizers) on JSONL text and write tokenizer.json.

The EOD token (default <|endoftext|>) gets id 0; more special tokens follow it. The result loads in
llm-prep json2bin --tokenizer, in transformers' PreTrainedTokenizerFast and Megatron-LM.

\b
Examples:
  llm-prep tokenizer train corpus.jsonl --vocab-size 8000 -o tok/tokenizer.json
  llm-prep tokenizer train 'data/*.jsonl.gz' --vocab-size 32000 -o tokenizer.json --special-token '<|pad|>'
"""


@tokenizer_app.callback()
def _tokenizer_root() -> None:
    """Train tokenizers."""


@tokenizer_app.command("train", help=TRAIN_HELP, no_args_is_help=True)
def tokenizer_train_cmd(
    inputs: list[str] = typer.Argument(..., help="JSONL files, globs, or - for stdin.", metavar="INPUT..."),
    vocab_size: int = typer.Option(
        ..., "--vocab-size", help="Vocabulary size (256 bytes and special tokens included)."
    ),
    output: Path = typer.Option(..., "-o", "--output", help="Where to write tokenizer.json."),
    json_keys: list[str] = typer.Option(
        ["text"], "--json-keys", help="JSON key(s) to read; repeat or comma-separate."
    ),
    eod_token: str = typer.Option(
        "<|endoftext|>", "--eod-token", help="End-of-document special token (id 0)."
    ),
    special_token: list[str] = typer.Option([], "--special-token", help="More special tokens (repeatable)."),
    min_frequency: int = typer.Option(2, "--min-frequency", help="Minimum pair frequency for a merge."),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Skip bad lines instead of stopping."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary instead of the path."),
) -> None:
    from llmtools.prep.tokenizer_train import TrainConfig, train_tokenizer

    keys = _keys(json_keys)
    config = TrainConfig(
        vocab_size=vocab_size,
        eod_token=eod_token,
        special_tokens=special_token,
        min_frequency=min_frequency,
        json_keys=keys,
    )
    summary = train_tokenizer(inputs, output, config, force=force, skip_bad=skip_bad)
    log(
        f"llm-prep tokenizer train: vocab {summary['vocab_size']}, EOD {summary['eod_token']!r} = {summary['eod_id']}"
    )
    emit(json.dumps(summary) if as_json else summary["path"])


SAMPLE_HELP = """Write the built-in sample corpus: generated text, deterministic from --seed, learnable by a tiny model.

Styles: stories (short children's stories from a small grammar; names and objects recur within a
story) and arith (small-number arithmetic and counting). One DIR/STYLE.jsonl per style ({"text": ...}).

\b
Examples:
  llm-prep sample-corpus -o data/raw
  llm-prep sample-corpus -o data/raw --docs 500 --seed 7 --style stories
"""


@app.command("sample-corpus", help=SAMPLE_HELP)
def sample_corpus_cmd(
    output: Path = typer.Option(..., "-o", "--output", help="Folder for STYLE.jsonl files."),
    docs: int = typer.Option(2000, "--docs", help="Documents per style."),
    seed: int = typer.Option(1234, "--seed", help="Seed; the same seed gives the same bytes."),
    style: list[str] = typer.Option(
        ["stories", "arith"], "--style", help="stories and/or arith (repeatable)."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite existing files."),
) -> None:
    from llmtools.prep.sample_corpus import write_sample_corpus

    for path in write_sample_corpus(output, docs=docs, seed=seed, styles=style, force=force):
        emit(str(path))


def _keys(values: list[str]) -> list[str]:
    """--json-keys a,b / --json-keys a --json-keys b / --json-keys "a b" all mean [a, b]."""
    return [k for item in values for k in item.replace(",", " ").split()]


@app.callback()
def _root() -> None:
    """Prepare training data: tokenize JSONL into Megatron .bin/.idx, train tokenizers, inspect."""


from llmtools.cli.prep_hf import register as _register_hf2bin  # noqa: E402 - hf2bin lives in its own module

_register_hf2bin(app)

from llmtools.cli.prep_sft import register as _register_sft  # noqa: E402 - sft lives in its own module

_register_sft(app)

from llmtools.cli.prep_pref import register as _register_pref  # noqa: E402 - pref lives in its own module

_register_pref(app)


def main() -> None:
    run(app, "llm-prep")


if __name__ == "__main__":
    main()
