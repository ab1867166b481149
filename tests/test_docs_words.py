"""Docs and file names speak of the project, never of the work period that produced them: a result file is
named by device, date and what it measured (``h200-2026-11-26-zero2-compiled-vs-hf.json``), a line says
"on the same day" or names the commit, not "in the same session" or "session 35" (who worked when is git's
business, as in tests/test_comments.py for issue numbers)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A work period: a numbered session or round, or a session placed in time ("this session", "the previous
# session's run"), a sprint. An ssh or terminal session is a thing the docs may speak of.
WORK_PERIOD = re.compile(
    r"\bsessions?[\s_#-]*\d+"
    r"|\b(this|that|same|previous|last|next|earlier|later|another|each|every|one|our|a)\s+(work\s+)?sessions?\b"
    r"|\bsprints?\b|\bwork[\s-]+periods?\b|\b(hardening|review)[\s-]+rounds?\b|\brounds?[\s_-]*\d+\s+of\s+(the\s+)?(work|hardening|review)",
    re.IGNORECASE,
)


def _tracked() -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode == 0:
        return listed.stdout.splitlines()
    return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if ".git" not in p.parts and ".venv" not in p.parts]


def _texts() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_no_file_is_named_after_a_work_period():
    found = [name for name in _tracked() if WORK_PERIOD.search(name.replace("/", " "))]
    assert not found, "files named after a work period (name them by device, date and what they measured):\n" + "\n".join(found)


def test_no_doc_line_speaks_of_a_work_period():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}"
        for path in _texts()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if WORK_PERIOD.search(line)
    ]
    assert not found, "doc lines worded after a work period (say what was measured, when, on what):\n" + "\n".join(found)


def test_the_pattern_sees_the_spellings_we_used():
    for text in (
        "h200-2026-11-26-session35.json",
        "h200-2026-11-26-session35-moe-ac.json",
        "In the same session, through the installed console scripts",
        "as in the previous session's default run",
        "measured in session 12",
        "round 4 of the hardening",
    ):
        assert WORK_PERIOD.search(text), text
    for text in (
        "SIGHUP (a closed terminal or ssh session) and SIGQUIT",
        "0.87x (per round 0.81, 0.89, 0.70)",
        "bench_writer.py --rounds 7",
        "h200-2026-11-26-zero2-compiled-vs-hf.json",
        "On the same day, on an H200",
    ):
        assert not WORK_PERIOD.search(text), text
