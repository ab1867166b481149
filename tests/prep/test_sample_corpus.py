"""``llm-prep sample-task``: the arithmetic-sums task of the sample corpus, in the format eval.tasks reads."""

from __future__ import annotations

import json
import re
import subprocess
import sys


def test_sample_task_is_right_readable_and_deterministic(tmp_path, cli_env):
    from llmtools.formats.tasks import read_task_files

    paths = []
    for name in ("a", "b"):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "llmtools.cli.prep",
                "sample-task",
                "-o",
                tmp_path / f"{name}.jsonl",
                "--examples",
                "50",
            ],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        paths.append(tmp_path / f"{name}.jsonl")
    assert paths[0].read_bytes() == paths[1].read_bytes()
    (task,) = read_task_files([str(paths[0])])
    assert task.kind == "multiple_choice" and len(task.examples) == 50
    golds = set()
    for item in task.examples:
        a, b = map(int, re.fullmatch(r"(\d+) \+ (\d+) =", item["context"]).groups())
        sums = [int(c) for c in item["choices"]]
        assert sums[item["gold"]] == a + b and len(set(sums)) == 4 and all(s >= 0 for s in sums)
        assert all(c.startswith(" ") for c in item["choices"])
        golds.add(item["gold"])
    assert golds == {0, 1, 2, 3}  # the right sum is not always in one place
    again = subprocess.run(
        [sys.executable, "-m", "llmtools.cli.prep", "sample-task", "-o", paths[0]],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 2 and "--force" in again.stderr
    assert json.loads(paths[0].read_text().splitlines()[0])["context"].endswith("=")
