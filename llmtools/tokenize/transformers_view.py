"""A Hugging Face tokenizer folder as ``transformers`` makes it, computed once per folder.

transformers applies a folder's ``tokenizer_config.json`` to the backend tokenizer (``add_bos_token``, added
tokens, a model class that rebuilds the pipeline), and Megatron-LM tokenizes with what it makes, so we do
too. Importing transformers (and the torch it imports) costs 5 to 50 s, far more than rendering and
tokenizing a chat set. A plain folder is read without it (:mod:`llmtools.tokenize.folder_view`); for any
other, what transformers makes of it (the backend tokenizer's JSON, ``len(tokenizer)``, the EOS and BOS
ids) is kept in the cache (``$LLMTOOLS_CACHE``, default ``~/.cache/llmtools``: ``tokenizers/<hash>.json``
and its ``<hash>.tokenizer.json``), named by the hash of the folder's files and transformers' version:
later loads read those files, as fast as the folder's own ``tokenizer.json``. A cache that cannot be
written is skipped; one that does not parse, or whose two files disagree, is made again.
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

from llmtools.formats import jsonfile
from llmtools.fsutil import cache_dir, sha256_file, write_text_atomic

FORMAT = 2  # bumped when what is stored changes
READ_BY_TRANSFORMERS = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "config.json",
    "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model",
)  # fmt: skip
"""The files that can change what transformers makes of a folder (config.json names the class when the
tokenizer config does not); the cache key hashes each one present."""


def transformers_view(path: Path):
    """``(tokenizers.Tokenizer, len(tokenizer), eos_id, bos_id)`` as transformers loads the folder ``path``,
    or None when transformers is not installed or gives no fast tokenizer for it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = version("transformers")
    except PackageNotFoundError:
        return None
    digest = hashlib.sha256(f"{release}\0{FORMAT}\0".encode())
    for name in READ_BY_TRANSFORMERS:
        if (path / name).is_file():
            digest.update(f"{name}\0{sha256_file(path / name)}\n".encode())
    import tokenizers

    cached = cache_dir() / "tokenizers" / (digest.hexdigest() + ".json")
    view = _read(cached)
    if view is not None:
        try:
            return tokenizers.Tokenizer.from_str(view["tokenizer"]), *_ids(view)
        except Exception:  # noqa: BLE001 - tokenizers raises bare Exception: a damaged entry, made again
            pass
    # Seconds to a minute (the import, a conversion): said before and after, so the wait is never silent.
    print(f"reading {path} through transformers (once; kept in {cached})", file=sys.stderr, flush=True)
    started = time.monotonic()
    view = _make(path)
    if view is None:
        return None
    print(
        f"read {path} through transformers in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True
    )
    _write(cached, view)
    return tokenizers.Tokenizer.from_str(view["tokenizer"]), *_ids(view)


def _ids(view: dict) -> tuple:
    return view["vocab_size"], view["eos_id"], view["bos_id"]


def _make(path: Path) -> dict | None:
    try:
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(str(path), local_files_only=True, use_fast=True)
    except Exception:  # noqa: BLE001 - not loadable by transformers: the caller reads the config itself
        return None
    if not getattr(hf, "is_fast", False):
        return None
    return {
        "tokenizer": hf.backend_tokenizer.to_str(),
        "vocab_size": len(hf),
        "eos_id": hf.eos_token_id,
        "bos_id": hf.bos_token_id,
    }


def _backend_file(cached: Path) -> Path:
    """The backend tokenizer's JSON, kept as a file of its own beside the small record: read as a
    tokenizer.json is, with no JSON pass of ours over its megabytes."""
    return cached.with_name(cached.stem + ".tokenizer.json")


def _read(cached: Path) -> dict | None:
    try:
        view = jsonfile.loads(cached.read_text(encoding="utf-8"), finite=True)
        text = _backend_file(cached).read_bytes()
    except (OSError, ValueError):
        return None
    if not isinstance(view, dict) or view.get("tokenizer_sha256") != hashlib.sha256(text).hexdigest():
        return None  # a record without its file, or a file another write replaced: made again
    numbers = [view.get("vocab_size"), view.get("eos_id"), view.get("bos_id")]
    if not isinstance(numbers[0], int) or not all(n is None or isinstance(n, int) for n in numbers[1:]):
        return None
    try:
        return {**view, "tokenizer": text.decode("utf-8")}
    except UnicodeDecodeError:
        return None


def _write(cached: Path, view: dict) -> None:
    record = {k: v for k, v in view.items() if k != "tokenizer"}
    record["tokenizer_sha256"] = hashlib.sha256(view["tokenizer"].encode("utf-8")).hexdigest()
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(_backend_file(cached), view["tokenizer"])
        write_text_atomic(cached, jsonfile.dumps(record, "a tokenizer view"))
    except OSError:
        pass  # no cache: the next load asks transformers again
