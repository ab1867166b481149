"""``llm-prep``: raw text -> Megatron-LM indexed datasets, plus tokenizer training, inspection and cat.

A thin typer adapter: every command builds a config and calls a library function
(``llmtools.prep.json2bin``, ``llmtools.prep.tokenizer_train``, ``llmtools.prep.inspect``,
``llmtools.prep.sample_corpus``). Heavy libraries load inside the commands, so ``--help`` is instant.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from llmtools.cli._common import emit, expand_multi_value_flags, log, new_app, report, run
from llmtools.errors import InputError
from llmtools.formats import jsonfile

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
INPUT: JSONL files, globs ('data/*.jsonl.zst'), @list.txt (one path or glob per line), '-' for
stdin; .gz and .zst are read directly. Several inputs go into one output, in the order given.

\b
Many machines (--shard I/N, or a Slurm job array: SLURM_ARRAY_TASK_ID/COUNT/MIN/STEP):
  the inputs are sorted by path and cut into N contiguous, size-balanced runs; shard I tokenizes
  run I into PREFIX-0000I-of-0000N_{key}_document (the sidecar records the assignment). The bytes
  of a shard depend only on its inputs, and `llm-prep merge` of shards 0..N-1 gives the bytes of
  one run over all the inputs sorted by path. --shard none ignores the Slurm variables.

\b
Special tokens in the text (--special-tokens), and the Megatron-LM version each reproduces:
  auto   the tokenizer's normal call (default). For a GPT-2 vocab.json+merges.txt, a literal
         '<|endoftext|>' becomes its id, as in Megatron-LM core_v0.15-core_v0.16 (megatron-core's
         tokenizers, GPT2BPETokenizer); an HF tokenizer also gets its post-processor's BOS/EOS, as
         in Megatron-LM up to core_v0.14 (HuggingFaceTokenizer) and with
         --tokenizer-hf-include-special-tokens after; .model and byte encode it as plain text
  split  special-token strings always become their ids
  plain  special-token strings are always plain text: GPT2BPETokenizer of Megatron-LM up to
         core_v0.14, --legacy-tokenizer, and Megatron-DeepSpeed
Empty documents are kept as Megatron keeps them: a document index with no tokens (no EOD either).
Bad lines (malformed JSON, missing key, non-string, invalid UTF-8, truncated or empty file) stop the
run with FILE:LINE and exit 2, leaving no output; --skip-bad skips and counts them in the sidecar.

\b
Megatron-LM's command line works as it is (preprocess_data.py of core_v0.16.1; ids tested against
megatron-core's own tokenizers): --input, --output-prefix, --json-keys text title, --append-eod,
--workers, --partitions (its document order), --keep-sequential-samples, --log-interval,
--keep-newlines, --tokenizer-type {GPT2BPETokenizer, HuggingFaceTokenizer, SentencePieceTokenizer,
GPTSentencePieceTokenizer, Llama2Tokenizer, TikTokenizer}, --tokenizer-model, --vocab-file,
--merge-file, --legacy-tokenizer, --tokenizer-hf-include-special-tokens, --tokenizer-special-tokens,
--tiktoken-pattern, --tiktoken-num-special-tokens, --vocab-size. Without --legacy-tokenizer the ids
are megatron-core's (core_v0.15+: an HF tokenizer adds no BOS, GPT-2 turns '<|endoftext|>' into its
id); with it, the legacy system's (core_v0.14 and before). Refused, with the reason: --split-sentences
(needs NLTK's punkt model, which Megatron downloads at run time), --trust-remote-code, BERT and
multimodal tokenizer types, hub names (nothing is downloaded).

\b
Examples:
  llm-prep json2bin corpus.jsonl --tokenizer tokenizer.json -o data/corpus --append-eod
  llm-prep json2bin 'shards/*.jsonl.zst' -t gpt2/vocab.json -o data/web --workers 16 --append-eod
  llm-prep json2bin @files.txt -t tok/ -o data/web --shard 3/64          # then: llm-prep merge
  zcat dump.jsonl.gz | llm-prep json2bin - -t byte -o data/dump --skip-bad --json
  llm-prep filter raw.jsonl -o - --stats s.json --language en | llm-prep json2bin - -t tok/ -o data/web --provenance s.json
  llm-prep json2bin qa.jsonl -t tok/ -o data/qa --json-keys question,answer
  llm-prep json2bin --input owt.jsonl --output-prefix data/owt --tokenizer-type GPT2BPETokenizer \\
      --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt --append-eod --workers 8
"""

