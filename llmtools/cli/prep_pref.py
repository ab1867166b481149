"""``llm-prep pref``: preference pairs -> chosen / rejected token and loss-mask datasets for DPO. Registered on
``llm-prep``."""

from __future__ import annotations

import typer

from llmtools.cli._common import report

PREF_HELP = """Render preference pairs (a prompt, a chosen and a rejected answer) with a chat template and
tokenize them for preference training (llm-train with task: dpo).

Writes four aligned Megatron indexed datasets, one document per pair, plus sidecars
(schema schemas/pref-sidecar.schema.json) and prints their paths:
  PREFIX_chosen_input_ids_document.{bin,idx,json}     prompt + chosen answer
  PREFIX_chosen_loss_mask_document.{bin,idx,json}     uint8, 1 on the answer (end-of-turn included)
  PREFIX_rejected_input_ids_document.{bin,idx,json}   prompt + rejected answer
  PREFIX_rejected_loss_mask_document.{bin,idx,json}
Both sequences of a pair start with the same prompt tokens (checked). PREFIX_chosen is also an
llm-prep sft prefix (task: sft on the chosen answers).

\b
INPUT: JSONL files, globs or - (.gz/.zst ok), or local HF datasets (save_to_disk folder, .parquet),
in the shapes of TRL's preference datasets:
  {"prompt": str, "chosen": str, "rejected": str, "system"?: str}
  {"prompt": [messages], "chosen": [messages], "rejected": [messages]}   explicit prompt
  {"chosen": [messages], "rejected": [messages]}     implicit prompt: the shared leading messages
Messages are {"role": "system|user|assistant", "content": str}.

\b
Rendering is llm-prep sft's: the tokenizer's own chat template (or chatml, llama3, a file),
exactly as transformers' apply_chat_template renders and tokenizes it.
Truncation, in tokens, the prompt first and then the response:
  --max-prompt-length P   a longer prompt keeps its last P tokens (TRL's max_prompt_length, <= v0.28)
  --max-length L          a pair whose prompt alone fills L is dropped; a longer sequence keeps its
                          first L tokens, cutting the response's end (TRL's max_length, keep_start),
                          or the pair is dropped with --overflow drop
Bad pairs (malformed JSON, missing key, unknown role, one answer a string and the other messages,
no assistant answer after the prompt, a prompt rendered differently before the two answers, a
template that fails or exceeds its limits: 16M characters per conversation, --template-timeout)
stop the run with FILE:LINE and exit 2, leaving no output; --skip-bad skips
and counts them. Renderings are deterministic: strftime_now gives --template-date (never the
clock), and a template that uses a source of randomness (random, lipsum) is refused, exit 2.

\b
Examples:
  llm-prep pref prefs.jsonl -t tok/ -o data/pref --max-length 1024 --max-prompt-length 512
  llm-prep pref hf/ultrafeedback --split train_prefs -t tok/ -o data/uf --max-length 2048 --skip-bad
  llm-prep pref pairs.jsonl -t tok/tokenizer.json --chat-template chatml -o data/p --system-prompt "Be kind."
"""


def pref_cmd(
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
        help="Output prefix: writes PREFIX_{chosen,rejected}_{input_ids,loss_mask}_document.*",
    ),
    chat_template: str = typer.Option(
        None, "--chat-template", help="chatml | llama3 | a template file (default: the tokenizer's own)."
    ),
    prompt_key: str = typer.Option("prompt", "--prompt-key", help="Key of the prompt."),
    chosen_key: str = typer.Option("chosen", "--chosen-key", help="Key of the preferred answer."),
    rejected_key: str = typer.Option("rejected", "--rejected-key", help="Key of the other answer."),
    system_key: str = typer.Option("system", "--system-key", help="Key of an optional system prompt."),
    system_prompt: str = typer.Option(None, "--system-prompt", help="System turn for pairs that have none."),
    max_length: int = typer.Option(
        None, "--max-length", help="Longest sequence (prompt + answer), in tokens."
    ),
    max_prompt_length: int = typer.Option(
        None, "--max-prompt-length", help="Longest prompt, in tokens (keeps its end)."
    ),
    overflow: str = typer.Option("truncate", "--overflow", help="truncate | drop pairs over --max-length."),
    split: str = typer.Option(None, "--split", help="Split of an HF dataset input."),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Skip bad pairs, counting them by kind."),
    template_timeout: float = typer.Option(
        10.0, "--template-timeout", help="Seconds a conversation may take to render (a bad pair beyond)."
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
    from llmtools.prep.pref import PrefConfig, build_pref
    from llmtools.prep.template_sandbox import DEFAULT_TEMPLATE_DATE

    config = PrefConfig(inputs=inputs, tokenizer=tokenizer, output_prefix=output, chat_template=chat_template,
                        prompt_key=prompt_key, chosen_key=chosen_key, rejected_key=rejected_key,
                        system_key=system_key, system_prompt=system_prompt, max_length=max_length,
                        max_prompt_length=max_prompt_length, overflow=overflow, split=split, skip_bad=skip_bad,
                        force=force, template_timeout=template_timeout,
                        template_date=template_date or DEFAULT_TEMPLATE_DATE)  # fmt: skip
    claim(config.output().claimed(), inputs=input_paths([*inputs, tokenizer, chat_template]), force=force)
    result = build_pref(config)
    report("llm-prep pref", result, as_json, quiet)


def register(app: typer.Typer) -> None:
    """Add ``pref`` to the ``llm-prep`` app."""
    app.command("pref", help=PREF_HELP, no_args_is_help=True)(pref_cmd)
