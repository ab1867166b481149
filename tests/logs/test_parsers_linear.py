"""Every log parser is linear in a line's length, and its linear searches answer as the plain patterns did.

A log is untrusted input: one line of repeated pattern heads made a backtracking search rescan the rest of
the line from every head (minutes for a line under 1 MB). The hostile lines are generated from the
parsers' own patterns (every literal run of every compiled pattern in the module, repeated to fill a line,
after every head a real line starts with), so a pattern added later is covered without naming it here.
"""

from __future__ import annotations

import random
import re
import time

import pytest

from llmtools.logs import parsers
from llmtools.logs.parsers import make_parser

PARSERS = ("megatron", "deepspeed", "mindformers", "generic", "jsonl")
LINE_CHARS = 100_000
# Linear parsing of a 100 KB line takes milliseconds; the quadratic patterns took 1 to 9 s on a 40 KB
# line (6 to 60 s here). The bound only has to tell those apart on a slow, shared machine.
BOUND_S = 3.0


def _literal_runs(pattern: re.Pattern) -> list[str]:
    """The literal pieces of a pattern (e.g. "validation", " loss at "), from its parsed form."""
    runs: list[str] = []

    def walk(items) -> None:
        current = ""
        for op, arg in items:
            name = str(op)
            if name == "LITERAL":
                current += chr(arg)
                continue
            if current:
                runs.append(current)
                current = ""
            if name in ("SUBPATTERN",):
                walk(arg[-1])
            elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                walk(arg[-1])
            elif name == "BRANCH":
                for branch in arg[1]:
                    walk(branch)
            elif name in ("ATOMIC_GROUP", "ASSERT", "ASSERT_NOT"):
                walk(arg[-1])
        if current:
            runs.append(current)

    walk(re._parser.parse(pattern.pattern))  # the stdlib's own parser of the pattern syntax
    return runs


def _fragments() -> list[str]:
    patterns = [v for v in vars(parsers).values() if isinstance(v, re.Pattern)]
    assert len(patterns) >= 15, "the parsers' patterns were not found"
    pieces = {run for p in patterns for run in _literal_runs(p)}
    # each piece alone, and with what the patterns expect after it (a number, a word, a space, a bar)
    return sorted({f"{piece}{tail}" for piece in pieces for tail in ("", "1", " ", "-")})


# what a real line of each format starts with, so that the parser reaches its later patterns
HEADS = {
    "megatron": ("", "iteration 1 / 2 |"),
    "deepspeed": ("", "[2024-01-01 00:00:00,000] "),
    "mindformers": ("", "{ Epoch:[1/2], step:[1/2], loss: 1,"),
    "generic": ("",),
    "jsonl": ("",),
}


@pytest.mark.parametrize("name", PARSERS)
def test_repeated_pattern_pieces_parse_in_linear_time(name):
    slowest = (0.0, "")
    for head in HEADS[name]:
        for fragment in _fragments():
            line = head + fragment * (LINE_CHARS // len(fragment))
            parser = make_parser(name) if name != "generic" else make_parser(name, None)
            if name == "mindformers":  # its throughput lines are read only after a step line
                parser.parse("{ Epoch:[1/2], step:[1/2], loss: 1, per_step_time: 1ms", 1)
            start = time.perf_counter()
            parser.detect(line)
            try:
                parser.parse(line, 2)
            except ValueError:  # a jsonl parser refuses a line that is not JSON: a refusal, not a hang
                pass
            spent = time.perf_counter() - start
            slowest = max(slowest, (spent, f"{head!r} + {fragment!r} x {LINE_CHARS // len(fragment)}"))
    assert slowest[0] < BOUND_S, f"{name}: {slowest[0]:.1f} s on {slowest[1]}"


# The patterns as they were written before the searches were made linear: on short lines they are fast,
# and the linear searches must give the same answers.
_NUM = parsers._NUM
PLAIN = {
    "validation": re.compile(r"\bvalidation(?:-(\S+))? loss at (.*?)\|(.*)$"),
    "loaded": re.compile(r"successfully loaded checkpoint from (\S+).*?at iteration (\d+)"),
    "progress": re.compile(r"\bstep=(\d+), skipped=(\d+), lr=\[([^\]]*)\]"),
    "pipe": re.compile(
        r"\bsteps: (\d+) loss: ("
        + _NUM
        + r") (.*?)iter time \(s\): ("
        + _NUM
        + r") samples/sec: ("
        + _NUM
        + ")"
    ),
    "mf_progress": re.compile(r"%\s*\|.*\|\s*(" + _NUM + r") samples/s/p"),
}
PIECES = {
    "validation": ["validation", "-", "x", " loss at ", "iteration 5", "|", " ", "lm loss value: 1.5", "a"]
    + ["validation loss at "],
    "loaded": ["successfully loaded checkpoint from ", "/ck", " ", "at iteration ", "7", "x", "at"],
    "progress": ["step=3, skipped=0, lr=[", "step=", "0.1", ", ", "]", "x", " ", "["],
    "pipe": [
        "steps: 4 loss: 2.5 ",
        "a: 1 ",
        "b: 2",
        "iter time (s): 0.5 samples/sec: 9",
        "x",
        " ",
        "steps: ",
    ],
    "mf_progress": ["%", " ", "|", "a", "3.5", " samples/s/p", "x", "| 2 samples/s/p", "% |"],
}


def _linear(kind: str, line: str):
    """The linear search's answer, as (start, groups) like the plain pattern's match."""
    if kind == "validation":
        m = parsers._search_validation(line)
        return (m.start(), m.groups()) if m else None
    if kind == "loaded":
        m = parsers._MEGATRON_LOADED.search(line)
        found = parsers._search_loaded(line)
        return (m.start(), found) if found else None
    if kind == "progress":
        found = parsers._ds_progress(line)
        return (found[0].start(), (*found[0].groups(), line[found[0].end() : found[1]])) if found else None
    if kind == "pipe":
        found = parsers._ds_pipe(line)
        if not found:
            return None
        head, tail = found
        return (head.start(), (*head.groups(), line[head.end() : tail.start()], *tail.groups()))
    head = parsers._MF_PROGRESS.search(line)
    tails = list(parsers._MF_PROGRESS_TAIL.finditer(line, head.end())) if head else []
    return (head.start(), (tails[-1].group(1),)) if tails else None


@pytest.mark.parametrize("kind", sorted(PLAIN))
def test_linear_searches_answer_as_the_plain_patterns(kind):
    rng = random.Random(kind)
    matched = 0
    for _ in range(3000):
        line = "".join(rng.choice(PIECES[kind]) for _ in range(rng.randint(0, 14)))
        plain = PLAIN[kind].search(line)
        expected = (plain.start(), plain.groups()) if plain else None
        assert _linear(kind, line) == expected, line
        matched += plain is not None
    assert matched > 30, "the generator hardly ever builds a matching line: the comparison would be empty"
