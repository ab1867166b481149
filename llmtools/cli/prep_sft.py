"""``llm-prep sft``: chat / instruction data -> token ids + loss mask for fine-tuning. Registered on ``llm-prep``."""

from __future__ import annotations

import typer

from llmtools.cli._common import report

SFT_HELP = """Render conversations with a chat template and tokenize them for supervised fine-tuning.

Writes two aligned Megatron indexed datasets, one document per sample, plus sidecars
(schema schemas/sft-sidecar.schema.json) and prints their paths:
  PREFIX_input_ids_document.{bin,idx,json}   token ids
  PREFIX_loss_mask_document.{bin,idx,json}   uint8, 1 on the assistant turns (end-of-turn included)
With --pack, samples are packed in order into sequences of at most --max-length tokens and
  PREFIX_segment_ids_document.{bin,idx,json} numbers the samples in each sequence 1, 2, ...:
  attention stays inside a segment and position ids restart at each one.

\b
INPUT: JSONL files, globs or - (.gz/.zst ok), or local HF datasets (save_to_disk folder, .parquet).
--format messages         {"messages": [{"role": "system|user|assistant", "content": ...}], "system"?}
--format prompt-response  {"prompt": ..., "response": ..., "system"?}   (keys: --prompt-key ...)
--format alpaca           {"instruction": ..., "input"?: ..., "output": ...}

\b
--chat-template: default the tokenizer's own (tokenizer_config.json / chat_template.jinja in its
folder), rendered exactly as transformers' apply_chat_template; or chatml, llama3; or a file.
Renderings are deterministic: strftime_now gives --template-date (never the clock), and a template
that uses a source of randomness (the random filter, lipsum) is refused in one line, exit 2.
Bad records (malformed JSON, missing key, unknown role, empty assistant turn, no assistant turn,
a template that fails, or exceeds its limits: 16M characters per conversation, --template-timeout)
stop the run with FILE:LINE and exit 2, leaving no output; --skip-bad skips and counts them. Over-long samples are truncated or dropped (--overflow) and counted.

\b
Examples:
  llm-prep sft chats.jsonl -t tok/ -o data/chat --max-length 2048
  llm-prep sft alpaca.jsonl -t tok/tokenizer.json --format alpaca --chat-template chatml -o data/alp
  llm-prep sft qa.jsonl -t tok/ --format prompt-response --prompt-key q --response-key a -o data/qa
  llm-prep sft hf/ultrachat --split train_sft -t tok/ -o data/uc --max-length 4096 --pack --skip-bad
"""


def sft_cmd(
    inputs: list[str] = typer.Argument(
        ..., help="JSONL files, globs, - for stdin, or local HF datasets.", metavar="INPUT..."
    ),
    tokenizer: str = typer.Option(
        ...,
        "-t",
        "--tokenizer",
        help="HF tokenizer folder or tokenizer.json (its chat template), vocab.json, .model, byte.",
    ),
    output: str = typer.Option(
        ...,
        "-o",
        "--output",
        "--output-prefix",
        help="Output prefix: writes PREFIX_{input_ids,loss_mask}_document.*",
    ),
    fmt: str = typer.Option("messages", "--format", help="messages | prompt-response | alpaca."),
    chat_template: str = typer.Option(
        None, "--chat-template", help="chatml | llama3 | a template file (default: the tokenizer's own)."
    ),
    messages_key: str = typer.Option("messages", "--messages-key", help="Key of the message list."),
    prompt_key: str = typer.Option("prompt", "--prompt-key", help="Prompt key (prompt-response)."),
    response_key: str = typer.Option("response", "--response-key", help="Response key (prompt-response)."),
    system_key: str = typer.Option("system", "--system-key", help="Key of an optional system prompt."),
    system_prompt: str = typer.Option(
        None, "--system-prompt", help="System turn for samples that have none."
    ),
    max_length: int = typer.Option(
        None, "--max-length", help="Longest sample (and packed sequence), in tokens."
    ),
    overflow: str = typer.Option("truncate", "--overflow", help="truncate | drop samples over --max-length."),
    pack: bool = typer.Option(
        False, "--pack", help="Pack samples into --max-length sequences (+ segment ids)."
    ),
    append_eod: bool = typer.Option(
        False, "--append-eod", help="Append the EOD id (trained) to every sample."
    ),
    split: str = typer.Option(None, "--split", help="Split of an HF dataset input."),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Skip bad records, counting them by kind."),
    template_timeout: float = typer.Option(
        10.0, "--template-timeout", help="Seconds a conversation may take to render (a bad record beyond)."
    ),
    template_date: str = typer.Option(
        None,
        "--template-date",
        help="The day a template's strftime_now gives, YYYY-MM-DD (default 2024-07-26, never the clock; "
        "recorded in the sidecar).",
    ),
    force: bool = typer.Option(False, "--force", help="Replace earlier outputs of llmtools."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout instead of paths."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No summary on stderr."),
) -> None:
    from llmtools.cli.claim import claim, input_paths
    from llmtools.prep.sft import SftConfig, build_sft
    from llmtools.prep.template_sandbox import DEFAULT_TEMPLATE_DATE

    config = SftConfig(inputs=inputs, tokenizer=tokenizer, output_prefix=output, format=fmt,
                       chat_template=chat_template, messages_key=messages_key, prompt_key=prompt_key,
                       response_key=response_key, system_key=system_key, system_prompt=system_prompt,
                       max_length=max_length, overflow=overflow, pack=pack, append_eod=append_eod, split=split,
                       skip_bad=skip_bad, force=force, template_timeout=template_timeout,
                        template_date=template_date or DEFAULT_TEMPLATE_DATE)  # fmt: skip
    claim(config.output().claimed(), inputs=input_paths([*inputs, tokenizer, chat_template]), force=force)
    result = build_sft(config)
    report("llm-prep sft", result, as_json, quiet)


def register(app: typer.Typer) -> None:
    """Add ``sft`` to the ``llm-prep`` app."""
    app.command("sft", help=SFT_HELP, no_args_is_help=True)(sft_cmd)
