"""The dataset card (``README.md``) of an ``llm-export hf`` folder, written from its ``llmtools.json`` manifest.

YAML front matter (for Parquet, the ``configs`` section that lets ``datasets.load_dataset(DIR)`` find
the shards) followed by prose: how to open it, row and token counts, features, the tokenizer and
where the data came from.
"""

from __future__ import annotations

from pathlib import Path

from llmtools.formats import jsonfile
from llmtools.fsutil import printable


def dataset_card(manifest: dict) -> str:
    """A Hugging Face dataset card: YAML front matter (so ``load_dataset(DIR)`` finds Parquet shards) + prose."""
    split = manifest["split"]
    yaml = ["---", "tags:", "- llmtools", "- tokenized"]
    if manifest["layout"] == "parquet":
        yaml += ["configs:", "- config_name: default", "  data_files:", f"  - split: {split}",
                 f"    path: data/{split}-*.parquet"]  # fmt: skip
    yaml.append("---")
    source = manifest["source"]
    sidecar = source.get("sidecar") or {}
    tok = sidecar.get("tokenizer") or {}
    lines = [*yaml, "", f"# Tokenized dataset exported from `{Path(source['path']).name}`", ""]
    if manifest["layout"] == "arrow":
        how = '```python\nimport datasets\nds = datasets.load_from_disk("{this folder}")\n```'
    else:
        how = f'```python\nimport datasets\nds = datasets.load_dataset("parquet", data_files="{{this folder}}/data/*.parquet")["{split}"]\n```'
    lines += [f"Written by {manifest['tool']} (`llm-export hf`) on {manifest['created']}.", "", how, ""]
    lines += ["## Contents", "", "| | |", "|---|---|",
              f"| rows | {manifest['rows']:,} |", f"| tokens | {manifest['tokens']:,} |",
              f"| layout | {manifest['layout']} ({len(manifest['shards'])} shard(s)) |",
              f"| mode | {manifest['mode']} |", f"| split | {split} |"]  # fmt: skip
    if manifest["mode"] == "packed":
        lines.append(f"| row length | {manifest['row_length']} tokens |")
    if "dropped_tokens" in manifest:
        lines.append(f"| tokens dropped (last partial block) | {manifest['dropped_tokens']:,} |")
    lines += ["", "## Features", ""]
    descriptions = {
        "input_ids": "token ids",
        "labels": "token ids, equal to `input_ids` (the model shifts them: predicts token t+1 from tokens <= t)",
        "sequence_lengths": "lengths of the sequences (e.g. sentences) a document was split into in the source",
        "source": "the mix source the sample was drawn from (`Counter(ds['source'])` shows the realized blend)",
        "text": "the detokenized row"
        + (" (without the appended end-of-document token)" if manifest["mode"] == "documents" else ""),
    }
    for name, feature in manifest["features"].items():
        dtype = feature.get("feature", feature).get("dtype")
        kind = f"list of {dtype}" if "feature" in feature else dtype
        lines.append(f"- `{name}` ({kind}): {descriptions.get(name, '')}")
    if manifest["mode"] == "packed" and source["kind"] == "mix":
        lines += ["", "Rows are the training samples of the mix plan, in plan order, exactly what llmtools' training",
                  "dataset yields: `seq_length + 1` tokens each (Megatron-LM trains on `tokens[:-1] -> tokens[1:]`;",
                  "a Hugging Face causal-LM model given `labels == input_ids` shifts them the same way)."]  # fmt: skip
    elif manifest["mode"] == "packed":
        lines += ["", "Rows are consecutive fixed-length blocks of all documents concatenated (the Hugging Face",
                  "`group_texts` recipe); the last partial block is dropped."]  # fmt: skip
    lines += ["", "## Tokenizer", ""]
    if tok:
        for key in ("kind", "name", "source", "hash", "vocab_size", "eod_id", "bos_id"):
            if key in tok:
                lines.append(f"- {key}: `{tok[key]}`")
    else:
        lines.append("Unknown: no llmtools sidecar recorded it (for example, Megatron-LM made the source).")
    lines += ["", "## Provenance", "", f"- source ({source['kind']}): `{source['path']}`"]
    if source["kind"] == "mix":
        mix = source.get("mix") or {}
        for item in mix.get("sources", []) if isinstance(mix.get("sources"), list) else []:
            if isinstance(item, dict):
                lines.append(f"  - `{item.get('prefix')}` weight {item.get('weight')}")
    if sidecar.get("inputs"):
        lines.append("- made from:")
        for item in sidecar["inputs"]:
            lines.append(
                f"  - `{item.get('path')}` ({item.get('size')} bytes, sha256 `{item.get('sha256')}`)"
            )
    for key in ("json_key", "append_eod", "special_tokens", "created", "tool"):
        if key in sidecar:
            lines.append(f"- {key}: `{sidecar[key]}`")
    if sidecar.get("counts"):
        lines.append(f"- counts: `{jsonfile.dumps(sidecar['counts'])}`")
    lines.append("")
    # Prose for people and the Hub (which wants UTF-8): paths that are not UTF-8 shown by the one rule;
    # llmtools.json beside it keeps their exact bytes.
    return printable("\n".join(lines))
