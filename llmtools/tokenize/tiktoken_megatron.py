"""Megatron-LM's ``TikTokenizer``: a tiktoken BPE read from Megatron's JSON vocabulary, ids shifted past a
block of special tokens.

The vocabulary file is a JSON list of ``{"rank": i, "token_bytes": base64, "token_str": ...}`` (rank i
at position i; the first 256 are the single bytes). Megatron builds a ``tiktoken.Encoding`` whose
ids 0..S-1 are the special tokens (the given list, then ``<SPECIAL_i>`` fillers up to S, default
1000) and whose BPE ranks start at S; the vocabulary size is ``--vocab-size`` (default 2**17) and must
equal the file's ranks (cut to size - S) plus S. EOD is ``</s>``.

The two Megatron tokenizer systems differ in what the text becomes:

* megatron-core's (default of ``tools/preprocess_data.py`` in core_v0.15 - core_v0.16): special-token
  strings in the text become their ids (``encode(text, allowed_special="all")``); the default special
  tokens are ``<unk> <s> </s> <mask> <pad> <cls> <sep>``; the split pattern defaults to ``v2``;
* the legacy one (``--legacy-tokenizer``; the only one up to core_v0.14): the text is all ordinary text
  (``encode_ordinary``); the default special tokens are ``<unk> <s> </s>``; a pattern must be named.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from pathlib import Path

from llmtools.errors import InputError, UsageError
from llmtools.formats import jsonfile
from llmtools.tokenize.base import Tokenizer

# The split regexes Megatron-LM names v1 and v2 (interoperability data: the ids depend on them).
PATTERNS = {
    "v1": r"[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
    "v2": "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
}
DEFAULT_VOCAB_SIZE = 2**17
DEFAULT_NUM_SPECIAL = 1000
SPECIALS_CORE = ("<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>")
SPECIALS_LEGACY = ("<unk>", "<s>", "</s>")


class MegatronTikTokenizer(Tokenizer):
    kind = "tiktoken"

    def __init__(
        self,
        path: str | Path,
        *,
        hash: str,
        legacy: bool = False,
        pattern: str | None = None,
        vocab_size: int | None = None,
        num_special_tokens: int = DEFAULT_NUM_SPECIAL,
        special_tokens: Sequence[str] | None = None,
    ) -> None:
        import tiktoken

        path = Path(path)
        if path.suffix != ".json":
            raise UsageError(
                f"--tokenizer-model {path}: TikTokenizer reads Megatron's JSON vocabulary (*.json)"
            )
        if pattern is None:
            if legacy:
                raise UsageError(
                    "--tiktoken-pattern v1|v2 is required with --legacy-tokenizer (as Megatron's is)"
                )
            pattern = "v2"
        if pattern not in PATTERNS:
            raise UsageError(f"--tiktoken-pattern: expected v1 or v2, got {pattern!r}")
        vocab_size = DEFAULT_VOCAB_SIZE if vocab_size is None else int(vocab_size)
        required = SPECIALS_LEGACY if legacy else SPECIALS_CORE
        specials = list(special_tokens) if special_tokens else list(required)
        if len(set(specials)) != len(specials):
            raise UsageError(f"--tokenizer-special-tokens: not unique: {specials}")
        missing = [t for t in required if t not in specials]
        if missing:
            raise UsageError(
                f"--tokenizer-special-tokens: must include {' '.join(required)} (missing {missing})"
            )
        if not len(specials) <= num_special_tokens < vocab_size:
            raise UsageError(
                f"--tiktoken-num-special-tokens {num_special_tokens}: needs {len(specials)} <= it < "
                f"--vocab-size {vocab_size}"
            )
        specials += [f"<SPECIAL_{i}>" for i in range(len(specials), num_special_tokens)]
        ranks = _read_ranks(path, vocab_size - num_special_tokens, num_special_tokens)
        if len(ranks) != vocab_size - num_special_tokens:
            raise InputError(
                f"{path}: {len(ranks)} ranks, but --vocab-size {vocab_size} with {num_special_tokens} special "
                f"tokens needs {vocab_size - num_special_tokens} (Megatron requires them to match; pass "
                f"--vocab-size {len(ranks) + num_special_tokens})"
            )
        self.special_tokens = {t: i for i, t in enumerate(specials)}
        self.encoding = tiktoken.Encoding(
            name=path.parent.name,
            pat_str=PATTERNS[pattern],
            mergeable_ranks=ranks,
            special_tokens=self.special_tokens,
        )
        self.legacy, self.pattern = legacy, pattern
        self.source, self.name, self.hash = str(path), path.parent.name or path.stem, hash
        self.vocab_size = vocab_size
        self.eod_id = self.special_tokens["</s>"]
        self.bos_id = self.special_tokens["<s>"]
        self.policy = "plain" if legacy else "split"
        self.backend = "tiktoken"

    def _encode_list(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        if self.legacy:
            return self.encoding.encode_ordinary_batch(texts, num_threads=1)
        return self.encoding.encode_batch(texts, num_threads=1, allowed_special="all")

    def decode(self, ids) -> str:
        return self.encoding.decode([int(i) for i in ids])


def _read_ranks(path: Path, limit: int, shift: int) -> dict[bytes, int]:
    try:
        vocab = jsonfile.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such tokenizer file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: not a valid JSON vocabulary ({error})") from None
    if not isinstance(vocab, list):
        raise InputError(f"{path}: Megatron's TikTokenizer vocabulary is a JSON list of ranks")
    ranks: dict[bytes, int] = {}
    for i, entry in enumerate(vocab[:limit]):
        if (
            not isinstance(entry, dict)
            or set(entry) != {"rank", "token_bytes", "token_str"}
            or entry["rank"] != i
        ):
            raise InputError(
                f"{path}[{i}]: expected {{rank: {i}, token_bytes, token_str}}, got {str(entry)[:80]}"
            )
        try:
            token = base64.b64decode(entry["token_bytes"], validate=True)
        except (ValueError, TypeError):
            raise InputError(f"{path}[{i}]: token_bytes is not base64") from None
        if i < 256 and token != bytes([i]):
            raise InputError(f"{path}[{i}]: the first 256 ranks must be the single bytes 0..255")
        if token in ranks:
            raise InputError(f"{path}[{i}]: token {token!r} appears twice")
        ranks[token] = i + shift
    return ranks
