"""The decontamination step: a document holding an evaluation n-gram is dropped (``drop``) or has the
contaminated spans cut out as lm-eval's ``Janitor.clean`` cuts them (``cut``); counted per task.

Drop reasons: ``decontaminate.overlap`` (drop mode), ``decontaminate.too_dirty`` (cut mode: more
contaminated n-grams than the cutoff) and ``decontaminate.nothing_left`` (cut mode: no piece long enough
survived). A removed document's values name its tasks, the number of contaminated n-grams, and the first
one: as it stands in the document and normalised. In cut mode the kept pieces are joined with nothing
between them, as lm-eval's own tests join ``Janitor.clean``'s list; the text changes are counted as one
per contaminated n-gram. A document with no hit passes untouched (``Janitor.clean`` returns nothing for
a clean document of at most ``min_chunk`` characters; that is not a decontamination and is not copied).
"""

from __future__ import annotations

from typing import Any

from ..step import KEEP, Document, Outcome
from .index import NgramIndex
from .match import CutRules, Matcher, cut

MODES = ("drop", "cut")


class Decontaminate:
    name = "decontaminate"

    def __init__(self, index: NgramIndex, mode: str = "drop", rules: CutRules | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
        self.index, self.mode, self.rules = index, mode, rules or CutRules()
        self.matcher = Matcher(index)
        self.documents = self.characters = 0
        self.per_task = {name: _counts() for name in index.tasks}
        self.totals = _counts()

    def __call__(self, doc: Document) -> Outcome:
        text = doc.text
        self.documents += 1
        self.characters += len(text)
        hits = self.matcher.hits(text)
        if not hits:
            return KEEP
        spans = self.matcher.spans(text, hits)
        tasks = sorted({t for hit in hits for t in hit.tasks})
        first, last = spans[0]
        values: dict[str, Any] = {
            "tasks": [self.index.tasks[t] for t in tasks],
            "hits": len(hits),
            "ngram": text[first : last + 1],
            "normalized": hits[0].ngram,
        }
        if self.mode == "drop":
            outcome = Outcome(drop=f"{self.name}.overlap", values=values)
            removed = len(text)
        else:
            pieces = cut(text, spans, self.rules)
            if pieces is None:
                outcome, removed = Outcome(drop=f"{self.name}.too_dirty", values=values), len(text)
            elif not pieces:
                outcome, removed = Outcome(drop=f"{self.name}.nothing_left", values=values), len(text)
            else:
                kept = "".join(pieces)
                outcome, removed = Outcome(text=kept, changes=len(hits), values=values), len(text) - len(kept)
        dropped = outcome.drop is not None
        for counts in [self.per_task[self.index.tasks[t]] for t in tasks] + [self.totals]:
            counts["documents"] += 1
            counts["characters"] += len(text)
            counts["dropped"] += dropped
            counts["cut"] += not dropped
            counts["characters_removed"] += removed
        for hit in hits:
            for t in hit.tasks:
                self.per_task[self.index.tasks[t]]["ngrams"] += 1
        self.totals["ngrams"] += len(hits)
        return outcome

    def report(self) -> dict[str, Any]:
        """Per task: documents hit, their characters, how many were dropped or cut, characters removed, and
        contaminated n-gram occurrences (a document counts under every task it hit; totals count it once)."""
        return {
            "mode": self.mode,
            "n": self.index.n,
            **(
                {
                    "window": self.rules.window,
                    "min_chunk": self.rules.min_chunk,
                    "too_dirty": self.rules.too_dirty,
                }
                if self.mode == "cut"
                else {}
            ),  # fmt: skip
            "documents": self.documents,
            "characters": self.characters,
            "hit": dict(self.totals),
            "tasks": {name: dict(counts) for name, counts in self.per_task.items()},
        }


def _counts() -> dict[str, int]:
    return {"documents": 0, "characters": 0, "dropped": 0, "cut": 0, "characters_removed": 0, "ngrams": 0}
