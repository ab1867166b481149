"""Language identification: the decisions and metadata of datatrove's LanguageFilter, given the same scores."""

from __future__ import annotations

import random

import pytest

from llmtools.errors import UsageError
from llmtools.prep.curate import registry as reg
from llmtools.prep.curate.language import LanguageFilter, scores
from llmtools.prep.curate.step import Document

SENTENCES = {
    "en": "The weather is nice today and the children play in the park near the river.",
    "de": "Das Wetter ist heute schön und die Kinder spielen im Park am Fluss.",
    "fr": "Il fait beau aujourd'hui et les enfants jouent dans le parc près de la rivière.",
    "es": "Hace buen tiempo hoy y los niños juegan en el parque cerca del río.",
}


def documents(n: int, seed: int = 7) -> list[str]:
    """Mixed-language texts, some short or mixed enough that the score is near any threshold."""
    rng = random.Random(seed)
    words = {k: v.split() for k, v in SENTENCES.items()}
    out = []
    for _ in range(n):
        langs = rng.sample(sorted(words), rng.randint(1, 3))
        text = " ".join(rng.choice(words[rng.choice(langs)]) for _ in range(rng.randint(1, 25)))
        out.append(text.replace(" ", "\n", rng.randint(0, 2)))
    return out


def datatrove_filter(languages, threshold):
    """datatrove's LanguageFilter with its model's predict answering py3langid's probabilities (fastText's
    model would be downloaded): what is compared is everything datatrove decides from the scores."""
    from datatrove.data import Document as TheirDoc
    from datatrove.pipeline.filters.language_filter import LanguageFilter as Theirs

    theirs = Theirs(languages=languages, language_threshold=threshold)

    def predict(doc):
        pairs = dict(scores(doc.text))
        best = max(pairs.items(), key=lambda x: x[1])
        return best, ({lang: pairs.get(lang, 0.0) for lang in languages} if languages else pairs)

    theirs.model.predict = predict
    return lambda text: (lambda d: (bool(theirs.filter(d)), d.metadata))(TheirDoc(text=text, id="0"))


@pytest.mark.parametrize("languages,threshold", [(["en"], 0.65), (["en", "de"], 0.9), (None, 0.65), (["fr"], 0.3)])
def test_decisions_and_metadata_equal_datatrove(languages, threshold):
    theirs = datatrove_filter(languages, threshold)
    ours = LanguageFilter(languages, threshold)
    kept = 0
    for text in documents(300):
        keep, meta = theirs(text)
        outcome = ours(Document(text))
        assert (outcome.drop is None) == keep, text
        assert outcome.meta == {"language": meta["language"], "language_score": meta["language_score"]}
        kept += keep
    assert 0 < kept < 300  # both decisions occur


def test_newlines_are_spaces_and_unknown_codes_are_refused():
    assert scores("Das Wetter\nist schön") == scores("Das Wetter ist schön")
    with pytest.raises(UsageError, match="'xx' is not a language"):
        LanguageFilter(["xx"])


def test_settings_are_parsed_with_the_parameter_types():
    chosen = reg.resolve([("language", {"languages": ["en"]})], reg.parse_settings(["language.threshold=0.8"]))
    assert chosen[0][1] == {"languages": ["en"], "threshold": 0.8}
    with pytest.raises(UsageError, match="threshold expects float"):
        reg.resolve([("language", {})], reg.parse_settings(["language.threshold=high"]))
    with pytest.raises(UsageError, match="has no parameter 'nope'"):
        reg.resolve([("language", {})], reg.parse_settings(["language.nope=1"]))
    with pytest.raises(UsageError, match="does not run"):
        reg.resolve([("language", {})], reg.parse_settings(["pii.kinds=email"]))
    with pytest.raises(UsageError, match="RULE.PARAM=VALUE"):
        reg.parse_settings(["threshold"])
