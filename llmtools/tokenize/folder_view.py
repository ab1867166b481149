"""What transformers makes of a plain tokenizer folder, read without importing transformers.

Importing transformers (and the torch it imports) costs seconds, often more than rendering and tokenizing a
whole chat set. For the commonest folder, a ``tokenizer.json`` with a ``tokenizer_config.json`` naming the
generic fast class (``PreTrainedTokenizerFast``, ``TokenizersBackend``: what ``save_pretrained`` writes for a
tokenizer built from a ``tokenizer.json``, and what Llama-3-style repositories ship), transformers (5.x)
uses the ``tokenizer.json`` as it is: every token the config names is already one of its added tokens, so it
adds none; ``add_bos_token`` is dropped when a ``tokenizer.json`` exists; an absent post-processor becomes
an empty template, which adds nothing. That case is read here, from the files alone.

Anything else returns None and the caller asks transformers (:mod:`llmtools.tokenize.transformers_view`):
a model class (it may rebuild the pipeline from the vocabulary), a ``config.json`` (it can change the class,
or patch a regex), ``added_tokens.json``, a special or added token the ``tokenizer.json`` lacks or flags
differently, truncation or padding stored in the file, ``split_special_tokens``, remote code, or transformers
4 (a different set of rules). ``tests/tokenize/test_folder_view.py`` compares this reading with
transformers' ``AutoTokenizer`` on generated folders: the same backend JSON, ids, length, EOS and BOS.
"""

from __future__ import annotations

from pathlib import Path

from llmtools.formats import jsonfile

GENERIC_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")
NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
LISTED = ("extra_special_tokens", "additional_special_tokens")
DECLINED_FILES = ("config.json", "added_tokens.json")
FLAG_DEFAULTS = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": True, "special": False}


def transformers_major() -> int | None:
    """The installed transformers' major version (from its metadata: no import), None when absent."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return int(version("transformers").split(".")[0])
    except (PackageNotFoundError, ValueError):
        return None


def folder_view(path: Path):
    """``(tokenizers.Tokenizer, len(tokenizer), eos_id, bos_id)`` as transformers 5 loads the folder, or
    None when the folder is not one this reading covers (then transformers must be asked)."""
    if transformers_major() is None or transformers_major() < 5:
        return None
    if any((path / name).exists() for name in DECLINED_FILES) or not (path / "tokenizer.json").is_file():
        return None
    config = _json(path / "tokenizer_config.json")
    if config is None or config.get("tokenizer_class") not in GENERIC_CLASSES:
        return None
    if config.get("auto_map") or config.get("split_special_tokens") or config.get("tokenizer_file"):
        return None
    named = _named_tokens(path, config)
    if named is None:
        return None

    from llmtools.tokenize.loader import _tokenizer_from_file

    try:  # added tokens and settings are read from the loaded tokenizer: parsing the JSON again doubles the load
        tok = _tokenizer_from_file(path / "tokenizer.json")
    except Exception:  # noqa: BLE001 - tokenizers raises bare Exception: the caller reports the file
        return None
    if tok.truncation is not None or tok.padding is not None:
        return None
    added = {i: {"content": t.content, **{f: getattr(t, f) for f in FLAG_DEFAULTS}}
             for i, t in tok.get_added_tokens_decoder().items()}  # fmt: skip
    if not _config_tokens_match(config.get("added_tokens_decoder"), added):
        return None
    specials = {t["content"]: i for i, t in added.items() if t["special"]}
    if not all(token in specials for token in named.values()):
        return None  # transformers would add it
    if tok.post_processor is None:
        from tokenizers import processors

        tok.post_processor = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1", special_tokens=[])
    eos, bos = named.get("eos_token"), named.get("bos_token")
    return (
        tok,
        tok.get_vocab_size(with_added_tokens=True),
        specials[eos] if eos is not None else None,
        specials[bos] if bos is not None else None,
    )


def _json(path: Path) -> dict | None:
    try:
        data = jsonfile.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _content(value):
    """A token as the config writes it (a string or an AddedToken's dict) as its text; None if neither."""
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return value if isinstance(value, str) else None


def _config_tokens_match(decoder, added: dict) -> bool:
    """The config's ``added_tokens_decoder`` adds nothing: each entry is the tokenizer.json's token at that
    id, with the same flags."""
    if decoder is None:
        return True
    if not isinstance(decoder, dict):
        return False
    for key, token in decoder.items():
        try:
            have = added.get(int(key))
        except ValueError:
            return False
        if not isinstance(token, dict) or have is None or token.get("content") != have.get("content"):
            return False
        for flag, default in FLAG_DEFAULTS.items():
            if bool(token.get(flag, default)) != bool(have.get(flag, default)):
                return False
    return True


def _named_tokens(path: Path, config: dict) -> dict[str, str] | None:
    """Every special token the config names (the legacy special_tokens_map.json counts when the config has
    no ``added_tokens_decoder``, as in transformers), as ``{key: text}``; None when one is not plain."""
    merged = dict(config)
    if "added_tokens_decoder" not in config and (path / "special_tokens_map.json").exists():
        extra = _json(path / "special_tokens_map.json")
        if extra is None:
            return None
        merged.update(extra)
    named: dict[str, str] = {}
    for key, value in merged.items():
        if value is None:
            continue
        if key in LISTED:
            items = list(value.values()) if isinstance(value, dict) else value
            if not isinstance(items, list):
                return None
            for i, item in enumerate(items):
                if _content(item) is None:
                    return None
                named[f"{key}[{i}]"] = _content(item)
        elif key in NAMED or key.endswith("_token"):
            if _content(value) is None:
                if key in NAMED:
                    return None
                continue  # not a token (transformers reads only strings and AddedTokens here)
            named[key] = _content(value)
    return named
