"""Text as MinHash sees it: datatrove's `simplify_text` (lower case, numbers to 0, punctuation to spaces,
whitespace collapsed, diacritics removed) and its English word tokenizer, then word n-grams hashed with
xxhash or SHA-1. Written out here, not imported, so the library runs without datatrove; the tests compare
both on real and generated text.

The word tokenizer is spaCy's, which splits a text at spaces and then each space-free piece on its own
(prefixes, suffixes, infixes, exceptions such as "cannot" -> "can", "not"). A simplified text has single
spaces only, so its words are the pieces of each space-separated token, and a token's pieces never depend
on its neighbours: they are computed once per distinct token and remembered, which spares spaCy's
per-document work (a Doc object per text) and gives the same words."""

from __future__ import annotations

import hashlib
import re
import struct
import unicodedata
from bisect import bisect_right
from dataclasses import dataclass

from llmtools.prep.curate.words import spacy_zone, split_words

# datatrove.utils.text.PUNCTUATION: every character here becomes a space (control characters included)
PUNCTUATION = (
    "!/—”:％１〈&(、━\\【#%「」，】；+^]~“《„';’{|∶´[=-`*．（–？！：$～«〉,><》)?）。…@_.\"}►»"
    + "".join(map(chr, (x for a, b in ((0, 9), (11, 13), (13, 32), (127, 160)) for x in range(a, b))))
)
_PUNCTUATION_TRANS = str.maketrans(PUNCTUATION, " " * len(PUNCTUATION))
# Python's \d is Unicode category Nd, what datatrove's \p{Nd} names
_NUMBERS = re.compile(r"\d+([.,،٫⎖⎗⎘]{1}\d+)?")
_WHITESPACE = re.compile(r"\s+")
_WEEKDAYS = re.compile(r"monday|tuesday|wednesday|thursday|friday|saturday|sunday")
_MONTHS = re.compile(r"january|february|march|april|may|june|july|august|september|october|november|december")


@dataclass(frozen=True)
class TextNorm:
    """datatrove's `TextNormConfig`, the same defaults."""

    lowercase: bool = True
    norm_whitespace: bool = True
    remove_punctuation: bool = True
    norm_unicode_diacritics: bool = True
    norm_numbers: bool = True
    norm_weekdays: bool = False
    norm_monthnames: bool = False


def simplify_text(text: str, norm: TextNorm = TextNorm()) -> str:
    """datatrove's `simplify_text`, step for step and in its order."""
    if norm.lowercase:
        text = text.lower()
    if norm.norm_numbers:
        text = _NUMBERS.sub("0", text)
    if norm.norm_weekdays:
        text = _WEEKDAYS.sub("WEEKDAY", text)
    if norm.norm_monthnames:
        text = _MONTHS.sub("MONTH", text)
    if norm.remove_punctuation:
        text = text.translate(_PUNCTUATION_TRANS)
    if norm.norm_whitespace:
        text = _WHITESPACE.sub(" ", text.strip())
    if norm.norm_unicode_diacritics and not text.isascii():  # ASCII has no combining marks to remove
        text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")
    return text.strip()


class WordSplitter:
    """Words of a simplified text, equal to `split_words` on it (see the module). The memory of tokens is
    bounded: it is emptied when it holds `limit` tokens, which costs speed only."""

    def __init__(self, limit: int = 1 << 20) -> None:
        self.limit = limit
        self.memo: dict[str, list[str]] = {}
        self.special: dict[str, list[str]] | None = None

    def __call__(self, simplified: str) -> list[str]:
        if "  " in simplified or _WHITESPACE.search(simplified.replace(" ", "")):
            return split_words(simplified)  # not single-spaced: spaCy decides on the whole text
        tokens = simplified.split(" ") if simplified else []
        memo = self.memo
        unknown = {t for t in tokens if t not in memo}
        if unknown:
            if len(memo) + len(unknown) > self.limit:
                memo.clear()
                unknown = set(tokens)
            plain = self._plain_pieces(unknown)
            memo.update(plain)
            unknown.difference_update(plain)
            if unknown:
                self._learn(sorted(unknown))
        out: list[str] = []
        for token in tokens:
            out.extend(memo[token])
        return out

    def _plain_pieces(self, tokens: set[str]) -> dict[str, list[str]]:
        """Tokens of lower-case ASCII letters only: no prefix, suffix or infix rule of spaCy's English
        tokenizer matches letters alone (each needs a digit, a symbol or punctuation), so such a token is
        split by its special cases ("cannot", "dont", "gonna") or not at all. Looked up here without
        building a Doc; the tests compare the result with spaCy's on real text."""
        if self.special is None:
            from spacy.attrs import ORTH

            with spacy_zone(0) as nlp:
                rules = nlp.tokenizer.rules or {}
            self.special = {
                key: [piece.get(ORTH, piece.get("ORTH")) for piece in pieces] for key, pieces in rules.items()
            }
        special = self.special
        return {t: special.get(t) or [t] for t in tokens if t.isascii() and t.isalpha() and t.islower()}

    def _learn(self, tokens: list[str]) -> None:
        """The pieces of each token, from one spaCy call over them all (each piece lies inside one token)."""
        starts, at = [], 0
        for token in tokens:
            starts.append(at)
            at += len(token) + 1
        pieces: list[list[str]] = [[] for _ in tokens]
        for offset, piece in split_words_at(" ".join(tokens)):
            pieces[bisect_right(starts, offset) - 1].append(piece)
        self.memo.update(zip(tokens, pieces, strict=True))


def split_words_at(text: str) -> list[tuple[int, str]]:
    """spaCy's words of `text` with their character offsets, stripped, empty ones left out (a lower-cased
    text cannot hold the attribute name spaCy refuses, so `split_words`'s retry is not needed here)."""
    with spacy_zone(len(text)) as nlp:  # the shared zone: a zone of its own would nest in the filters'
        nlp.max_length = len(text) + 10
        return [(t.idx, t.text.strip()) for t in nlp.make_doc(text) if t.text.strip()]


def _sha1_64(data: bytes) -> int:
    return struct.unpack("<Q", hashlib.sha1(data).digest()[:8])[0]


def _sha1_32(data: bytes) -> int:
    return struct.unpack("<I", hashlib.sha1(data).digest()[:4])[0]


def hash_function(name: str, precision: int):
    """datatrove's `create_hash_func`: xxhash (xxh64 / xxh32 of the UTF-8 bytes) or SHA-1's first 8 / 4
    bytes, little-endian."""
    if name == "xxhash":
        try:
            import xxhash
        except ImportError as exc:
            from llmtools.errors import InputError

            raise InputError(
                "MinHash with xxhash needs the xxhash package: pip install 'llmtools[curate]'"
            ) from exc
        return xxhash.xxh64_intdigest if precision == 64 else xxhash.xxh32_intdigest
    return _sha1_64 if precision == 64 else _sha1_32
