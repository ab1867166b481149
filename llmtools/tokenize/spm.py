"""SentencePiece ``.model`` files, encoded as Megatron-LM's ``GPTSentencePieceTokenizer`` does.

The normal call is ``sp.encode(text)``: no BOS/EOS added, special-token strings such as ``</s>``
are ordinary text; EOD is the model's ``eos_id`` and the vocabulary size its piece count.
"""

from __future__ import annotations

from llmtools.tokenize.base import SplitSpecials, Tokenizer


class SentencePieceTokenizer(Tokenizer):
    kind = "sentencepiece"

    def __init__(
        self, path: str, *, source: str, hash: str, policy: str = "auto", add_bos: bool = False
    ) -> None:
        """``add_bos``: prepend BOS to every text, as Megatron's legacy ``Llama2Tokenizer`` does."""
        import sentencepiece

        # The model's bytes, not its path: the library takes a path only as UTF-8 text, and a path is
        # any bytes the filesystem allows.
        with open(path, "rb") as handle:
            self.sp = sentencepiece.SentencePieceProcessor(model_proto=handle.read())
        self.source, self.hash, self.policy = source, hash, policy
        self.name = str(path).rsplit("/", 1)[-1]
        self.vocab_size = int(self.sp.get_piece_size())
        eos, bos = int(self.sp.eos_id()), int(self.sp.bos_id())
        self.eod_id = eos if eos >= 0 else None
        self.bos_id = bos if bos >= 0 else None
        self.special_tokens = {
            self.sp.id_to_piece(i): i for i in range(self.vocab_size) if self.sp.is_control(i)
        }
        self.backend = "sentencepiece"
        self.add_bos = add_bos
        plain = self._encode_plain
        self._encode = SplitSpecials(self.special_tokens, plain) if policy == "split" else plain

    def _encode_plain(self, texts: list[str]) -> list[list[int]]:
        return self.sp.encode(texts, out_type=int, add_bos=self.add_bos) if texts else []

    def _encode_list(self, texts: list[str]) -> list[list[int]]:
        return self._encode(texts)

    def encode_plain(self, text: str) -> list[int]:
        ids = self.encode(text)
        return ids[1:] if self.add_bos and ids[:1] == [self.bos_id] else ids

    def decode(self, ids) -> str:
        return self.sp.decode([int(i) for i in ids])
