"""Where the assistant contents are, from a bounded number of renderings (:class:`~llmtools.prep.chat_template.
ChatTemplate`'s default way for templates without ``{% generation %}`` blocks).

Prefix-by-prefix rendering is the reference (``ChatTemplate._incremental_spans``), and quadratic in turns. Here
the contents are marked with private-use sentinel characters and the conversation rendered a fixed number of
times: replaced by numbered marks (templates that write a content verbatim or trimmed), wrapped in numbered
pairs (templates that escape or transform it), or cut out between marked neighbours (templates that rewrite
it). Each way checks its own result against the real rendering, and :func:`checked_spans` checks the header
and end-of-turn text against the reference at three sample turns. Where a check fails: ``None``, and the
caller goes prefix by prefix.
"""

from __future__ import annotations

import re

from llmtools.prep.template_sandbox import TemplateRenderError

# The sentinels: a mark in place of a content, and a pair of single characters around one (planes 15 and 16,
# one character per turn in each). Private-use characters: no template writes them.
REPLACED_MARK = "\ue000{}\ue001"
WRAP_OPEN, WRAP_CLOSE, MAX_WRAPPED_TURNS = 0xF0000, 0x100000, 0xFFFE
WRAP_CHARS = re.compile("[\U000f0000-\U0010ffff]")
SENTINEL_CHARS = re.compile("[\ue000\ue001\U000f0000-\U0010ffff]")


def bounded_spans(template, messages: list[dict], full: str) -> list[tuple[int, int]] | None:
    """The spans :meth:`ChatTemplate._incremental_spans` finds, from a bounded number of renderings.

    Where each assistant content lands is found from one rendering with the contents marked by
    private-use sentinels: replaced by numbered marks (:func:`replaced_contents`: templates that write a
    content verbatim or trimmed), else wrapped in numbered pairs (:func:`wrapped_contents`: templates
    that escape or transform a content without inspecting it), else cut out between marked neighbours
    (:func:`isolated_contents`: templates that rewrite a content, such as reasoning models' dropping of
    a ``<think>`` part). The header and end-of-turn text around the contents are then checked
    (:func:`checked_spans`). Anything else, non-string contents, or a
    rendering that holds a sentinel character already: ``None``, and the caller takes the
    prefix-by-prefix way.
    """
    turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if not turns:
        return []
    contents = [messages[i].get("content") for i in turns]
    if not all(isinstance(c, str) for c in contents) or SENTINEL_CHARS.search(full):
        return None
    marked = render_with(template, messages, turns, _marks(len(turns)))  # two of the ways start from it
    regions = replaced_contents(template, messages, turns, contents, full, marked)
    if regions is None:
        regions = wrapped_contents(template, messages, turns, contents, full)
    if regions is None:
        regions = isolated_contents(template, messages, turns, contents, full, marked)
    return None if regions is None else checked_spans(template, messages, turns, *regions, full)


def _marks(count: int) -> list[str]:
    return [REPLACED_MARK.format(k) for k in range(count)]


def render_with(template, messages: list[dict], turns: list[int], contents: list[str]) -> str | None:
    """The conversation rendered with assistant message ``turns[k]``'s content set to ``contents[k]``
    (``None`` where the template fails on that)."""
    probe = list(messages)
    for i, content in zip(turns, contents, strict=True):
        probe[i] = {**messages[i], "content": content}
    try:
        return template.render(probe)
    except TemplateRenderError:
        return None


def replaced_contents(
    template,
    messages: list[dict],
    turns: list[int],
    contents: list[str],
    full: str,
    marked: str | None = None,
) -> tuple[list[int], list[int]] | None:
    """Where each content starts and ends in ``full``: every content replaced by a numbered mark and
    the conversation rendered once; putting the contents (or the contents trimmed, as Llama 3's
    template writes them) back in place of the marks must give ``full`` exactly."""
    marks = _marks(len(turns))
    marked = marked if marked is not None else render_with(template, messages, turns, marks)
    if marked is None or marked.count(REPLACED_MARK[0]) != len(marks):
        return None
    # Walk both renderings side by side: the template's own text must be equal, and in place of each
    # mark the content, or the content trimmed.
    starts, ends, pos, cursor = [], [], 0, 0
    for mark, content in zip(marks, contents, strict=True):
        at = marked.find(mark, pos)
        if at < 0 or not full.startswith(marked[pos:at], cursor):
            return None
        cursor += at - pos
        written = next((c for c in (content, content.strip()) if full.startswith(c, cursor)), None)
        if written is None:
            return None
        starts.append(cursor)
        cursor += len(written)
        ends.append(cursor)
        pos = at + len(mark)
    return (starts, ends) if full[cursor:] == marked[pos:] else None


