"""Training logs: parsers (llm-train metrics.jsonl, Megatron-LM, DeepSpeed, MindFormers, key=value),
a fast TensorBoard event writer with exactly-once conversion and live following, plots, summaries.

Modules: ``sources`` (files, .gz, stdin, tailing), ``parsers`` + ``reader`` (lines to records),
``tfevents`` (event files by hand), ``tb`` (conversion, state, follow), ``analysis`` (spikes,
summaries), ``plot`` (matplotlib), ``runs`` (whole logs as named runs).
"""
