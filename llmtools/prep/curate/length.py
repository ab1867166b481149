"""Length bounds: a document shorter or longer than the bounds, in characters or in tokens, is removed.

Characters are Unicode code points of the text. Tokens are what ``llm-prep json2bin`` would write for the
document with the same tokenizer (its normal call, without the EOD ``--append-eod`` adds), so a bound set
here is a bound on the tokenized dataset. A bound left at None is not checked; the character bounds are
checked first (no tokenizing for a document they already remove).
"""

from __future__ import annotations

from llmtools.errors import UsageError
from llmtools.prep.curate.registry import Param, Rule, register_rule
from llmtools.prep.curate.step import KEEP, Document, Outcome

NAME = "length"


class LengthBounds:
    name = NAME

    def __init__(
        self,
        min_chars: int | None = None,
        max_chars: int | None = None,
        min_tokens: int | None = None,
        max_tokens: int | None = None,
        tokenizer: str | None = None,
    ) -> None:
        for flag, value in (("min_chars", min_chars), ("max_chars", max_chars),
                            ("min_tokens", min_tokens), ("max_tokens", max_tokens)):  # fmt: skip
            if value is not None and value < 0:
                raise UsageError(f"{NAME}.{flag}: must be at least 0, got {value}")
        if min_chars is not None and max_chars is not None and min_chars > max_chars:
            raise UsageError(f"{NAME}: min_chars {min_chars} is above max_chars {max_chars}")
        if min_tokens is not None and max_tokens is not None and min_tokens > max_tokens:
            raise UsageError(f"{NAME}: min_tokens {min_tokens} is above max_tokens {max_tokens}")
        if (min_tokens is not None or max_tokens is not None) and not tokenizer:
            raise UsageError("a bound in tokens needs the tokenizer that counts them: -t/--tokenizer")
        self.min_chars, self.max_chars = min_chars, max_chars
        self.min_tokens, self.max_tokens = min_tokens, max_tokens
        self.tokenizer = None
        if tokenizer and (min_tokens is not None or max_tokens is not None):
            from llmtools.tokenize import load_tokenizer

            self.tokenizer = load_tokenizer(tokenizer)

    def __call__(self, doc: Document) -> Outcome:
        chars = len(doc.text)
        if self.min_chars is not None and chars < self.min_chars:
            return Outcome(drop=f"{NAME}.min_chars", values={"characters": chars})
        if self.max_chars is not None and chars > self.max_chars:
            return Outcome(drop=f"{NAME}.max_chars", values={"characters": chars})
        if self.tokenizer is None:
            return KEEP
        tokens = len(self.tokenizer.encode(doc.text))
        if self.min_tokens is not None and tokens < self.min_tokens:
            return Outcome(drop=f"{NAME}.min_tokens", values={"tokens": tokens})
        if self.max_tokens is not None and tokens > self.max_tokens:
            return Outcome(drop=f"{NAME}.max_tokens", values={"tokens": tokens})
        return KEEP


register_rule(
    Rule(
        NAME,
        LengthBounds,
        (
            Param("min_chars", int, None, "remove documents of fewer characters"),
            Param("max_chars", int, None, "remove documents of more characters"),
            Param("min_tokens", int, None, "remove documents of fewer tokens (needs tokenizer)"),
            Param("max_tokens", int, None, "remove documents of more tokens (needs tokenizer)"),
            Param("tokenizer", str, None, "the tokenizer that counts tokens, as json2bin -t takes it"),
        ),
        "length bounds in characters and in tokens",
    )
)
