"""The one tokenizer interface every llmtools command uses, whatever the file it came from.

A :class:`Tokenizer` knows its Megatron-style ``vocab_size`` (``len(tokenizer)``, added tokens
included: it decides uint16 vs int32), its EOD and BOS ids, how to describe itself for the sidecar
(:meth:`identity`), and how to encode a batch of texts into one flat token array plus per-text
lengths (:meth:`encode_flat`), which is what the json2bin hot path needs: no per-document Python
objects when the backend can avoid them.

Special-token policy (``--special-tokens``): what happens to text that *contains* the string of a
special token, e.g. a literal ``<|endoftext|>`` inside a web page.

``auto``  (default) the tokenizer's normal call, i.e. exactly what Megatron-LM's
          ``tools/preprocess_data.py`` does with the same tokenizer: a Hugging Face tokenizer
          (``tokenizer.json`` / folder) and a GPT-2 ``vocab.json``+``merges.txt`` (Megatron's
          ``GPT2BPETokenizer``, which is transformers' GPT-2 tokenizer) turn special-token strings into
          their ids, and an HF post-processor adds its BOS/EOS; a SentencePiece ``.model``
          (``GPTSentencePieceTokenizer``) and the built-in byte tokenizer encode them as ordinary text.
          (Megatron-LM before its tokenizers moved onto transformers, and Megatron-DeepSpeed, encoded
          ``<|endoftext|>`` in a GPT-2 vocab as ordinary text: use ``plain`` to reproduce those.)
``split`` special-token strings always become their single ids (tiktoken's ``allowed_special="all"``).
``plain`` special-token strings are always encoded as ordinary text (safest for web text);
          a Hugging Face post-processor still adds its BOS/EOS.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from llmtools.errors import UsageError

SPECIAL_POLICIES = ("auto", "split", "plain")


def check_policy(policy: str) -> str:
    if policy not in SPECIAL_POLICIES:
        raise UsageError(
            f"--special-tokens: unknown policy {policy!r} (choose one of {', '.join(SPECIAL_POLICIES)})"
        )
    return policy


def flatten(ids: Sequence[Sequence[int]], dtype=np.int64) -> tuple[np.ndarray, np.ndarray]:
    """A list of id lists as (flat array, int64 lengths), without a Python loop per token."""
    from itertools import chain

    dtype = np.int64 if dtype is None else dtype
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(chain.from_iterable(ids), dtype=dtype, count=int(lengths.sum()))
    return flat, lengths


def as_str_list(texts) -> list[str]:
    """``texts`` as a list of str (FlatTexts, the JSONL fast path's form, are decoded)."""
    tolist = getattr(texts, "tolist", None)
    return tolist() if tolist is not None else texts


class Tokenizer:
    """Base class. Subclasses set the attributes below and implement ``_encode_list``/``decode``."""

    kind: str = ""
    source: str = ""
    name: str = ""
    hash: str = ""
    vocab_size: int = 0
    eod_id: int | None = None
    bos_id: int | None = None
    policy: str = "auto"
    backend: str = ""
    special_tokens: dict[str, int]
    checked: dict | None = None
    """What :func:`llmtools.tokenize.checks.check_vocabulary` found on load (None: not a file we check)."""
    parallel_in_process: bool = False
    """True when ``encode_flat`` uses all cores by itself (threads, GIL released); see json2bin."""

    # -- what the sidecar records --------------------------------------------------------------
    def identity(self) -> dict:
        return {
            "kind": self.kind,
            "source": self.source,
            "name": self.name,
            "hash": self.hash,
            "vocab_size": int(self.vocab_size),
            "eod_id": self.eod_id,
            "bos_id": self.bos_id,
        } | ({"checked": self.checked} if self.checked is not None else {})

    rebuild: tuple | None = None
    """``(function, args)`` that makes this tokenizer again from its spec, set by the loader: worker
    processes started with "spawn" rebuild it so instead of pickling Rust objects."""

    def __reduce_ex__(self, protocol):
        if self.rebuild is None:  # made directly, not by the loader: ordinary pickling
            return super().__reduce_ex__(protocol)
        return self.rebuild

    # -- encoding ------------------------------------------------------------------------------
    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        flat, lengths = self.encode_flat(texts)
        ends = np.cumsum(lengths)
        return [part.tolist() for part in np.split(flat, ends[:-1])] if len(texts) else []

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_plain(self, text: str) -> list[int]:
        """``text``'s ids without what the tokenizer adds around every text (an HF post-processor's
        BOS/EOS): transformers' ``encode(text, add_special_tokens=False)``."""
        return self.encode(text)

    def encode_flat(self, texts: list[str], dtype=np.int64) -> tuple[np.ndarray, np.ndarray]:
        """Encode ``texts``: (all ids back to back, int64 length of each text).

        ``dtype=None`` returns the backend's native integer dtype (no copy); callers cast once.
        ``texts`` may also be :class:`~llmtools.prep.sources.FlatTexts` (one UTF-8 buffer).
        """
        return flatten(self._encode_list(as_str_list(texts)), dtype)

    def _encode_list(self, texts: list[str]) -> list[list[int]]:
        raise NotImplementedError

    def decode(self, ids) -> str:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r}, name={self.name!r}, vocab_size={self.vocab_size}, backend={self.backend!r})"


class SplitSpecials:
    """Encode with special-token strings cut out first (for backends that cannot do it themselves)."""

    def __init__(self, special_tokens: dict[str, int], encode_plain) -> None:
        self.special_tokens = special_tokens
        self.encode_plain = encode_plain
        names = sorted(special_tokens, key=len, reverse=True)  # longest match first
        self.pattern = re.compile("(" + "|".join(re.escape(n) for n in names) + ")") if names else None

    def __call__(self, texts: list[str]) -> list[list[int]]:
        if self.pattern is None:
            return self.encode_plain(texts)
        out = []
        for text in texts:
            parts = self.pattern.split(text)
            if len(parts) == 1:
                out.extend(self.encode_plain([text]))
                continue
            ids: list[int] = []
            plain = [p for i, p in enumerate(parts) if i % 2 == 0 and p]
            encoded = iter(self.encode_plain(plain))
            for i, part in enumerate(parts):
                if i % 2:
                    ids.append(self.special_tokens[part])
                elif part:
                    ids.extend(next(encoded))
            out.append(ids)
        return out
