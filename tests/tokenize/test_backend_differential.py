"""The fast backend against ``tokenizers``, differentially: tokenizers with added tokens carrying every
flag (``single_word``, ``lstrip``, ``rstrip``, ``normalized``, ``special``), generated text around them.
Whenever the default backend picks gigatoken it must give the ids ``tokenizers`` gives; where it cannot,
the identity probe must make it decline."""

from __future__ import annotations

import pytest

from tests.conftest import shared

hypothesis = pytest.importorskip("hypothesis")
pytest.importorskip("gigatoken")
tokenizers = pytest.importorskip("tokenizers")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from llmtools.tokenize import load_tokenizer  # noqa: E402

FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")

NAMES = ("qzq", "<tag>", "Zx", "vv w")  # not in GPT-2's vocabulary as single tokens
PIECES = ("a", " ", "  ", "\n", "\t", ".", "\u00e9", "Q", "x", "1")


def _tokenizer(tmp_path, flags: list[dict], base) -> tuple:
    tok = tokenizers.Tokenizer.from_file(str(base))
    added = [tokenizers.AddedToken(name, **f) for name, f in zip(NAMES, flags, strict=False)]
    tok.add_tokens([a for a, f in zip(added, flags, strict=False) if not f.get("special")])
    tok.add_special_tokens([a for a, f in zip(added, flags, strict=False) if f.get("special")])
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return load_tokenizer(path), load_tokenizer(path, backend="tokenizers")


FLAG_SETS = st.fixed_dictionaries({name: st.booleans() for name in FLAGS})
TEXTS = st.lists(
    st.lists(st.sampled_from(NAMES + PIECES + tuple(n.upper() for n in NAMES)), max_size=10).map("".join),
    min_size=20,
    max_size=20,
)


@settings(max_examples=6, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip
@given(flags=st.lists(FLAG_SETS, min_size=1, max_size=len(NAMES)), texts=TEXTS)
def test_the_fast_backend_matches_or_declines(tmp_path_factory, flags, texts):
    base = shared("tokenizers/gpt2/tokenizer.json")
    fast, reference = _tokenizer(tmp_path_factory.mktemp("tok"), flags, base)
    if fast.backend != "gigatoken":
        assert fast.fallback_reason  # declined, and says why
        return
    for text in texts:
        assert fast.encode(text) == reference.encode(text), (flags, text)


def test_single_word_is_probed(tmp_path):
    fast, _ = _tokenizer(tmp_path, [{"single_word": True}], shared("tokenizers/gpt2/tokenizer.json"))
    assert fast.backend == "tokenizers" and "different ids" in fast.fallback_reason
