"""MinHash signatures of documents, equal to datatrove's `MinhashDedupSignature` entry for entry.

A document's shingles are the hashes of its word n-grams (words of the simplified text, joined by one
space); each of the bands*rows permutations maps a shingle h to (a*h + b) mod (2**61 - 1), computed in
wrapping 64-bit arithmetic as datatrove computes it (numpy uint64), and the signature keeps the minimum
of each. A document with fewer words than n has no shingle and no signature (datatrove writes none)."""

from __future__ import annotations

import numpy as np

from llmtools.prep.curate.dedup.config import DedupConfig
from llmtools.prep.curate.dedup.normalise import WordSplitter, hash_function, simplify_text

MERSENNE_PRIME = np.uint64((1 << 61) - 1)
CHUNK = 4096
"""Shingles permuted at once: bounds the (chunk x bands*rows) work array of a long document to 4 MiB."""


def permutations(config: DedupConfig) -> tuple[np.ndarray, np.ndarray]:
    """The permutations' (a, b), drawn as datatrove draws them from `seed`."""
    gen = np.random.RandomState(config.seed)
    a = gen.randint(1, MERSENNE_PRIME, dtype=np.uint64, size=(1, config.num_hashes))
    b = gen.randint(0, MERSENNE_PRIME, dtype=np.uint64, size=(1, config.num_hashes))
    return a, b


class Signer:
    """`signer(text)` -> the signature (bands x rows, uint64 or uint32) or None when there is no shingle."""

    def __init__(self, config: DedupConfig) -> None:
        self.config = config
        self.a, self.b = permutations(config)
        self.hash = hash_function(config.hash_fc, config.precision)
        self.words = WordSplitter()
        self.dtype = np.uint64 if config.precision == 64 else np.uint32

    def shingles(self, text: str) -> np.ndarray:
        """Hashes of the word n-grams, in order (uint64)."""
        words = self.words(simplify_text(text, self.config.norm))
        n = self.config.n_grams
        count = len(words) - n + 1
        if count <= 0:
            return np.empty(0, dtype=np.uint64)
        joined = " ".join(words).encode("utf-8")
        if len(joined) == sum(map(len, words)) + len(words) - 1:  # ASCII: a word's bytes are its characters
            sizes = list(map(len, words))
        else:
            sizes = [len(w.encode("utf-8")) for w in words]
        starts, at = [], 0
        for size in sizes:
            starts.append(at)
            at += size + 1
        hash_ = self.hash
        return np.fromiter(
            (hash_(joined[starts[i] : starts[i + n - 1] + sizes[i + n - 1]]) for i in range(count)),
            dtype=np.uint64,
            count=count,
        )

    def signature(self, shingles: np.ndarray) -> np.ndarray | None:
        if shingles.size == 0:
            return None
        a, b = self.a, self.b
        # 32 bits: datatrove masks every permuted value before the minimum (the minimum of the low 32 bits,
        # not the low 32 bits of the minimum)
        mask = np.uint64(0xFFFFFFFF) if self.config.precision == 32 else None
        low = None
        with np.errstate(over="ignore"):
            for lo in range(0, shingles.size, CHUNK):
                phv = (shingles[lo : lo + CHUNK].reshape(-1, 1) * a + b) % MERSENNE_PRIME
                if mask is not None:
                    phv &= mask
                least = phv.min(axis=0)
                low = least if low is None else np.minimum(low, least)
        return low.astype(self.dtype).reshape(self.config.bands, self.config.rows)

    def __call__(self, text: str) -> np.ndarray | None:
        return self.signature(self.shingles(text))
