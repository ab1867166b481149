"""What `llm-prep dedup` is configured by: MinHash LSH with datatrove's `MinhashConfig` defaults (FineWeb's:
word 5-grams over simplified text, xxhash 64-bit, 14 bands of 8 hashes, seed 1) and exact duplicates by a
hash of the normalised text. One config drives every stage; the run folder records it, so a later stage
(another machine of a Slurm array) refuses options that differ from the ones the first stage used."""

from __future__ import annotations

import hashlib
import unicodedata
from dataclasses import asdict, dataclass, field

from llmtools.errors import UsageError
from llmtools.prep.curate.dedup.normalise import TextNorm

HASH_FUNCTIONS = ("xxhash", "sha1")
KEEP_RULE = (
    "datatrove's: the root of the union-find over the duplicate pairs (bands in order, pairs in signature order, "
    "union by size, the earlier pair's root on a tie); across sources, a member of the first-ranked source "
    "among the cluster's (the root when it is one, else that source's first by input order)"
)
EXACT_NORMALISATION = (
    "Unicode NFC, whitespace runs collapsed to one space, leading and trailing whitespace removed"
)


@dataclass(frozen=True)
class DedupConfig:
    """Every option that changes which documents are removed (so every stage must agree on it)."""

    n_grams: int = 5
    """Words per shingle."""
    bands: int = 14
    """LSH bands (datatrove's num_buckets)."""
    rows: int = 8
    """Hashes per band (datatrove's hashes_per_bucket)."""
    seed: int = 1
    """Seed of the permutations' parameters (numpy RandomState, as datatrove draws them)."""
    hash_fc: str = "xxhash"
    """Hash of a shingle's text: xxhash or sha1."""
    precision: int = 64
    """Bits of a shingle hash and of a signature entry: 64 or 32."""
    norm: TextNorm = field(default_factory=TextNorm)
    """datatrove's text normalisation before the words are split."""
    exact: bool = True
    """Also join documents whose normalised text is identical (whatever their length)."""
    near: bool = True
    """MinHash near duplicates."""
    text_key: str = "text"
    """JSON key of a document's text."""

    def __post_init__(self) -> None:
        for name, low, high in (("n-grams", 1, 1000), ("bands", 1, 4096), ("rows", 1, 1024)):
            value = getattr(self, name.replace("-", "_"))
            if not low <= value <= high:
                raise UsageError(f"--{name}: {value} is outside {low}..{high}")
        if self.hash_fc not in HASH_FUNCTIONS:
            raise UsageError(f"--hash: {self.hash_fc!r} is not one of {', '.join(HASH_FUNCTIONS)}")
        if self.precision not in (32, 64):
            raise UsageError(f"--precision: {self.precision} bits; 32 or 64")
        if not 0 <= self.seed < 2**32:
            raise UsageError(f"--seed: {self.seed} is outside 0..2**32-1 (numpy's RandomState seeds)")
        if not (self.exact or self.near):
            raise UsageError("--no-exact with --no-near leaves nothing to find")
        if not self.text_key:
            raise UsageError("--text-key: give a non-empty key")

    @property
    def num_hashes(self) -> int:
        return self.bands * self.rows

    def record(self) -> dict:
        """The config as plain JSON (the run folder's plan), with the rules it implies spelled out."""
        out = asdict(self)
        out["exact_normalisation"] = EXACT_NORMALISATION
        out["keep_rule"] = KEEP_RULE
        return out

    def explain(self, similarities=(0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)) -> dict:
        """The LSH curve: the Jaccard similarity where catching turns likely ((1/b)^(1/r)) and the
        probability that a pair of similarity s shares at least one band, 1-(1-s^r)^b."""
        return {
            "bands": self.bands,
            "rows": self.rows,
            "threshold": threshold(self.bands, self.rows),
            "catch_probability": {
                f"{s:g}": catch_probability(s, self.bands, self.rows) for s in similarities
            },
        }


def threshold(bands: int, rows: int) -> float:
    return (1.0 / bands) ** (1.0 / rows)


def catch_probability(similarity: float, bands: int, rows: int) -> float:
    return 1.0 - (1.0 - similarity**rows) ** bands


def exact_normalise(text: str) -> str:
    """The text whose hash names an exact duplicate (see EXACT_NORMALISATION)."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def exact_hash(text: str) -> bytes:
    """128 bits of BLAKE2b of the normalised text's UTF-8: two different texts in a corpus of 10**12
    documents share one with a probability below 10**-14."""
    return hashlib.blake2b(exact_normalise(text).encode("utf-8"), digest_size=16).digest()
