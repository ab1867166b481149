"""`llm-prep dedup` stopped by SIGTERM in the middle of a stage: exit 143, only whole units on disk, and
a second run finishes with the bytes of a run never stopped."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
FILES, DOCS = 10, 1500


def _corpus(folder: Path) -> None:
    rng = random.Random(3)
    vocab = ["".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(3, 8))) for _ in range(5000)]
    folder.mkdir()
    earlier: list[str] = []
    for f in range(FILES):
        lines = []
        for d in range(DOCS):
            copy = earlier and d % 10 == 0  # a tenth are copies of earlier documents: apply has work
            text = earlier[rng.randrange(len(earlier))] if copy else " ".join(rng.choices(vocab, k=80))
            earlier.append(text)
            lines.append(json.dumps({"id": f"{f}-{d}", "text": text}) + "\n")
        (folder / f"{f:02d}.jsonl").write_text("".join(lines))


def _dedup(cwd: Path, corpus: Path, **popen):
    env = dict(os.environ, LLMTOOLS_PROGRESS_INTERVAL="0")
    return subprocess.Popen([str(BIN / "llm-prep"), "dedup", f"{corpus}/*.jsonl", "-o", "out"], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)  # fmt: skip


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["signatures", "apply"])
def test_sigterm_in_a_stage_leaves_whole_units_and_a_rerun_finishes_the_same(tmp_path, stage):
    corpus = tmp_path / "corpus"
    _corpus(corpus)
    (tmp_path / "whole").mkdir(), (tmp_path / "stopped").mkdir()
    whole = _dedup(tmp_path / "whole", corpus)
    assert whole.wait(timeout=600) == 0, whole.stderr.read()

    proc = _dedup(tmp_path / "stopped", corpus)
    seen = []
    for line in proc.stderr:  # each unit done prints a line: stop after the first of the stage
        seen.append(line)
        if f"dedup {stage}" in line and not line.split(f"dedup {stage}:")[-1].lstrip().startswith("0%"):
            time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            break
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) == 143, "".join(seen) + rest
    assert "Traceback" not in rest
    out = tmp_path / "stopped" / "out"
    left = [str(p.relative_to(out)) for p in out.rglob("*")]
    assert not [p for p in left if ".tmp-" in p or p.endswith(".lock")], left
    sigs = sorted((out / "work" / "sig").iterdir())
    kept = sorted((out / "kept" / "corpus").glob("*.jsonl")) if (out / "kept").exists() else []
    if stage == "signatures":
        assert 0 < len(sigs) < FILES and not kept and not (out / "stats.json").exists()
    else:
        assert 0 < len(kept) < FILES and (out / "stats.json").exists()
    for path in kept:  # an output is its three files, renamed into place together
        assert Path(f"{path}.removed").exists() and Path(f"{path}.stats.json").exists()

    again = _dedup(tmp_path / "stopped", corpus)
    assert again.wait(timeout=600) == 0, again.stderr.read()
    ours, theirs = _files(out), _files(tmp_path / "whole" / "out")
    assert ours.keys() == theirs.keys() and [k for k in theirs if ours[k] != theirs[k]] == []
