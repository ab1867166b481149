"""Language identification with py3langid, deciding as datatrove's ``LanguageFilter`` decides.

The score of a language is a probability (py3langid's normalised scores: a softmax over its languages,
summing to 1), as fastText's is in datatrove. As there, newlines are replaced by spaces before the text is
identified; the best language and its score go into the document's metadata (``language``,
``language_score``); and the document is kept when

* ``languages`` are given: any of them scores strictly above ``threshold``;
* no ``languages``: the best language scores strictly above ``threshold``.

py3langid's model ships inside the package: nothing is downloaded. It is loaded once per process.
"""

from __future__ import annotations

from llmtools.errors import UsageError
from llmtools.prep.curate.registry import Param, Rule, register_rule
from llmtools.prep.curate.step import Document, Outcome

NAME = "language"
DEFAULT_THRESHOLD = 0.65
"""datatrove's LanguageFilter default (``language_threshold``)."""

_IDENTIFIER = None


def identifier():
    """py3langid's identifier over all its languages, with probabilities (loaded once)."""
    global _IDENTIFIER
    if _IDENTIFIER is None:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier

        _IDENTIFIER = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    return _IDENTIFIER


def scores(text: str) -> list[tuple[str, float]]:
    """Every language with its probability, best first (ties in the model's label order)."""
    return identifier().rank(text.replace("\n", " "))


class LanguageFilter:
    name = NAME

    def __init__(self, languages: list[str] | None = None, threshold: float = DEFAULT_THRESHOLD) -> None:
        if threshold is None or not 0 <= threshold <= 1:
            raise UsageError(f"--language-threshold: a probability from 0 to 1, got {threshold}")
        known = set(identifier().labels)
        unknown = [lang for lang in languages or () if lang not in known]
        if unknown:
            raise UsageError(
                f"--language: {unknown[0]!r} is not a language py3langid identifies "
                f"(ISO 639-1 codes such as en, de, fr; {len(known)} known)"
            )
        self.languages = list(dict.fromkeys(languages)) if languages else None
        self.threshold = float(threshold)

    def __call__(self, doc: Document) -> Outcome:
        ranked = scores(doc.text)
        best, best_score = ranked[0]
        meta = {"language": best, "language_score": best_score}
        if self.languages is None:
            if best_score > self.threshold:
                return Outcome(meta=meta)
            return Outcome(drop=f"{NAME}.low_score", values={"language": best, "score": best_score}, meta=meta)
        wanted = dict(ranked)
        if any(wanted.get(lang, 0.0) > self.threshold for lang in self.languages):
            return Outcome(meta=meta)
        values = {"language": best, "score": best_score}
        values.update({f"score_{lang}": wanted.get(lang, 0.0) for lang in self.languages})
        rule = f"{NAME}.not_wanted" if best not in self.languages else f"{NAME}.low_score"
        return Outcome(drop=rule, values=values, meta=meta)


register_rule(
    Rule(
        NAME,
        LanguageFilter,
        (
            Param("languages", list, None, "languages to keep (ISO 639-1: en,de); none: any language"),
            Param("threshold", float, DEFAULT_THRESHOLD, "keep when the score is strictly above this"),
        ),
        "language identification (py3langid), kept languages and a score threshold as datatrove's",
    )
)
