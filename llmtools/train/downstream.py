"""In-loop downstream tasks (``eval.tasks``): multiple-choice and perplexity tasks from local JSONL files,
scored on all ranks at every evaluation and reported in the eval record as ``<task>/acc``, ``<task>/acc_norm``
(multiple choice) or ``<task>/loss``, ``<task>/bpb`` (perplexity): TensorBoard and the trackers show them as
``eval/<task>/acc``.

A task file holds one JSON object per line, all of one kind:

* multiple choice: ``{"context": str, "choices": [str, ...], "gold": int}``. Each choice is scored by the
  log-likelihood of its tokens after the context, as lm-evaluation-harness scores ``multiple_choice``
  tasks (:func:`llmtools.model.scoring.encode_pair`): the pair is tokenized whole and the context's
  tokens split off (a space ending the context moves to the choice), an empty context is the BOS (else
  EOD) token, so every token of the choice is scored; ``acc`` takes the choice of highest
  log-likelihood, ``acc_norm`` the highest log-likelihood per character of the choice.
* perplexity: ``{"text": str}``: cross-entropy per token (``loss``) and bits per UTF-8 byte (``bpb``).

Files are read and tokenized before any compute (:func:`load_tasks`); a line that does not parse is an
error naming the file and line. Inputs longer than the model's context keep their last tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from llmtools.errors import InputError
from llmtools.model.scoring import encode_pair


@dataclass
class Task:
    name: str
    kind: str  # "multiple_choice" | "perplexity"
    # multiple choice: per example, the token ids of each (context, choice) pair and where the choice
    # starts; perplexity: per example, the text's ids (one pair, scored from its second token)
    pairs: list[list[tuple[list[int], int]]] = field(default_factory=list)
    gold: list[int] = field(default_factory=list)
    choice_chars: list[list[int]] = field(default_factory=list)
    text_bytes: list[int] = field(default_factory=list)


def load_tasks(paths: list[str], tokenizer, base: Path | None, max_len: int) -> list[Task]:
    """Read (:mod:`llmtools.formats.tasks`) and tokenize the task files (relative paths against ``base``,
    the config's folder)."""
    from llmtools.formats.tasks import read_task_files

    tasks = []
    for found in read_task_files(paths, base):
        task = Task(found.name, found.kind)
        for number, item in enumerate(found.examples, 1):
            where = f"{found.path}: example {number}"
            if found.kind == "perplexity":
                ids = list(tokenizer.encode(item["text"]))[-(max_len + 1) :]
                if len(ids) < 2:
                    raise InputError(f"{where}: text: fewer than 2 tokens, nothing to predict")
                task.pairs.append([(ids, 1)])
                task.text_bytes.append(len(item["text"].encode("utf-8")))
                continue
            pairs, chars = [], []
            for choice in item["choices"]:
                try:
                    pairs.append(encode_pair(tokenizer, item["context"], choice, max_len))
                except InputError as error:
                    raise InputError(f"{where}: {error}") from None
                chars.append(len(choice))
            task.pairs.append(pairs)
            task.gold.append(item["gold"])
            task.choice_chars.append(chars)
        tasks.append(task)
    return tasks


def _loglikelihoods(
    model, sequences: list[tuple[list[int], int]], device, batch: int
) -> list[tuple[float, int]]:
    """(sum of log-probabilities, token count) of each sequence's tokens from its start index on."""
    from llmtools.model.scoring import score_continuations

    return [(total, count) for total, count, _ in score_continuations(model, sequences, device, batch)]


def evaluate_tasks(model, tasks: list[Task], device, rank: int, world: int, batch: int) -> dict[str, float]:
    """Every task's metrics over all its examples (each rank scores every world-th example; every rank runs
    the same number of forwards, which ZeRO-3 needs). Collective."""
    import torch

    from llmtools.train.distributed import all_mean

    local: list[float] = []
    with torch.no_grad():
        for task in tasks:
            mine = list(range(rank, len(task.pairs), world))
            rounds = math.ceil(len(task.pairs) / world)
            sequences = [pair for index in mine for pair in task.pairs[index]]
            # a rank with fewer examples repeats its first sequence (not counted) so forwards match
            widest = max(len(p) for p in task.pairs)
            pad = (rounds - len(mine)) * widest
            scores = _loglikelihoods(model, sequences + [task.pairs[0][0]] * pad, device, batch)
            sums = [0.0, 0.0, 0.0, 0.0]  # mc: correct, correct_norm, examples; ppl: nats, tokens, bytes
            at = 0
            for index in mine:
                n = len(task.pairs[index])
                got = scores[at : at + n]
                at += n
                if task.kind == "perplexity":
                    sums[0] -= got[0][0]
                    sums[1] += got[0][1]
                    sums[2] += task.text_bytes[index]
                    continue
                lls = [ll for ll, _ in got]
                norm = [ll / chars for ll, chars in zip(lls, task.choice_chars[index], strict=True)]
                sums[0] += float(max(range(n), key=lls.__getitem__) == task.gold[index])
                sums[1] += float(max(range(n), key=norm.__getitem__) == task.gold[index])
                sums[2] += 1.0
            local += sums
    totals = [value * world for value in all_mean(local, device)] if local else []
    record: dict[str, float] = {}
    for i, task in enumerate(tasks):
        a, b, c, _ = totals[4 * i : 4 * i + 4]
        if task.kind == "perplexity":
            record[f"{task.name}/loss"] = a / b
            record[f"{task.name}/bpb"] = a / math.log(2) / c
        else:
            record[f"{task.name}/acc"] = a / c
            record[f"{task.name}/acc_norm"] = b / c
    return record
