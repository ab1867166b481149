"""Log-likelihood of continuations: the one scorer behind in-loop downstream evaluation and
``llm-ckpt eval`` (their numbers must agree, so they share the arithmetic, not a copy of it)."""

from __future__ import annotations

from collections.abc import Callable


def score_continuations(
    logits_of: Callable, sequences: list[tuple[list[int], int]], device, batch: int
) -> list[tuple[float, int, bool]]:
    """(sum of log-probabilities, token count, greedy) of each sequence's tokens from its start index on.

    ``logits_of`` maps a (rows, width) tensor of ids to (rows, width, vocab) logits; ``greedy`` is True
    when every scored token is the model's most likely one (lm-eval's ``is_greedy``). Rows are padded
    on the right, which a causal model never attends to."""
    import torch
    import torch.nn.functional as F

    out = []
    with torch.no_grad():
        for i in range(0, len(sequences), batch):
            chunk = sequences[i : i + batch]
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
