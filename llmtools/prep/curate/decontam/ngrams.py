"""lm-eval's normalisation and n-grams, and the hashes that stand for them in the index.

lm-eval's ``Janitor`` (python mode) treats the two sides differently, and so do we, exactly:

* an evaluation text is normalised whole (ASCII letters lowered, ``string.punctuation`` deleted; nothing
  else changes: ``É`` stays ``É``), then split on whitespace (``str.split``), and every run of n
  consecutive words joined by one space is one of its n-grams;
* a training document is split on whitespace first (``re.finditer(r"\\S+")``, the same characters as
  ``str.split``), each n consecutive words are joined by one space and normalised. A word made only of
  punctuation (``--``) normalises to nothing, so an n-gram holding it has two spaces in a row and can
  never equal an evaluation n-gram: across such a word nothing matches (lm-eval's rule, kept).

An n-gram is stored as two 64-bit numbers. ``key``: a polynomial over the words' own hashes,
finished with a mixer, computed for all n-grams of a document at once with numpy; the index is sorted
by it (a word's hash: a polynomial over its UTF-8 bytes, mixed). ``check``: blake2b of the n-gram's UTF-8 text, computed only where ``key`` matched. A training
n-gram counts as a hit only when both match; see docs/curation.md for the collision arithmetic.
"""

from __future__ import annotations

import hashlib
import re
import string

import numpy as np

NORMALIZATION = "lm-eval-janitor-python/2"
"""Names the normalisation and hashing; an index made under another one is refused."""

_TABLE = str.maketrans(
    string.ascii_lowercase + string.ascii_uppercase, string.ascii_lowercase * 2, string.punctuation
)
_WORD = re.compile(r"\S+")
_SEP = "\x00"  # joins a document's words for one translate call; never whitespace, never punctuation
_P = np.uint64(0x9E3779B97F4A7C15)  # odd: multiplication by it is a bijection modulo 2**64
_B = np.uint64(0x100000001B3)  # odd, for the words' byte polynomials
_SALT = np.uint64(0x5851F42D4C957F2D)


def normalize(text: str) -> str:
    """lm-eval's ``Janitor.normalize_string``."""
    return text.translate(_TABLE)


def eval_words(text: str) -> list[str]:
    """The words of an evaluation text, as ``Janitor.register_contaminant`` splits it."""
    return normalize(text).split()


def train_words(text: str) -> list[str]:
    """The normalised words of a training document, one per whitespace-separated word of the original
    (empty where the word was all punctuation), as ``Janitor.clean`` forms its n-grams."""
    words = text.split()
    if _SEP not in text:
        return normalize(_SEP.join(words)).split(_SEP) if words else []
    return [normalize(word) for word in words]


def word_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each whitespace-separated word, ``end`` inclusive (lm-eval's ``split_indices``)."""
    return [(m.start(), m.end() - 1) for m in _WORD.finditer(text)]


def check_hash(ngram: str) -> int:
    """The second hash of an n-gram (its normalised words joined by one space)."""
    digest = hashlib.blake2b(ngram.encode("utf-8", "surrogatepass"), digest_size=8, person=b"llmtools-ngram")
    return int.from_bytes(digest.digest(), "little")


class Hasher:
    """The ``key`` hashes of n-grams. A word's own hash is a polynomial over its UTF-8 bytes, mixed,
    computed for all the words of a document at once (no per-word Python work, no cache to grow)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._powers = np.array([pow(int(_P), n - 1 - i, 1 << 64) for i in range(n)], dtype=np.uint64)
        self._byte_powers = np.ones(1, dtype=np.uint64)

    def _powers_upto(self, size: int) -> np.ndarray:
        if len(self._byte_powers) < size:
            grown = np.full(max(size, 2 * len(self._byte_powers)), _B, dtype=np.uint64)
            grown[0] = 1
            self._byte_powers = np.cumprod(grown, dtype=np.uint64)  # B**i modulo 2**64
        return self._byte_powers[:size]

    def word_hashes(self, words: list[str]) -> np.ndarray:
        if not words:
            return np.zeros(0, dtype=np.uint64)
        joined = _SEP.join(words)
        if joined.count(_SEP) != len(words) - 1:  # a word holding the separator itself: word by word
            return np.concatenate([self._one(word) for word in words])
        data = np.frombuffer(joined.encode("utf-8", "surrogatepass") + b"\x00", dtype=np.uint8)
        sep = data == 0
        word_of = np.concatenate(([0], np.cumsum(sep[:-1])))
        starts = np.concatenate(([0], np.flatnonzero(sep[:-1]) + 1))
        position = np.arange(len(data)) - starts[word_of]
        terms = (data.astype(np.uint64) + np.uint64(1)) * self._powers_upto(int(position.max()) + 1)[position]
        terms[sep] = 0
        return _mix(np.add.reduceat(terms, starts) ^ _SALT)

    def _one(self, word: str) -> np.ndarray:
        data = np.frombuffer(word.encode("utf-8", "surrogatepass"), dtype=np.uint8).astype(np.uint64)
        total = np.array([((data + np.uint64(1)) * self._powers_upto(len(data))).sum(dtype=np.uint64)])
        return _mix(total ^ _SALT)

    def keys(self, words: list[str]) -> np.ndarray:
        """The key of each n-gram of ``words`` (``len(words) - n + 1`` of them, none if fewer words)."""
        count = len(words) - self.n + 1
        if count <= 0:
            return np.zeros(0, dtype=np.uint64)
        hashes = self.word_hashes(words)
        total = np.zeros(count, dtype=np.uint64)
        for i, power in enumerate(self._powers):
            total += hashes[i : i + count] * power
        return _mix(total)

    def valid(self, words: list[str]) -> np.ndarray:
        """Which training n-grams hold no empty word (only those can match)."""
        count = len(words) - self.n + 1
        if count <= 0:
            return np.zeros(0, dtype=bool)
        empty = np.fromiter((not w for w in words), dtype=bool, count=len(words))
        if not empty.any():
            return np.ones(count, dtype=bool)
        seen = np.concatenate(([0], np.cumsum(empty)))
        return (seen[self.n :] - seen[:count]) == 0


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise: every input bit reaches every output bit."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def ngram_text(words: list[str], start: int, n: int) -> str:
    return " ".join(words[start : start + n])
