"""The built-in byte-level tokenizer: needs no file, ids 0..255 are the UTF-8 bytes, 256 is EOD.

Good for tests, smoke runs and the embedded sample corpus; vocabulary 257 so tokens are uint16.
"""

from __future__ import annotations

import hashlib

import numpy as np

from llmtools.tokenize.base import SplitSpecials, Tokenizer

EOD_TOKEN = "<|endoftext|>"
BYTE_SPEC = "byte"


class ByteTokenizer(Tokenizer):
    kind = "byte"

    def __init__(self, policy: str = "auto") -> None:
        self.source = BYTE_SPEC
        self.name = "llmtools-byte"
        self.hash = (
            "sha256:"
            + hashlib.sha256(b"llmtools byte tokenizer v1: ids 0-255 bytes, 256 <|endoftext|>").hexdigest()
        )
        self.vocab_size = 257
        self.eod_id = 256
        self.bos_id = None
        self.policy = policy
        self.backend = "builtin"
        self.special_tokens = {EOD_TOKEN: 256}
        self._split = SplitSpecials(self.special_tokens, self._encode_plain) if policy == "split" else None

    @staticmethod
    def _encode_plain(texts: list[str]) -> list[list[int]]:
        return [list(t.encode("utf-8")) for t in texts]

    def encode_flat(self, texts: list[str], dtype=np.int64) -> tuple[np.ndarray, np.ndarray]:
        if self._split is not None:
            return super().encode_flat(texts, dtype)
        data = [t.encode("utf-8") for t in texts]
        lengths = np.fromiter((len(d) for d in data), dtype=np.int64, count=len(data))
        flat = np.frombuffer(b"".join(data), dtype=np.uint8)
        return (flat if dtype is None else flat.astype(dtype)), lengths

    def _encode_list(self, texts: list[str]) -> list[list[int]]:
        return self._split(texts) if self._split is not None else self._encode_plain(texts)

    def decode(self, ids) -> str:
        out, run = [], bytearray()
        for i in ids:
            i = int(i)
            if i < 256:
                run.append(i)
            else:
                out.append(run.decode("utf-8", errors="replace"))
                run = bytearray()
                out.append(EOD_TOKEN if i == 256 else f"<|unk_{i}|>")
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)