MULTI_VALUE_FLAGS = ("--json-keys", "--tokenizer-special-tokens", "--tiktoken-special-tokens")
"""Megatron's nargs='+' flags: ``--json-keys text title`` is rewritten to one value per flag."""


@app.command("json2bin", help=JSON2BIN_HELP, no_args_is_help=True)
def json2bin_cmd(
    inputs: list[str] = typer.Argument(
        None, help="JSONL files, globs, @list.txt, or - for stdin (.gz/.zst ok).", metavar="INPUT..."
    ),
    tokenizer: str = typer.Option(None, "-t", "--tokenizer", help=TOKENIZER_HELP),
    output: str = typer.Option(
        None,
        "-o",
        "--output",
        "--output-prefix",
        help="Output prefix: writes PREFIX_{key}_document.{bin,idx,json}.",
    ),
    json_keys: list[str] = typer.Option(
        ["text"], "--json-keys", help="JSON key(s) to tokenize: 'a b' (Megatron), 'a,b', or repeated."
    ),
    append_eod: bool = typer.Option(
        False, "--append-eod", help="Append the tokenizer's EOD id to every non-empty document."
    ),
    workers: int = typer.Option(
        None, "--workers", "-w", help="Encoding processes, or gigatoken threads (default: all cores)."
    ),
    shard: str = typer.Option(
        None,
        "--shard",
        metavar="I/N",
        help="Tokenize only shard I of N (from 0); default: the Slurm array task's, if any; 'none' for all.",
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
        False,
        "--force",
        help="Replace earlier outputs of llmtools (and remove a killed run's .tmp-* leftovers).",
    ),
    provenance: list[str] = typer.Option(
        None,
        "--provenance",
        metavar="STATS.json",
        help="The stats of llm-prep filter/decontaminate/dedup that made the inputs (repeatable): "
        "carried into the sidecar (curation); refused unless it describes these inputs.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout instead of paths."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress bar and no summary on stderr."),
    # -- Megatron-LM's tools/preprocess_data.py flags ---------------------------------------------------
    megatron_input: list[str] = typer.Option(None, "--input", help="Megatron's spelling of INPUT."),
    tokenizer_type: str = typer.Option(
        None, "--tokenizer-type", help="Megatron's tokenizer type (see above)."
    ),
    tokenizer_model: str = typer.Option(
        None, "--tokenizer-model", help="Megatron: HF folder, .model or .json."
    ),
    vocab_file: str = typer.Option(None, "--vocab-file", help="Megatron: GPT-2 vocab.json."),
    merge_file: str = typer.Option(None, "--merge-file", help="Megatron: GPT-2 merges.txt."),
    legacy_tokenizer: bool = typer.Option(
        False, "--legacy-tokenizer", help="Megatron's legacy tokenizer system (core_v0.14 and before)."
    ),
    partitions: int = typer.Option(1, "--partitions", help="Megatron: its document order over N partitions."),
    keep_sequential_samples: bool = typer.Option(
        False, "--keep-sequential-samples", help="Megatron: contiguous partitions (keeps the input order)."
    ),
    log_interval: int = typer.Option(
        None, "--log-interval", help="Megatron: a 'Processed N documents' line every N documents."
    ),
    keep_newlines: bool = typer.Option(
        False, "--keep-newlines", help="Megatron: only matters with --split-sentences (a no-op here)."
    ),
    split_sentences: bool = typer.Option(False, "--split-sentences", help="Megatron: refused (see above)."),
    lang: str = typer.Option(None, "--lang", hidden=True),
    hf_include_special_tokens: bool = typer.Option(
        False, "--tokenizer-hf-include-special-tokens", hidden=True
    ),
    hf_use_fast: bool = typer.Option(False, "--tokenizer-hf-use-fast", hidden=True),
    tokenizer_special_tokens: list[str] = typer.Option(None, "--tokenizer-special-tokens", hidden=True),
    sentencepiece_legacy: bool = typer.Option(False, "--tokenizer-sentencepiece-legacy", hidden=True),
    tiktoken_pattern: str = typer.Option(None, "--tiktoken-pattern", hidden=True),
    tiktoken_num_special_tokens: int = typer.Option(1000, "--tiktoken-num-special-tokens", hidden=True),
    tiktoken_special_tokens: list[str] = typer.Option(None, "--tiktoken-special-tokens", hidden=True),
    vocab_size: int = typer.Option(None, "--vocab-size", hidden=True),
    vocab_extra_ids: int = typer.Option(0, "--vocab-extra-ids", hidden=True),
    padded_vocab_size: int = typer.Option(None, "--padded-vocab-size", hidden=True),
    tokenizer_metadata: str = typer.Option(None, "--tokenizer-metadata", hidden=True),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", hidden=True),
) -> None:
    import os

    from llmtools.cli.claim import claim, input_paths
    from llmtools.errors import UsageError
    from llmtools.prep.json2bin import Json2BinConfig, json2bin
    from llmtools.prep.shards import parse_shard, shard_from_environment

    if split_sentences:
        raise UsageError(
            "--split-sentences: needs NLTK's punkt sentence model, which Megatron downloads at run time "
            "(nltk.download); nothing is downloaded here. Split sentences beforehand, one document per line"
        )
    if trust_remote_code:
        raise UsageError("--trust-remote-code: code from a tokenizer folder is never run here")
    if tokenizer_metadata is not None:
        raise UsageError(
            "--tokenizer-metadata: a metadata file can name a tokenizer class to import; not supported "
            "(give --tokenizer-type and its files)"
        )
    all_inputs = list(inputs or []) + list(megatron_input or [])
    if not all_inputs:
        raise UsageError("give the documents: INPUT... (or Megatron's --input)")
    if output is None:
        raise UsageError("-o/--output (or --output-prefix) is required")
    megatron = None
    megatron_flags = (
        tokenizer_model or vocab_file or merge_file or legacy_tokenizer or tokenizer_special_tokens
    )
    if tokenizer_type is not None:
        if tokenizer is not None:
            raise UsageError("give either -t/--tokenizer or Megatron's --tokenizer-type, not both")
        from llmtools.tokenize.megatron import MegatronTokenizerArgs

        megatron = MegatronTokenizerArgs(
            tokenizer_type=tokenizer_type,
            tokenizer_model=tokenizer_model,
            vocab_file=vocab_file,
            merge_file=merge_file,
            legacy=legacy_tokenizer,
            hf_include_special_tokens=hf_include_special_tokens,
            special_tokens=tuple(tokenizer_special_tokens or ()),
            sentencepiece_legacy=sentencepiece_legacy,
            tiktoken_pattern=tiktoken_pattern,
            tiktoken_num_special_tokens=tiktoken_num_special_tokens,
            vocab_size=vocab_size,
        )
        for note in megatron.notes:
            log(f"llm-prep json2bin: note: {note}")
        if tiktoken_special_tokens:
            log("llm-prep json2bin: note: --tiktoken-special-tokens is ignored, as Megatron ignores it "
                "(its TikTokenizer takes --tokenizer-special-tokens)")  # fmt: skip
    elif tokenizer is None:
        raise UsageError("give -t/--tokenizer (or Megatron's --tokenizer-type with its files)")
    elif megatron_flags:
        raise UsageError(
            "--tokenizer-model/--vocab-file/--merge-file/--legacy-tokenizer go with --tokenizer-type"
        )
    if (keep_newlines or lang) and not quiet:
        log(
            "llm-prep json2bin: note: --keep-newlines/--lang only matter with --split-sentences (as in Megatron)"
        )
    spec = parse_shard(shard) if shard is not None else shard_from_environment(os.environ)
    if spec is not None and shard is None and not quiet:
        log(f"llm-prep json2bin: shard {spec} from {spec.origin}")
    keys = _keys(json_keys)
    config = Json2BinConfig(
        inputs=all_inputs,
        tokenizer=tokenizer or "",
        output_prefix=output,
        json_keys=keys,
        append_eod=append_eod,
        workers=workers,
        backend=backend,
        special_tokens=special_tokens,
        skip_bad=skip_bad,
        force=force,
        progress=False if quiet else None,
        shard=spec,
        megatron=megatron,
        partitions=partitions,
        keep_sequential_samples=keep_sequential_samples,
        log_interval=log_interval,
        provenance=tuple(provenance or ()),
    )
    claim(
        config.output().claimed(),
        inputs=input_paths(
            [*all_inputs, tokenizer, tokenizer_model, vocab_file, merge_file, *(provenance or ())]
        ),
        force=force,
    )
    result = json2bin(config=config)
    report("llm-prep json2bin", result, as_json, quiet)


INSPECT_HELP = """Summarize and validate a .bin/.idx pair: counts, dtype, tokens, document-length statistics.

The index is checked against itself and against the .bin (bad magic, truncated files, inconsistent
pointers: on open, as every command does), then every token id against the sidecar's vocabulary: a
problem exits 2 naming the file and byte.

\b
Examples:
  llm-prep inspect data/corpus_text_document
  llm-prep inspect data/corpus_text_document.idx --json | jq .tokens
"""


@app.command("inspect", help=INSPECT_HELP, no_args_is_help=True)
def inspect_cmd(
    prefix: str = typer.Argument(..., help="Dataset prefix (foo, foo.bin or foo.idx)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable JSON on stdout."),
    no_validate: bool = typer.Option(
        False, "--no-validate", help="Skip the O(tokens) checks (the index itself is always checked)."
    ),
) -> None:
    from llmtools.prep.inspect import format_report, inspect_prefix

    report = inspect_prefix(prefix, validate=not no_validate)
    emit(jsonfile.output(jsonfile.nulls(report)) if as_json else format_report(report))


CAT_HELP = """Print documents of a .bin/.idx: detokenized with --tokenizer, else as token ids.

Without --json, ids are printed one document per line; decoded texts are printed back to back,
each followed by a newline (use --json for one JSON object per document when texts hold newlines).

--quarantine RUN/quarantine.jsonl prints instead the samples llm-train quarantined when its health
gate tripped: a header line per sample (step, rank, why, source, documents and token ranges), then the
exact tokens the model read. The sources must be the data the run read (their .idx unchanged), and the
file must belong to the run folder it is in.

\b
Examples:
  llm-prep cat data/corpus_text_document --docs 0:5
  llm-prep cat data/corpus_text_document --docs 0:3 --tokenizer tokenizer.json
  llm-prep cat data/corpus_text_document --docs -1 --tokenizer byte --json
  llm-prep cat --quarantine runs/tiny/quarantine.jsonl --tokenizer tokenizer.json
"""


@app.command("cat", help=CAT_HELP, no_args_is_help=True)
def cat_cmd(
    prefix: str = typer.Argument(None, help="Dataset prefix (foo, foo.bin or foo.idx)."),
    docs: str = typer.Option(
        None, "--docs", help="Documents: N, START:STOP or START:STOP:STEP (default: all)."
    ),
    tokenizer: str = typer.Option(
        None, "-t", "--tokenizer", help="Decode with this tokenizer: " + TOKENIZER_HELP
    ),
    as_json: bool = typer.Option(
        False, "--json", help='One JSON object per document: {"doc", "ids" or "text"}.'
    ),
    quarantine: Path = typer.Option(
        None,
        "--quarantine",
        metavar="RUN/quarantine.jsonl",
        help="Print the samples a training run quarantined (instead of PREFIX's documents).",
    ),
) -> None:
    from llmtools.errors import UsageError
    from llmtools.prep.inspect import iter_documents

    if (prefix is None) == (quarantine is None):
        raise UsageError("give a dataset PREFIX or --quarantine RUN/quarantine.jsonl (one of them)")
    if quarantine is not None and docs:
        raise UsageError("--docs selects documents of a PREFIX; not with --quarantine")
    tok = None
    if tokenizer:
        from llmtools.tokenize import load_tokenizer

        tok = load_tokenizer(tokenizer, backend="tokenizers")
    if quarantine is not None:
        _cat_quarantine(quarantine, tok, as_json)
        return
    for j, ids in iter_documents(prefix, docs):
        if tok is not None:
            text = tok.decode(ids)
            emit(jsonfile.output({"doc": j, "text": text}, ensure_ascii=False) if as_json else text)
        else:
            emit(
                jsonfile.output({"doc": j, "ids": ids.tolist()})
                if as_json
                else " ".join(map(str, ids.tolist()))
            )


def _quarantine_run(path: Path) -> str | None:
    """The id of the run whose folder holds ``path`` (from its newest checkpoint's data ledger), if any."""
    from llmtools.ckpt import layout
    from llmtools.ckpt.verify import read_meta

    for _, checkpoint in reversed(layout.list_checkpoints(layout.checkpoints_dir(path.parent))):
        try:
            ledger = (read_meta(checkpoint).get("data") or {}).get("ledger")
        except (InputError, AttributeError):
            continue
        if isinstance(ledger, dict) and isinstance(ledger.get("run"), str):
            return ledger["run"]
    return None


def _cat_quarantine(path: Path, tok, as_json: bool) -> None:
    import numpy as np

    from llmtools.formats.quarantine import read_records, sample_tokens

    if not path.is_file():
        raise InputError(f"{path}: no such quarantine file")
    run = _quarantine_run(path)
    numbered = read_records(path, run, whose=f"the run in {path.parent}", with_lines=True)
    for record, sample, pieces in sample_tokens(path, numbered):
        ids = np.concatenate([p for _, p in pieces]) if pieces else np.empty(0, np.int64)
        where = ", ".join(f"doc {d['document']} tokens {d['start']}..{d['end']}" for d, _ in pieces)
        loss = sample.get("loss")
        header = (
            f"# step {record['step']} rank {record['rank']} {record['reason']}: {sample['source']} {where} "
            f"(sample {sample['sample']}, stream position {sample['stream_position']}"
            + (f", loss {loss:.4g}" if isinstance(loss, (int, float)) else "")
            + ")"
        )
        entry = {
            "step": record["step"],
            "rank": record["rank"],
            "reason": record["reason"],
            "source": sample["source"],
            "prefix": sample["prefix"],
            "documents": [d for d, _ in pieces],
        }
        if tok is not None:
            entry["text"] = tok.decode(ids)
        else:
            entry["ids"] = ids.tolist()
        if as_json:
            emit(jsonfile.output(entry, ensure_ascii=False))
        else:
            emit(header)
            emit(entry["text"] if tok is not None else " ".join(map(str, entry["ids"])))


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
    force: bool = typer.Option(False, "--force", help="Replace an earlier tokenizer written by llmtools."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary instead of the path."),
) -> None:
    from llmtools.cli.claim import claim, input_paths
    from llmtools.prep.tokenizer_train import TrainConfig, outputs, train_tokenizer

    keys = _keys(json_keys)
    config = TrainConfig(
        vocab_size=vocab_size,
        eod_token=eod_token,
        special_tokens=special_token,
        min_frequency=min_frequency,
        json_keys=keys,
    )
    claim(outputs(output), inputs=input_paths(inputs), force=force)
    summary = train_tokenizer(inputs, output, config, force=force, skip_bad=skip_bad)
    log(
        f"llm-prep tokenizer train: vocab {summary['vocab_size']}, EOD {summary['eod_token']!r} = {summary['eod_id']}"
    )
    emit(jsonfile.output(summary) if as_json else summary["path"])


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
    force: bool = typer.Option(
        False, "--force", help="Replace an earlier sample corpus written by llmtools."
    ),
) -> None:
    from llmtools.cli.claim import claim
    from llmtools.prep.sample_corpus import corpus_output, write_sample_corpus

    claim(corpus_output(output, style).claimed(), force=force)
    for path in write_sample_corpus(output, docs=docs, seed=seed, styles=style, force=force):
        emit(str(path))


