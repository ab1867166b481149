"""A tokenizer file is untrusted input: what is checked when one is loaded, and what the sidecar records.

* every id is a non-negative integer, and no two tokens share one (a shared id makes the round trip
  lossy, and which token it decodes to depends on hash order: it changes from run to run);
* every id is below the size the tokenizer declares (that size picks the dataset's dtype and is checked
  against the model's ``vocab_size``; an id beyond it would index past the embedding);
* the EOD and BOS ids, when the tokenizer names them, are ids it has.

The result (counts, the largest id, ids left unused) goes into the sidecar's ``tokenizer.checked``, so
a dataset says what its tokenizer was found to be.
"""

from __future__ import annotations

from collections.abc import Mapping

from llmtools.errors import InputError


def check_vocabulary(
    vocab: Mapping[str, int], declared: int, eod_id: int | None, bos_id: int | None, source: str
) -> dict:
    """``vocab`` (token -> id, added tokens included) against ``declared`` ids; the findings, or an
    :class:`InputError` naming ``source`` and the first problem."""
    owner: dict[int, str] = {}
    for token, token_id in vocab.items():
        if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
            raise InputError(f"{source}: token {token[:40]!r} has id {token_id!r}; ids are integers >= 0")
        if token_id in owner:
            first, second = sorted((owner[token_id], token))  # the same words whatever the hash order
            raise InputError(
                f"{source}: tokens {first[:40]!r} and {second[:40]!r} share id {token_id}; "
                "every id must belong to one token (decoding it would be ambiguous)"
            )
        owner[token_id] = token
    if not owner:
        raise InputError(f"{source}: the tokenizer has no tokens")
    largest = max(owner)
    if largest >= declared:
        raise InputError(
            f"{source}: token {owner[largest][:40]!r} has id {largest}, but the tokenizer declares {declared} "
            "ids (0..{}); its ids and its size disagree".format(declared - 1)
        )
    for name, value in (("EOD", eod_id), ("BOS", bos_id)):
        if value is not None and value not in owner and not 0 <= value < declared:
            raise InputError(f"{source}: its {name} id {value} is not an id of the tokenizer")
    return {
        "tokens": len(owner),
        "max_id": largest,
        "unused_ids": declared - len(owner),
        "unique_ids": True,
        "eod": eod_id is not None,
    }
