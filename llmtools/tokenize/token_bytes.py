"""How many bytes of text each token id stands for: what bits per byte divides by.

Bits per byte compares models across tokenizers: the loss summed over a text, in bits, over the text's
UTF-8 bytes. Evaluation scores fixed-length windows that start and end anywhere inside documents, so
the bytes are counted per token: ``token_byte_lengths(tokenizer)[id]`` is the length of the bytes the
token decodes to, and the bytes of a window are the sum over its scored tokens. That is exact for
every window and needs nothing beside the data but the tokenizer (a count per document, kept beside
the ``.idx``, could not be split at a window's edges).

* byte-level BPE (GPT-2, Llama 3, Qwen, NeoX: ``ByteLevel`` decoder): each character of a vocabulary
  entry is one byte (GPT-2's byte-to-unicode map), so the length is the entry's character count;
* SentencePiece and ``Metaspace``/byte-fallback ``tokenizer.json`` files: ``▁`` is one space, a byte
  piece ``<0xNN>`` one byte, anything else its UTF-8 length. Their encoders prepend a ``▁`` to each
  text (the dummy prefix), so each document counts one byte more than its text;
* special and control tokens (EOD, BOS, ...) stand for no text: 0 bytes (their loss still counts,
  as in every published bits-per-byte figure).
"""

from __future__ import annotations

import json

import numpy as np

from llmtools.errors import LlmtoolsError
from llmtools.tokenize.base import Tokenizer
from llmtools.tokenize.loader import load_tokenizer

_BYTE_PIECE = ("<0x", ">")


def _piece_bytes(piece: str, byte_fallback: bool) -> int:
    if byte_fallback and len(piece) == 6 and piece.startswith(_BYTE_PIECE[0]) and piece.endswith(">"):
        return 1
    return len(piece.replace("\u2581", " ").encode("utf-8"))


def _decoder_types(config: dict | None) -> set[str]:
    if not isinstance(config, dict):
        return set()
    types = {str(config.get("type"))}
    for inner in config.get("decoders") or []:
        types |= _decoder_types(inner)
    return types


def token_byte_lengths(tokenizer: Tokenizer) -> np.ndarray:
    """int64 array over the vocabulary (``len == tokenizer.vocab_size``): bytes of text per token id."""
    size = int(tokenizer.vocab_size)
    lengths = np.zeros(size, dtype=np.int64)
    if tokenizer.kind == "byte":
        lengths[: min(256, size)] = 1
        return lengths
    if tokenizer.kind == "sentencepiece":
        sp = tokenizer.sp
        for i in range(size):
            if sp.is_control(i) or sp.is_unknown(i):
                continue
            lengths[i] = 1 if sp.is_byte(i) else _piece_bytes(sp.id_to_piece(i), False)
        return lengths
    tok = tokenizer.tok  # a tokenizers.Tokenizer (HF json, folder, GPT-2 vocab + merges)
    config = json.loads(tok.to_str())
    decoders = _decoder_types(config.get("decoder"))
    byte_level = "ByteLevel" in decoders
    byte_fallback = "ByteFallback" in decoders or bool((config.get("model") or {}).get("byte_fallback"))
    special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    for i in range(size):
        piece = tok.id_to_token(i)
        if piece is None or i in special:
            continue
        lengths[i] = len(piece) if byte_level else _piece_bytes(piece, byte_fallback)
    for i, added in tok.get_added_tokens_decoder().items():  # non-special added tokens are literal text
        if not added.special and i < size:
            lengths[i] = len(added.content.encode("utf-8"))
    return lengths


def byte_lengths_for(identity: dict | None) -> tuple[np.ndarray | None, str | None]:
    """The table for the tokenizer a sidecar names (its ``tokenizer`` record), or (None, why not): the
    tokenizer is reloaded from its recorded source and must still have the recorded hash."""
    if not identity or not identity.get("source"):
        return None, "the data records no tokenizer"
    source = str(identity["source"])
    try:
        tokenizer = load_tokenizer(source, backend="tokenizers")
    except LlmtoolsError as error:
        return None, f"its tokenizer could not be loaded: {error}"
    if identity.get("hash") and tokenizer.hash != identity["hash"]:
        return None, f"the tokenizer at {source} is not the one the data was made with (its hash changed)"
    return token_byte_lengths(tokenizer), None