SAMPLE_TASK_HELP = """Write a downstream task built from the sample corpus: arithmetic sums, multiple choice.

Each example is a prompt of the arith style ("17 + 25 =") and four sums, the right one among three off by
1 to 10 ({"context", "choices", "gold"}: the task format of eval.tasks and llm-ckpt eval, see
docs/evaluation.md). Deterministic from --seed.

\b
Examples:
  llm-prep sample-task -o tasks/arith_sums.jsonl
  llm-ckpt eval runs/tiny --tasks tasks/arith_sums.jsonl
"""


@app.command("sample-task", help=SAMPLE_TASK_HELP)
def sample_task_cmd(
    output: Path = typer.Option(..., "-o", "--output", help="The task file to write (JSONL)."),
    examples: int = typer.Option(100, "--examples", help="Examples."),
    seed: int = typer.Option(1234, "--seed", help="Seed; the same seed gives the same bytes."),
    force: bool = typer.Option(False, "--force", help="Replace a task file written by llmtools."),
) -> None:
    from llmtools.cli.claim import claim
    from llmtools.prep.sample_corpus import arith_task_output, write_arith_task

    claim(arith_task_output(output).claimed(), force=force)
    emit(str(write_arith_task(output, examples=examples, seed=seed, force=force)))


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

from llmtools.cli.prep_merge import register as _register_merge  # noqa: E402 - merge lives in its own module

_register_merge(app)

from llmtools.cli.prep_curate import register as _register_curate  # noqa: E402 - filter lives in its own module

_register_curate(app)

from llmtools.cli.prep_decontam import register as _register_decontam  # noqa: E402 - its own module

_register_decontam(app)

from llmtools.cli.prep_dedup import register as _register_dedup  # noqa: E402 - dedup lives in its own module

_register_dedup(app)


def main() -> None:
    sys.argv[1:] = expand_multi_value_flags(sys.argv[1:], MULTI_VALUE_FLAGS, stop_at_files=True)
    run(app, "llm-prep")


if __name__ == "__main__":
    main()
