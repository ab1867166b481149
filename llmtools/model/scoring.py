"""Log-likelihood of continuations: the one scorer behind in-loop downstream evaluation and
``llm-ckpt eval`` (their numbers must agree, so they share the arithmetic, not a copy of it)."""

from __future__ import annotations

from collections.abc import Callable

from llmtools.errors import InputError


def encode_pair(tokenizer, context: str, continuation: str, max_length: int) -> tuple[list[int], int]:
    """The tokens of one (context, continuation) request as lm-evaluation-harness's ``hf`` model makes
    them, and where the continuation starts: every continuation token is scored after the tokens before it.

    * a space ending the context belongs to the continuation; whole = encode(context + continuation),
      the context's own tokens split off;
    * an empty context is the tokenizer's BOS (else its EOD) token, so the continuation's first token is
      scored too (a continuation that starts with that token uses it as its context);
    * the last ``max_length + 1`` tokens are kept (the input is one shorter).

    A request lm-eval refuses is an InputError: nothing to condition on (a context of whitespace only,
    with a tokenizer that adds no BOS; an empty context with no BOS nor EOD token), no continuation tokens,
    or a continuation longer than ``max_length``."""
    if context == "":
        prefix = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.eod_id
        if prefix is None:
            raise InputError(
                "context: empty, and the tokenizer has no BOS nor EOD token to score the choice after"
            )
        cont = list(tokenizer.encode_plain(continuation))
        ctx, cont = (cont[:1], cont[1:]) if cont and cont[0] == prefix else ([prefix], cont)
    else:
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = list(tokenizer.encode(context + continuation))
        ctx = list(tokenizer.encode(context))
        cont = whole[len(ctx) :]
        if not ctx:
            raise InputError(
                "context: only whitespace, and the tokenizer adds no BOS token: nothing to score the choice "
                "after (use an empty context)"
            )
    if not cont:
        raise InputError(f"choice {continuation!r}: no tokens after the context")
    if len(cont) > max_length:
        raise InputError(f"choice: {len(cont)} tokens, longer than the model's context ({max_length})")
    ids = (ctx + cont)[-(max_length + 1) :]
    return ids, len(ids) - len(cont)


def score_continuations(
    logits_of: Callable, sequences: list[tuple[list[int], int]], device, batch: int
) -> list[tuple[float, int, bool]]:
    """(sum of log-probabilities, token count, greedy) of each sequence's tokens from its start index on.

    ``logits_of`` maps a (rows, width) tensor of ids to (rows, width, vocab) logits; ``greedy`` is True
    when every scored token is the model's most likely one (lm-eval's ``is_greedy``). Rows are padded
    on the right, which a causal model never attends to. Every sequence has a token before its start
    (:func:`encode_pair`), so no input is empty."""
    import torch
    import torch.nn.functional as F

    out = []
    with torch.no_grad():
        for i in range(0, len(sequences), batch):
            chunk = sequences[i : i + batch]
            if any(start < 1 or start >= len(ids) for ids, start in chunk):
                raise ValueError("score_continuations: a sequence without a token before its start or after it")
            width = max(len(ids) for ids, _ in chunk) - 1
            inputs = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, (ids, _) in enumerate(chunk):
                inputs[row, : len(ids) - 1] = torch.as_tensor(ids[:-1])
            logprobs = F.log_softmax(logits_of(inputs.to(device)).float(), dim=-1)
            for row, (ids, start) in enumerate(chunk):
                targets = torch.as_tensor(ids[start:], device=device)
                part = logprobs[row, start - 1 : len(ids) - 1]
                greedy = bool((part.argmax(-1) == targets).all())
                out.append((float(part.gather(-1, targets[:, None]).sum()), len(targets), greedy))
    return out
