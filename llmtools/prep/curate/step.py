"""The contract between a curation step and the command that runs it.

A step looks at one document and keeps it, drops it (naming the rule and the measured value that decided),
or changes its text (counted). Steps never read files or options themselves: a command builds them from its
options, then runs them in a stated order over each document, stopping at the first drop."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class Document:
    """One JSONL record under curation. `cache` holds what one step computed and a later step reuses (the
    word tokenization, say), so a document is analysed once whatever number of rules look at it."""

    text: str
    meta: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    """What a step decided about one document.

    drop: the rule that removed the document (e.g. "gopher_quality.max_avg_word_length"), None to keep it.
    values: what the step measured (the value that decided a drop among them), recorded beside a removal.
    text: the new text when the step changes it (PII replaced, say), else None.
    changes: how many changes made the new text (counted in the stats).
    meta: fields added to the document's metadata (the language and its score, say).
    """

    drop: str | None = None
    values: dict[str, Any] = field(default_factory=dict)
    text: str | None = None
    changes: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


KEEP = Outcome()


class Step(Protocol):
    """A named, configured rule. `name` prefixes its drop reasons and names it in the stats."""

    name: str

    def __call__(self, doc: Document) -> Outcome: ...