def wrapped_contents(
    template, messages: list[dict], turns: list[int], contents: list[str], full: str
) -> tuple[list[int], list[int]] | None:
    """Where each content, as the template transformed it, starts and ends in ``full``: every content
    wrapped in a numbered pair of sentinel characters and the conversation rendered once. Each sentinel
    must appear exactly once and in order, and deleting them must give ``full`` exactly: a template that
    escapes or replaces in a content passes, one that measures, splits or tests it renders differently
    or loses a sentinel (unless that makes no difference to this conversation)."""
    if len(turns) > MAX_WRAPPED_TURNS:
        return None
    pairs = [(chr(WRAP_OPEN + k), chr(WRAP_CLOSE + k)) for k in range(len(turns))]
    marked = render_with(
        template, messages, turns, [f"{o}{c}{e}" for (o, e), c in zip(pairs, contents, strict=True)]
    )
    if marked is None:
        return None
    found = list(WRAP_CHARS.finditer(marked))
    if [m.group() for m in found] != [char for pair in pairs for char in pair]:
        return None
    if WRAP_CHARS.sub("", marked) != full:
        return None
    # In full, a sentinel's place less the sentinels before it: 2k before turn k's opening one.
    starts = [found[2 * k].start() - 2 * k for k in range(len(turns))]
    ends = [found[2 * k + 1].start() - 2 * k - 1 for k in range(len(turns))]
    return starts, ends


def isolated_contents(
    template,
    messages: list[dict],
    turns: list[int],
    contents: list[str],
    full: str,
    marked: str | None = None,
) -> tuple[list[int], list[int]] | None:
    """Where each content, however the template rewrote it, starts and ends in ``full``, from three
    renderings: every content replaced by a numbered mark (which gives the template's own text
    between the contents), then the even-numbered contents real and the odd ones marks, then the
    reverse. In those two, the text between the two marks around content k must be the template's
    own text before k, then what it wrote for k, then its own text after k; and the template's text
    and what it wrote for each content, put together, must give ``full`` exactly. So it serves a
    template that rewrites a content however it likes (``content.split('</think>')[-1]``), as long as
    its own text does not depend on the content (a header that prints a content's length fails)."""
    marks = _marks(len(turns))
    marked = marked if marked is not None else render_with(template, messages, turns, marks)
    places = _places(marked, marks) if marked is not None else None
    if places is None:
        return None
    bounds = [0, *(i for place in places for i in place), len(marked)]
    own = [marked[a:b] for a, b in zip(bounds[::2], bounds[1::2], strict=True)]  # around the contents
    written: list[str | None] = [None] * len(turns)
    for parity in (0, 1):
        real = range(parity, len(turns), 2)
        if not real:
            continue
        probe = [contents[k] if k % 2 == parity else marks[k] for k in range(len(turns))]
        rendered = render_with(template, messages, turns, probe)
        marked_turns = range(1 - parity, len(turns), 2)
        neighbours = _places(rendered, [marks[k] for k in marked_turns]) if rendered is not None else None
        if neighbours is None:
            return None
        mark_at = dict(zip(marked_turns, neighbours, strict=True))
        for k in real:
            region = rendered[
                mark_at[k - 1][1] if k else 0 : mark_at[k + 1][0] if k + 1 < len(turns) else len(rendered)
            ]
            head, tail = own[k], own[k + 1]
            if len(region) < len(head) + len(tail) or not (region.startswith(head) and region.endswith(tail)):
                return None
            written[k] = region[len(head) : len(region) - len(tail)]
    starts, ends, cursor = [], [], 0
    for k, text in enumerate(written):
        cursor += len(own[k])
        starts.append(cursor)
        cursor += len(text)
        ends.append(cursor)
    joined = "".join(part for pair in zip(own, [*written, ""], strict=True) for part in pair)
    return (starts, ends) if joined == full else None


def checked_spans(
    template, messages: list[dict], turns: list[int], starts: list[int], ends: list[int], full: str
) -> list[tuple[int, int]] | None:
    """Content regions made spans, as :meth:`ChatTemplate._incremental_spans` would make them: the header ends where
    the content starts and the turn ends a fixed text later. Both are measured by the prefix-by-prefix
    method at three sample turns (first, middle, last), which must agree with each other, and the
    end-of-turn text must follow every content."""
    tail = None
    for k in sorted({0, len(turns) // 2, len(turns) - 1}):
        measured = template._turn_span(messages, turns[k], full)
        if measured is None or measured[0] != starts[k]:
            return None
        text = full[ends[k] : measured[1]] if measured[1] >= ends[k] else None
        if text is None or (tail is not None and text != tail):
            return None
        tail = text
    if not all(full.startswith(tail, end) for end in ends):
        return None
    return [(start, end + len(tail)) for start, end in zip(starts, ends, strict=True)]


def _places(rendering: str, marks: list[str]) -> list[tuple[int, int]] | None:
    """Where each mark is, in order, each exactly once (``None`` otherwise, or if other text looks like one)."""
    if rendering.count(REPLACED_MARK[0]) != len(marks):
        return None
    places, pos = [], 0
    for mark in marks:
        at = rendering.find(mark, pos)
        if at < 0:
            return None
        pos = at + len(mark)
        places.append((at, pos))
    return places
