"""``llm-prep merge``: many tokenized datasets -> one, in bounded memory, byte for byte Megatron's merge.

The result equals what Megatron-LM's ``tools/merge_datasets.py`` writes for the same datasets in the same
order (its ``IndexedDatasetBuilder.add_index`` / ``finalize``): the ``.bin`` files back to back, the
sequence lengths and document indices concatenated (each shard's shifted by the sequences before it),
the byte pointers recomputed as the running sum. Unlike it, nothing grows with the corpus: lengths and
document indices stream through :meth:`IndexedDatasetWriter.add_index` in chunks, the token bytes are
copied by the kernel (``copy_file_range``), and the output appears only when complete.

Before anything is written every input is opened and checked (header, sizes, ``.bin`` length) and
the sidecars are compared: different token dtypes or tokenizers are refused, naming the first
offender; so are shards of one ``json2bin --shard`` run that are missing or repeated (``partial``
allows a staged merge of some shards; the result records which ones it holds). Each index is then
checked in full as it streams; a corrupt one stops the merge with nothing written.

The merged sidecar records the tokenizer, the inputs of every shard, summed counts, and where each
part came from (``merged_from``; ``shards``: which shards of which run it covers).

    from llmtools.prep.merge import merge
    result = merge(["data/web-*_text_document"], "data/web_text_document")
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmtools.errors import InputError, UsageError
from llmtools.formats.indexed import IndexedDatasetReader, bin_path, idx_path, strip_suffix
from llmtools.formats.output_marks import check_output_prefix, marker_path
from llmtools.formats.pathlists import expand_prefixes
from llmtools.formats.sidecar import build_sidecar, read_sidecar, sidecar_path
from llmtools.prep.dataset_output import DatasetOutput
from llmtools.prep.shards import MAX_SHARDS
from llmtools.progress import Progress

MEGATRON_EQUIVALENT = "Megatron-LM tools/merge_datasets.py (IndexedDatasetBuilder.add_index + finalize)"


@dataclass
class MergeResult:
    prefix: str
    paths: list[str]
    inputs: int = 0
    documents: int = 0
    sequences: int = 0
    tokens: int = 0
    bin_bytes: int = 0
    dtype: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        secs = max(self.seconds, 1e-9)
        return (
            f"{self.inputs:,} datasets -> {self.prefix}: {self.documents:,} documents, {self.tokens:,} tokens "
            f"({self.dtype}), {self.bin_bytes / 1e6:,.1f} MB in {self.seconds:.2f} s "
            f"({self.bin_bytes / 1e6 / secs:,.0f} MB/s)"
        )

    def to_dict(self) -> dict:
        return {
            "prefix": self.prefix,
            "paths": self.paths,
            "inputs": self.inputs,
            "documents": self.documents,
            "sequences": self.sequences,
            "tokens": self.tokens,
            "bin_bytes": self.bin_bytes,
            "dtype": self.dtype,
            "seconds": round(self.seconds, 4),
            "notes": self.notes,
        }


@dataclass
class _Part:
    prefix: str
    dtype: str
    sequences: int
    documents: int
    bin_bytes: int
    sidecar: dict | None


def tokenizer_key(tok: dict) -> str:
    """What makes two sidecar tokenizers the same: the hash of their files (else the whole record)."""
    return str(tok.get("hash") or json.dumps(tok, sort_keys=True))


def _describe(tok: dict) -> str:
    return f"{tok.get('name') or tok.get('source') or '?'} ({tok.get('hash') or 'no hash'})"


def merge(
    inputs: Sequence[str],
    output_prefix: str,
    *,
    force: bool = False,
    partial: bool = False,
    durable: bool = True,
    progress: bool | None = None,
) -> MergeResult:
    """Concatenate the datasets named by ``inputs`` (prefixes, globs, ``@list`` files), in that order,
    into ``output_prefix.{bin,idx,json}``. Raises InputError (bad or incompatible inputs) and
    UsageError (no inputs, existing outputs without ``force``, another writer at work on them)."""
    output_prefix = strip_suffix(output_prefix)
    check_output_prefix(output_prefix, "-o/--output")
    prefixes = expand_prefixes(inputs)
    if not prefixes:
        raise UsageError("merge: give at least one dataset PREFIX (or a glob, or @list.txt)")
    out_real = os.path.realpath(bin_path(output_prefix))  # --force never replaces an input, links included
    for prefix in prefixes:
        if os.path.realpath(bin_path(prefix)) == out_real:
            raise UsageError(f"{prefix}: is both an input and the output; choose another -o")
    with merge_output(output_prefix, force, durable) as output:
        return _merge(prefixes, output_prefix, partial, output, progress)


def merge_output(output_prefix: str, force: bool = False, durable: bool = True) -> DatasetOutput:
    """What a merge writes: the ``.bin/.idx`` pair and its sidecar, or markers when no input has one
    (with --force, a killed run's temporaries of them go too)."""
    return DatasetOutput(
        [strip_suffix(output_prefix)], force=force, clear_stale=True, markable=True, durable=durable
    )


def _merge(prefixes, output_prefix: str, partial: bool, output: DatasetOutput, progress) -> MergeResult:
    started = time.perf_counter()
    parts = [_open_part(prefix) for prefix in prefixes]  # every header and .bin length, before writing
    dtype = parts[0].dtype
    for part in parts:
        if part.dtype != dtype:
            raise InputError(
                f"{part.prefix}: token dtype {part.dtype}, but {parts[0].prefix} is {dtype} "
                "(datasets of different dtypes cannot be merged)"
            )
    notes: list[str] = []
    tokenizer = _common_tokenizer(parts, notes)
    coverage = _check_shards(parts, partial, notes)

    result = MergeResult(prefix=output_prefix, paths=[], inputs=len(parts), dtype=dtype)
    merged_from = []
    empty = 0
    bar = Progress(sum(p.bin_bytes for p in parts), "merge", unit="B", enabled=progress is not False)
    with_sidecar = any(p.sidecar is not None for p in parts)
    try:
        writer = output.open(output_prefix, dtype)
        for part in parts:
            reader = IndexedDatasetReader(part.prefix)
            added = writer.add_index(reader)
            del reader
            empty += added["empty_documents"]
            merged_from.append(_provenance(part, added))
            bar.update(added["bin_bytes"])
        if with_sidecar:
            output.set_sidecar(
                output_prefix, _merged_sidecar(parts, tokenizer, writer, empty, merged_from, coverage, dtype)
            )
        # .bin/.idx and the sidecar as one step: a signal cannot leave the dataset without its sidecar
        result.paths = [str(path) for path in output.commit()]
    finally:
        bar.close()
    result.documents, result.sequences = writer.num_documents, writer.num_sequences
    result.tokens, result.bin_bytes = writer.num_tokens, sum(p.bin_bytes for p in parts)
    # With --force, an earlier merge's sidecar or markers describe other data: only this run's are kept.
    if with_sidecar:
        for path in result.paths[:2]:
            marker_path(path).unlink(missing_ok=True)
    else:
        notes.append("no input has a sidecar (made by Megatron?): none written for the output either")
        sidecar_path(output_prefix).unlink(missing_ok=True)
        output.mark("llm-prep merge")  # ...markers say llmtools wrote the pair (what --force may replace)
    result.notes = notes
    result.seconds = time.perf_counter() - started
    return result


def _open_part(prefix: str) -> _Part:
    reader = IndexedDatasetReader(prefix)  # header, sizes and the .bin length are checked here
    part = _Part(
        prefix=prefix,
        dtype=reader.dtype.name,
        sequences=reader.num_sequences,
        documents=reader.num_documents,
        bin_bytes=reader.expected_bin_size(),
        sidecar=read_sidecar(prefix),
    )
    if reader.sequence_modes is not None:
        raise InputError(
            f"{reader.idx_file}: has per-sequence modes (a multimodal dataset); merge handles text datasets"
        )
    return part


def _common_tokenizer(parts: list[_Part], notes: list[str]) -> dict | None:
    """The one tokenizer of every sidecar; a different one is refused, naming the first offender."""
    first: _Part | None = None
    unknown = []
    for part in parts:
        tok = (part.sidecar or {}).get("tokenizer")
        if not isinstance(tok, dict):
            unknown.append(part.prefix)
            continue
        if first is None:
            first = part
        elif tokenizer_key(tok) != tokenizer_key(first.sidecar["tokenizer"]):
            raise InputError(
                f"{part.prefix}: tokenized with {_describe(tok)}, but {first.prefix} with "
                f"{_describe(first.sidecar['tokenizer'])} (datasets of different tokenizers cannot be merged)"
            )
    if unknown and first is not None:
        # The merged sidecar would name first's tokenizer for tokens it never saw: refused, not stamped.
        shown = ", ".join(unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
        raise InputError(
            f"{unknown[0]}: has no sidecar naming its tokenizer, but {first.prefix} was made with "
            f"{_describe(first.sidecar['tokenizer'])}; the merged sidecar would vouch for tokens it never saw "
            f"({len(unknown)} such input(s): {shown}); merge only inputs with sidecars, or only inputs without"
        )
    return first.sidecar["tokenizer"] if first is not None else None


def _shard_records(part: _Part) -> list[tuple[str, str, int, list[list[int]]]]:
    """(plan, json key, count, [[lo, hi), ...]) of each run a json2bin shard or a partial merge covers."""
    side = part.sidecar or {}
    key = side.get("json_key") if isinstance(side.get("json_key"), str) else ""
    shard = side.get("shard")
    if isinstance(shard, dict):
        index, count, plan = shard.get("index"), shard.get("count"), shard.get("plan")
        if not (
            isinstance(index, int)
            and isinstance(count, int)
            and isinstance(plan, str)
            and 0 <= index < count <= MAX_SHARDS
        ):
            raise InputError(f"{sidecar_path(part.prefix)}[shard]: malformed shard record {shard!r}")
        return [(plan, key, count, [[index, index + 1]])]
    covered = side.get("shards")
    if covered is None:
        return []
    records = []
    for entry in covered if isinstance(covered, list) else [covered]:
        entry = entry if isinstance(entry, dict) else {}
        plan, count, ranges = entry.get("plan"), entry.get("count"), entry.get("ranges")
        ok = isinstance(plan, str) and isinstance(count, int) and isinstance(ranges, list)
        ok = ok and 0 < count <= MAX_SHARDS
        ok = ok and all(
            isinstance(r, list)
            and len(r) == 2
            and all(isinstance(x, int) for x in r)
            and 0 <= r[0] < r[1] <= count
            for r in ranges
        )
        if not ok:
            raise InputError(f"{sidecar_path(part.prefix)}[shards]: malformed shard coverage {entry!r}")
        records.append((plan, str(entry.get("json_key") or key), count, ranges))
    return records


def _check_shards(parts: list[_Part], partial: bool, notes: list[str]) -> list[dict]:
    """Shards of one json2bin --shard run must each appear once, and all of them unless ``partial``."""
    runs: dict[tuple[str, str], dict] = {}
    for part, (plan, key, count, ranges) in ((p, r) for p in parts for r in _shard_records(p)):
        run = runs.setdefault((plan, key), {"count": count, "owner": {}, "order": []})
        if run["count"] != count:
            raise InputError(
                f"{part.prefix}: shard count {count} differs from {run['count']} for the same run"
            )
        for lo, hi in ranges:
            for index in range(lo, hi):
                if index in run["owner"]:
                    raise InputError(
                        f"{part.prefix}: shard {index}/{count} is also in {run['owner'][index]} "
                        "(a shard given twice would duplicate its documents)"
                    )
                run["owner"][index] = part.prefix
            run["order"].append(lo)
    coverage = []
    for (plan, key), run in runs.items():
        count, have = run["count"], sorted(run["owner"])
        missing = sorted(set(range(count)) - set(have))
        if missing and not partial:
            shown = ", ".join(map(str, missing[:10])) + (" …" if len(missing) > 10 else "")
            example = next(iter(run["owner"].values()))
            raise InputError(
                f"missing shard(s) {shown} of {count} (run {plan}, like {example}); give every shard of the "
                "run, or --partial for a staged merge"
            )
        if run["order"] != sorted(run["order"]):
            notes.append(
                f"the shards of run {plan} are not in shard order: the result differs from one json2bin run "
                "over all its inputs"
            )
        coverage.append({"plan": plan, "json_key": key, "count": count, "ranges": _ranges(have)})
    return coverage


def _ranges(indices: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for i in indices:
        if out and out[-1][1] == i:
            out[-1][1] = i + 1
        else:
            out.append([i, i + 1])
    return out


def _provenance(part: _Part, added: dict) -> dict:
    side = part.sidecar or {}
    return {
        "prefix": part.prefix,
        "documents": added["documents"],
        "sequences": added["sequences"],
        "tokens": added["tokens"],
        "bin_bytes": added["bin_bytes"],
        "idx_sha256": _sha256(idx_path(part.prefix)),
        "sidecar": part.sidecar is not None,
        "shard": side.get("shard") if isinstance(side.get("shard"), dict) else None,
    }


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _common(parts: list[_Part], key: str):
    values = {json.dumps((p.sidecar or {}).get(key)) for p in parts if p.sidecar is not None}
    return json.loads(values.pop()) if len(values) == 1 else None


def _merged_sidecar(parts, tokenizer, writer, empty, merged_from, coverage, dtype) -> dict:
    inputs, skipped = [], {}
    for part in parts:
        side = part.sidecar or {}
        inputs += [entry for entry in side.get("inputs") or [] if isinstance(entry, dict)]
        counts = side.get("counts") if isinstance(side.get("counts"), dict) else {}
        for kind, value in (counts.get("skipped") or {}).items():
            if isinstance(value, int):
                skipped[kind] = skipped.get(kind, 0) + value
    blocks: dict = {"merged": {"equivalent": MEGATRON_EQUIVALENT, "from": merged_from}}
    if coverage:
        blocks["shards"] = coverage
    sidecar = build_sidecar(
        tokenizer=tokenizer,
        dtype=dtype,
        inputs=inputs,
        documents=writer.num_documents,
        sequences=writer.num_sequences,
        tokens=writer.num_tokens,
        json_key=_common(parts, "json_key"),
        append_eod=False,
        empty_documents=empty,
        skipped=skipped,
        **blocks,
    )
    sidecar["append_eod"] = _common(parts, "append_eod")  # null when the parts disagree
    sidecar["special_tokens"] = _common(parts, "special_tokens")
    return sidecar
