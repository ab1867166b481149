"""Comments say why, not which issue a line came from: no comment or docstring in llmtools/ names an
issue number (the history of a line is git's business)."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "llmtools"
ISSUE = re.compile(r"\bissues?\s*#?\d+|\(#\d+\)", re.IGNORECASE)


def _comments_and_docstrings(path: Path):
    source = path.read_text(encoding="utf-8")
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT or (
            token.type == tokenize.STRING and token.string.startswith(('"""', "'''"))
        ):
            yield token.start[0], token.string


def test_no_comment_names_an_issue():
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {text.strip()[:100]}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, text in _comments_and_docstrings(path)
        if ISSUE.search(text)
    ]
    assert not found, "comments that name an issue (say why instead):\n" + "\n".join(found)


def test_the_pattern_sees_the_spellings_we_used():
    for text in ("# --- sft (issue 8) ---", "# llm-ckpt (issue 6): continue", "# see issues 12", "(#14)"):
        assert ISSUE.search(text), text
    assert not ISSUE.search("# the issue is that DeepSpeed logs to stdout")
