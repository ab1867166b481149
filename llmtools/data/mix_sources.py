"""The sources of a plan: each ``.bin/.idx`` prefix opened, checked and fingerprinted.

:func:`open_source` opens one prefix (missing, corrupt and empty data refused), records what its index
and sidecar say and the fingerprints a run checks on open; :func:`check_tokenizers` refuses a blend of
sources tokenized differently; the ``refuse_*`` checks refuse one dataset listed under two names.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from llmtools.data.streams import display_name
from llmtools.errors import InputError
from llmtools.formats.fingerprint import fingerprint, sha256_file
from llmtools.formats.indexed import IndexedDatasetReader, strip_suffix
from llmtools.formats.sidecar import read_sidecar


@dataclass
class Source:
    """One ``.bin/.idx`` prefix on disk and what its index and sidecar say."""

    prefix: str  # as given
    path: str  # absolute prefix
    reader: IndexedDatasetReader = field(repr=False)
    sidecar: dict | None = field(repr=False)
    idx_sha256: str
    files: dict = field(
        default_factory=dict, repr=False
    )  # fingerprints of .idx and .bin (formats.fingerprint)

    @property
    def tokenizer(self) -> dict | None:
        tok = (self.sidecar or {}).get("tokenizer")
        return tok if isinstance(tok, dict) else None

    def describe(self) -> dict:
        return {
            "prefix": self.path,
            "prefix_as_given": self.prefix,
            "documents": int(self.reader.num_documents),
            "sequences": int(self.reader.num_sequences),
            "tokens": int(self.reader.num_tokens),
            "dtype": str(self.reader.dtype),
            "idx_sha256": self.idx_sha256,
            "files": self.files,
            "sidecar": self.sidecar is not None,
            "tokenizer": self.tokenizer,
        }


def open_source(prefix: str, base: Path | None = None) -> Source:
    """Open and check one prefix (missing, corrupt, empty are :class:`InputError`)."""
    given = strip_suffix(prefix)
    candidates = [Path(given)]
    if base is not None and not Path(given).is_absolute():
        candidates.append(base / given)
    chosen = next(
        (c for c in candidates if Path(f"{c}.idx").exists() and Path(f"{c}.bin").exists()), candidates[0]
    )
    if not Path(f"{chosen}.idx").exists() and not Path(f"{chosen}.bin").exists():
        raise InputError(f"{given}: no such dataset (expected {given}.bin and {given}.idx){_written_as(candidates)}")
    reader = IndexedDatasetReader(chosen)  # validated on open
    if reader.num_tokens == 0:
        raise InputError(
            f"{reader.idx_file}: the dataset is empty (0 tokens in {reader.num_documents} documents)"
        )
    sidecar = read_sidecar(chosen)
    idx_sha256 = sha256_file(reader.idx_file)
    idx_stat = os.stat(reader.idx_file)
    files = {  # what a run checks on open: the index by stat and checksum, the tokens by stat and samples
        "idx": {"size": idx_stat.st_size, "mtime_ns": idx_stat.st_mtime_ns, "sha256": idx_sha256},
        "bin": fingerprint(reader.bin_file, sampled=True),
    }
    return Source(given, os.path.abspath(str(chosen)), reader, sidecar, idx_sha256, files)


def _written_as(candidates: list[Path], shown: int = 4) -> str:
    """``; ... did you mean P_text_document?`` when a candidate is what was given to ``json2bin -o``: the
    datasets it wrote are ``<prefix>_<key>_document`` (one per JSON key)."""
    import glob

    for prefix in candidates:
        found = sorted(
            idx[: -len(".idx")]
            for idx in glob.glob(glob.escape(str(prefix)) + "_*_document.idx")
            if Path(idx[: -len(".idx")] + ".bin").exists()
        )
        if found:
            break
    else:
        return ""
    more = f" and {len(found) - shown} more" if len(found) > shown else ""
    return f"; json2bin -o {prefix} writes {prefix}_<key>_document: did you mean {' or '.join(found[:shown])}{more}?"


def check_tokenizers(sources: list[Source], allow_mixed: bool) -> tuple[dict | None, list[str]]:
    """The common tokenizer identity (or None) and notes; mixed tokenizers are an error unless allowed."""
    notes: list[str] = []
    seen: dict[str, tuple[dict, str]] = {}
    for source in sources:
        tok = source.tokenizer
        if tok is None:
            why = "no sidecar" if source.sidecar is None else "its sidecar names no tokenizer"
            notes.append(f"{source.prefix}: {why} (e.g. written by Megatron); its tokenizer is not checked")
            continue
        key = str(tok.get("hash") or json.dumps(tok, sort_keys=True))
        seen.setdefault(key, (tok, source.prefix))
    if len(seen) > 1:
        described = "; ".join(
            f"{prefix}: {tok.get('name') or tok.get('source') or '?'} ({tok.get('hash', 'no hash')})"
            for tok, prefix in seen.values()
        )
        if not allow_mixed:
            raise InputError(
                f"sources were tokenized with different tokenizers: {described} "
                "(--allow-mixed-tokenizers to blend them anyway)"
            )
        notes.append(f"mixed tokenizers allowed: {described}")
        return None, notes
    return (next(iter(seen.values()))[0] if seen else None), notes


def source_names(sources: list[Source]) -> list[str]:
    """A short unique name per source (reports, metrics, the run's data ledger)."""
    taken: set[str] = set()
    names = []
    for source in sources:
        name = display_name(source.path, taken)
        taken.add(name)
        names.append(name)
    return names


def refuse_the_same_data_twice(sources: list[Source], used: list[int], keys: list[str]) -> None:
    """A schedule continues each source by its content (the .idx digest): two prefixes holding the same
    data would be one stream drawn under two weights."""
    seen: dict[str, int] = {}
    for i in used:
        first = seen.setdefault(keys[i], i)
        if first != i:
            raise InputError(
                f"{sources[i].prefix}: the same data as {sources[first].prefix} (identical .idx): a mixture "
                "schedule follows each source by its content, so it cannot be listed twice; give it one "
                "weight (the sum) per stage"
            )


def content_key(source: Source) -> tuple[str, str | None]:
    """(the bytes: .idx digest, .bin size and sampled digest; what made them, from the sidecar: tokenizer
    hash, the inputs' digests, key and options, or None without a sidecar)."""
    data = {k: v for k, v in (source.files.get("bin") or {}).items() if k != "mtime_ns"}
    data_key = json.dumps([source.idx_sha256, data], sort_keys=True)
    if source.sidecar is None:
        return data_key, None
    side = source.sidecar
    made_from = {
        "tokenizer": (source.tokenizer or {}).get("hash"),
        "inputs": [i.get("sha256") for i in side.get("inputs") or [] if isinstance(i, dict)],
        **{k: side.get(k) for k in ("json_key", "append_eod", "special_tokens", "dtype", "shard")},
    }
    return data_key, json.dumps(made_from, sort_keys=True, default=str)


def refuse_the_same_content(sources: list[Source], ids: list[int], split: str) -> None:
    """Two prefixes with the same content would be blended as two sources: samples repeat and the
    ledger names one source under two names. Refused (a prefix copied under a second name is a mistake
    in the list): list it once, with one weight, the sum. The same bytes are the same content unless
    both sidecars say they were made from different inputs or with another tokenizer."""
    seen: dict[str, list[tuple[int, str | None]]] = {}
    for i in dict.fromkeys(ids):
        data_key, made = content_key(sources[i])
        for first, other in seen.get(data_key, []):
            if made is None or other is None or made == other:
                raise InputError(
                    f"{sources[i].prefix}: the same data as {sources[first].prefix} in the {split} blend "
                    "(identical .idx and .bin, from the same inputs and tokenizer); list it once, with one "
                    "weight (the sum)"
                )
        seen.setdefault(data_key, []).append((i, made))
