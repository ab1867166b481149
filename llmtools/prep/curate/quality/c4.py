"""C4's rules (Raffel et al. 2020, section 2.2) as datatrove's `C4QualityFilter` and `C4ParagraphFilter`
apply them. C4's quality rules drop lines (citations removed, lines without terminal punctuation, with
few words, naming javascript or a policy) and documents (lorem ipsum, a curly bracket, too few
sentences); the kept lines become the document's new text, the dropped lines counted as its changes."""

from __future__ import annotations

import heapq
import re
from dataclasses import dataclass
from typing import ClassVar

from llmtools.prep.curate.quality.params import param
from llmtools.prep.curate.step import Document, Outcome
from llmtools.prep.curate.words import count_sentences, sentence_pieces, set_words, split_words, words_between

CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
END_PUNCTUATION = (".", "?", "!", '"', "'")
ELLIPSIS = "..."
POLICY_SUBSTRINGS = (
    "terms of use",
    "privacy policy",
    "cookie policy",
    "uses cookies",
    "use of cookies",
    "use cookies",
)
# where str.splitlines cuts a text, so each line's place in the text is known
_LINE_BREAK = re.compile("\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def line_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each line of `text.splitlines()`."""
    spans = []
    start = 0
    for brk in _LINE_BREAK.finditer(text):
        spans.append((start, brk.start()))
        start = brk.end()
    if start < len(text):
        spans.append((start, len(text)))
    return spans


@dataclass
class C4Quality:
    """Keeps the lines C4 keeps; drops a document of lorem ipsum, a curly bracket or too few sentences."""

    name: ClassVar[str] = "c4_quality"
    measures: ClassVar[dict[str, str]] = {
        "lorem_ipsum": "line",
        "curly_bracket": "line",
        "too_few_sentences": "sentences",
    }

    split_paragraph: bool = param(
        True, "lines are the text's lines (false: its sentences, joined by spaces)", "bool"
    )
    remove_citations: bool = param(
        True, "remove Wikipedia-style citations ([1], [edit], [citation needed])", "bool"
    )
    filter_no_terminal_punct: bool = param(
        True, "drop lines not ending in . ? ! \" ' (or ending in '...')", "bool"
    )
    min_num_sentences: int = param(5, "fewest sentences in the kept lines (-1: no limit)", "int")
    min_words_per_line: int = param(3, "drop lines of fewer words, split at spaces (-1: no limit)", "int")
    max_word_length: int = param(1000, "drop lines holding a longer word (-1: no limit)", "int")
    filter_lorem_ipsum: bool = param(True, "drop documents with a kept line holding 'lorem ipsum'", "bool")
    filter_javascript: bool = param(True, "drop lines naming javascript", "bool")
    filter_curly_bracket: bool = param(True, "drop documents with a kept line holding '{'", "bool")
    filter_policy: bool = param(True, "drop lines naming terms of use, privacy or cookie policies", "bool")

    def _line_kept(self, line: str) -> tuple[str | None, str | None]:
        """(the line as kept or None to drop it, the reason to drop the whole document or None)."""
        found = line.split()
        if self.max_word_length != -1 and any(len(word) > self.max_word_length for word in found):
            return None, None
        if self.remove_citations:
            line = CITATION.sub("", line)
        if self.filter_no_terminal_punct and (not line.endswith(END_PUNCTUATION) or line.endswith(ELLIPSIS)):
            return None, None
        if len(found) < self.min_words_per_line:
            return None, None
        lowered = line.lower()
        if self.filter_lorem_ipsum and "lorem ipsum" in lowered:
            return None, "lorem_ipsum"
        if self.filter_javascript and "javascript" in lowered:
            return None, None
        if self.filter_curly_bracket and "{" in line:
            return None, "curly_bracket"
        if self.filter_policy and any(phrase in lowered for phrase in POLICY_SUBSTRINGS):
            return None, None
        return line, None

    def __call__(self, doc: Document) -> Outcome:
        text = doc.text
        if self.split_paragraph:
            spans = line_spans(text)
            pieces = [text[a:b] for a, b in spans]
        else:
            spans = None
            pieces = sentence_pieces(text)
        kept: list[str] = []
        kept_at: list[int] = []
        for index, piece in enumerate(pieces):
            line, reason = self._line_kept(piece.strip())
            if reason is not None:
                return Outcome(drop=f"{self.name}.{reason}", values={"line": index + 1})
            if line is not None:
                kept.append(line)
                kept_at.append(index)

        values: dict = {"lines": len(pieces), "kept_lines": len(kept)}
        # every kept line holds at least one sentence: only a document of fewer kept lines than the limit
        # needs its sentences counted (a count is reported only when it is exact)
        if self.min_num_sentences != -1 and len(kept) < self.min_num_sentences:
            sentences = sum(map(count_sentences, kept)) if self.split_paragraph else len(kept)
            values["sentences"] = sentences
            if sentences < self.min_num_sentences:
                return Outcome(drop=f"{self.name}.too_few_sentences", values=values)

        new_text = ("\n" if self.split_paragraph else " ").join(kept).strip()
        if new_text == text:
            return Outcome(values=values)
        # a dropped line, or a kept one that lost a citation or its surrounding whitespace, is one change
        changes = (
            len(pieces)
            - len(kept)
            + sum(1 for index, line in zip(kept_at, kept, strict=True) if line != pieces[index])
        )
        if spans is not None:
            self._hand_on_words(doc, new_text, spans, kept, kept_at)
        return Outcome(values=values, text=new_text, changes=changes)

    def _hand_on_words(self, doc, new_text, spans, kept, kept_at) -> None:
        """Give the next rule the words of the new text: each kept line's words, found among the words of
        the old text (split again only where a citation was cut out of the line)."""
        found: list[str] = []
        for index, line in zip(kept_at, kept, strict=True):
            start, end = spans[index]
            inside = words_between(doc, start, end)
            if inside is None:
                return
            if len(line) != len(doc.text[start:end].strip()):
                inside = split_words(line)
            found.extend(inside)
        set_words(doc, new_text, found)


@dataclass
class C4Paragraph:
    """mC4's paragraph rule: drops documents without three lines of at least 200 characters."""

    name: ClassVar[str] = "c4_paragraph"
    measures: ClassVar[dict[str, str]] = {"< 3 paragraphs": "long_lines"}

    min_paragraphs: int = param(3, "fewest lines (and fewest long lines)", "int")
    min_paragraph_len: int = param(200, "characters that make a line long", "int")

    def __call__(self, doc: Document) -> Outcome:
        lines = doc.text.split("\n")
        values = {"lines": len(lines)}
        if len(lines) < self.min_paragraphs or (
            min(heapq.nlargest(3, [len(line) for line in lines])) < self.min_paragraph_len
        ):
            values["long_lines"] = sum(len(line) >= self.min_paragraph_len for line in lines)
            return Outcome(drop=f"{self.name}.< {self.min_paragraphs} paragraphs", values=values)
        return Outcome(values=values)
