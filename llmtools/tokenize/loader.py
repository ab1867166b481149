"""``load_tokenizer(spec)``: one entry point for every tokenizer kind, all offline.

spec is one of
  * ``byte``                                   the built-in byte-level tokenizer (no file)
  * ``path/tokenizer.json``                    a Hugging Face ``tokenizers`` file        (kind hf-json)
  * ``path/folder``                            a Hugging Face tokenizer folder           (kind hf-folder)
    (special tokens, BOS/EOS from its tokenizer_config.json; as ``transformers`` loads it when
    installed, exactly as Megatron-LM's ``HuggingFaceTokenizer`` does: a plain folder read from its files
    alone, any other through transformers once, then from the cache)
  * ``path/vocab.json`` (``merges.txt`` beside it, or ``X-vocab.json`` + ``X-merges.txt``)
    a GPT-2 style BPE, encoded as Megatron-LM's ``GPT2BPETokenizer`` (transformers' GPT-2 tokenizer
    built from the two files)                                                  (kind gpt2-bpe)
  * ``path/x.model``                           a SentencePiece model                     (kind sentencepiece)
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

from llmtools.errors import InputError, UsageError
from llmtools.formats import jsonfile
from llmtools.resources import announce_shadow
from llmtools.tokenize.base import Tokenizer, check_policy
from llmtools.tokenize.byte_tokenizer import ByteTokenizer
from llmtools.tokenize.folder_view import folder_view
from llmtools.tokenize.hf import HFTokenizer
from llmtools.tokenize.spm import SentencePieceTokenizer
from llmtools.tokenize.transformers_view import transformers_view

BACKENDS = ("auto", "tokenizers", "gigatoken")
HF_FOLDER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")
EOD_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>", "<|im_end|>", "<EOD>", "[SEP]")
BOS_NAMES = ("<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>", "<|bos|>", "[CLS]")


def file_sha256(paths) -> str:
    digest = hashlib.sha256()
    paths = list(paths)
    for path in paths:
        inner = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                inner.update(block)
        if len(paths) == 1:
            return "sha256:" + inner.hexdigest()
        digest.update(f"{Path(path).name}\0{inner.hexdigest()}\n".encode())
    return "sha256:" + digest.hexdigest()


def load_tokenizer(
    spec: str | os.PathLike, backend: str = "auto", special_tokens: str = "auto", *, defer_probe: bool = False
) -> Tokenizer:
    """Load any supported tokenizer; see the module docstring for ``spec``.

    ``backend``: ``auto`` (gigatoken where it gives ids identical to ``tokenizers``, else ``tokenizers``),
    ``tokenizers`` or ``gigatoken`` (an error if it cannot match). ``special_tokens``: see
    :mod:`llmtools.tokenize.base`. ``defer_probe``: check gigatoken against ``tokenizers`` in a thread
    (its first encode is slow to set up); the first encode waits for it, and a ``--backend gigatoken``
    that does not match raises there instead of here.
    """
    tokenizer = _load(spec, backend, special_tokens, defer_probe)
    tokenizer.rebuild = (load_tokenizer, (tokenizer.source, backend, tokenizer.policy))
    return tokenizer


def _load(spec: str | os.PathLike, backend: str, special_tokens: str, defer_probe: bool) -> Tokenizer:
    check_policy(special_tokens)
    if backend not in BACKENDS:
        raise UsageError(f"--backend: unknown backend {backend!r} (choose one of {', '.join(BACKENDS)})")
    text = str(spec)
    if text == "byte":
        if Path(text).exists():  # the name is the built-in one; a path to the file has a '/'
            announce_shadow("tokenizer", text, Path(text).is_dir(), what="built-in byte-level tokenizer")
        return ByteTokenizer(policy=special_tokens)
    path = Path(text)
    if not path.exists():
        raise InputError(
            f"{path}: no such tokenizer file or folder (give tokenizer.json, an HF folder, vocab.json, a .model, or 'byte')"
        )
    if path.is_dir():
        if (path / "tokenizer.json").exists():
            return _load_hf_folder(path, backend, special_tokens, defer_probe)
        if (path / "vocab.json").exists():
            return _load_gpt2(path / "vocab.json", backend, special_tokens, defer_probe)
        if (path / "tokenizer.model").exists():
            return _load_sentencepiece(path / "tokenizer.model", special_tokens)
        raise InputError(f"{path}: folder has no tokenizer.json, vocab.json or tokenizer.model")
    if path.suffix == ".model":
        return _load_sentencepiece(path, special_tokens)
    if path.suffix == ".json":
        try:
            head = _load_json_file(path)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise InputError(f"{path}: not a valid JSON tokenizer file ({error})") from None
        if isinstance(head, dict) and isinstance(head.get("model"), dict):
            return _load_hf_json(path, backend, special_tokens, defer_probe)
        if isinstance(head, dict) and all(isinstance(v, int) for v in list(head.values())[:100]):
            return _load_gpt2(path, backend, special_tokens, defer_probe)
        raise InputError(
            f"{path}: neither a Hugging Face tokenizer.json (no 'model' key) nor a GPT-2 vocab.json"
        )
    raise InputError(
        f"{path}: unknown tokenizer file type (expected tokenizer.json, vocab.json, a .model or a folder)"
    )


def _load_json_file(path: Path):
    """json.load, with orjson first when installed (a GPT-2 vocab.json is 1 MB: ~5x faster, and only
    read to tell a vocab from a tokenizer.json); errors are worded by the standard library."""
    data = path.read_bytes()
    try:
        import orjson
    except ImportError:
        orjson = None
    if orjson is not None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return jsonfile.loads(data.decode("utf-8"))


def _tokenizer_from_file(path: Path):
    """``tokenizers.Tokenizer`` from the file's text, not its path: the library takes a path only as UTF-8
    text, and a path is any bytes the filesystem allows."""
    import tokenizers

    with open(path, "rb") as handle:
        data = handle.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not UTF-8 text ({error})") from None
    return tokenizers.Tokenizer.from_str(text)


def _special_id(tok, names) -> int | None:
    for name in names:
        token_id = tok.token_to_id(name)
        if token_id is not None:
            return int(token_id)
    return None


def _load_hf_json(path: Path, backend: str, policy: str, defer_probe: bool = False) -> Tokenizer:

    try:
        tok = _tokenizer_from_file(path)
    except Exception as error:  # noqa: BLE001 - tokenizers raises bare Exception on bad files
        raise InputError(f"{path}: cannot load as a Hugging Face tokenizer.json ({error})") from None
    return HFTokenizer(
        tok,
        kind="hf-json",
        source=str(path),
        name=(path.parent.name or path.stem) if path.name == "tokenizer.json" else path.stem,
        hash=file_sha256([path]),
        vocab_size=tok.get_vocab_size(with_added_tokens=True),
        eod_id=_special_id(tok, EOD_NAMES),
        bos_id=_special_id(tok, BOS_NAMES),
        policy=policy,
        backend=backend,
        defer_probe=defer_probe,
    )


def _load_hf_folder(
    path: Path,
    backend: str,
    policy: str,
    defer_probe: bool = False,
    *,
    add_special_tokens: bool = True,
    extra_special: Sequence[str] = (),
) -> Tokenizer:
    """``add_special_tokens=False`` leaves out what the post-processor adds (BOS/EOS), as Megatron-LM's
    HuggingFaceTokenizer does by default since core_v0.15; ``extra_special`` adds special tokens
    (``--tokenizer-special-tokens``) after the vocabulary, in order."""
    files = [path / f for f in HF_FOLDER_FILES if (path / f).exists()]
    common = {
        "kind": "hf-folder",
        "source": str(path),
        "name": path.name,
        "hash": _with_extras(file_sha256(files), add_special_tokens, extra_special),
        "policy": policy,
        "backend": backend,
        "defer_probe": defer_probe,
    }
    # transformers applies the config (added and special tokens, a model class, ...) to the backend, as
    # Megatron sees it. A plain folder is read as transformers reads it, without importing it (that costs more
    # than most commands' work); any other is read through transformers once and cached.
    view = None
    if (path / "tokenizer_config.json").exists():
        view = folder_view(path) or transformers_view(path)
    if view is not None:
        tok, length, eos, bos = view
        before = tok.get_vocab_size(with_added_tokens=True)
        tok = _adjust(tok, add_special_tokens, extra_special)
        vocab = length + tok.get_vocab_size(with_added_tokens=True) - before  # len(): Megatron's vocab size
        return HFTokenizer(tok, vocab_size=vocab, eod_id=eos, bos_id=bos, **common)

    try:
        tok = _tokenizer_from_file(path / "tokenizer.json")
    except Exception as error:  # noqa: BLE001 - tokenizers raises bare Exception on bad files
        raise InputError(
            f"{path / 'tokenizer.json'}: cannot load as a Hugging Face tokenizer.json ({error})"
        ) from None
    eod, bos = _special_id(tok, EOD_NAMES), _special_id(tok, BOS_NAMES)
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        config = _read_json(path / name)
        eod = _config_token(tok, config.get("eos_token"), eod)
        bos = _config_token(tok, config.get("bos_token"), bos)
    tok = _adjust(tok, add_special_tokens, extra_special)
    return HFTokenizer(
        tok, vocab_size=tok.get_vocab_size(with_added_tokens=True), eod_id=eod, bos_id=bos, **common
    )


def _adjust(tok, add_special_tokens: bool, extra_special: Sequence[str]):
    """Drop the post-processor (its BOS/EOS) and add special tokens, as Megatron-style options ask."""
    if not add_special_tokens:
        tok.post_processor = None
    if extra_special:
        import tokenizers

        tok.add_special_tokens(
            [tokenizers.AddedToken(t, special=True, normalized=False) for t in extra_special]
        )
    return tok


def _with_extras(file_hash: str, add_special_tokens: bool, extra_special: Sequence[str]) -> str:
    """The files' hash, or, when options change the vocabulary or the ids, a hash of both."""
    if add_special_tokens and not extra_special:
        return file_hash
    text = json.dumps(
        {"files": file_hash, "post_processor": add_special_tokens, "added": list(extra_special)}
    )
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _read_json(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        data = jsonfile.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: invalid JSON ({error})") from None
    return data if isinstance(data, dict) else {}


def _config_token(tok, value, default):
    if isinstance(value, dict):
        value = value.get("content")
    if isinstance(value, str) and tok.token_to_id(value) is not None:
        return int(tok.token_to_id(value))
    return default


def _merges_for(vocab: Path) -> Path:
    candidates = [
        vocab.with_name(vocab.name.replace("vocab.json", "merges.txt")),
        vocab.with_name("merges.txt"),
    ]
    for candidate in candidates:
        if candidate.exists():
            return candidate
    raise InputError(
        f"{vocab}: GPT-2 vocab needs its merges file beside it (tried {', '.join(c.name for c in candidates)})"
    )


def _load_gpt2(
    vocab: Path,
    backend: str,
    policy: str,
    defer_probe: bool = False,
    *,
    merges: Path | None = None,
    extra_special: Sequence[str] = (),
) -> Tokenizer:
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers

    from llmtools.fsutil import text_path

    merges = merges if merges is not None else _merges_for(vocab)
    try:
        with text_path(vocab) as vocab_name, text_path(merges) as merges_name:
            tok = tokenizers.Tokenizer(models.BPE.from_file(vocab_name, merges_name))
    except Exception as error:  # noqa: BLE001
        raise InputError(f"{vocab}: cannot load GPT-2 vocab/merges ({error})") from None
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    eod = tok.token_to_id("<|endoftext|>")
    if eod is not None and policy != "plain":
        # Megatron-LM's GPT2BPETokenizer is transformers' GPT-2 tokenizer, which makes <|endoftext|> a
        # special token: its normal call turns the literal string into the EOD id (policy auto/split).
        tok.add_special_tokens([tokenizers.AddedToken("<|endoftext|>", special=True, normalized=False)])
    tok = _adjust(tok, True, extra_special)
    return HFTokenizer(
        tok,
        kind="gpt2-bpe",
        source=str(vocab),
        name=vocab.parent.name if vocab.name == "vocab.json" else vocab.stem,
        hash=_with_extras(file_sha256([vocab, merges]), True, extra_special),
        vocab_size=tok.get_vocab_size(with_added_tokens=True),
        eod_id=eod,
        bos_id=None,
        policy=policy,
        backend=backend,
        defer_probe=defer_probe,
    )


def _load_sentencepiece(path: Path, policy: str) -> Tokenizer:
    try:
        return SentencePieceTokenizer(path, source=str(path), hash=file_sha256([path]), policy=policy)
    except (RuntimeError, OSError) as error:
        raise InputError(f"{path}: cannot load as a SentencePiece model ({error})") from None
