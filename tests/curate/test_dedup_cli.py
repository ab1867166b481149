"""`llm-prep dedup` through its console script: the Slurm array recipes (configs/slurm/dedup-*) give the
bytes of one run on one machine; a stage run again does only what is missing; sources ranked; bad input
named in one line; --explain's curve."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from llmtools.formats.curation_stats import read_stats
from tests.conftest import REPO
from tests.curate.dedup_corpus import write_corpus

SLURM = REPO / "configs" / "slurm"
PREP = [sys.executable, "-m", "llmtools.cli.prep"]


def _run(args, cwd, env, code=0, extra_env=None):
    result = subprocess.run([*PREP, "dedup", *map(str, args)], cwd=cwd, env=dict(env, **(extra_env or {})),
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == code, result.stderr
    return result


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _array(script: str, tasks: int, env: dict, cwd: Path, **variables) -> None:
    """The tasks of one array, run at once with the variables Slurm sets (an array from 1, as --array=1-N)."""
    procs = []
    for task in range(1, tasks + 1):
        slurm = dict(SLURM_ARRAY_JOB_ID="77", SLURM_ARRAY_TASK_ID=str(task), SLURM_ARRAY_TASK_COUNT=str(tasks),
                     SLURM_ARRAY_TASK_MIN="1", SLURM_ARRAY_TASK_MAX=str(tasks), SLURM_ARRAY_TASK_STEP="1")  # fmt: skip
        procs.append(subprocess.Popen(["bash", SLURM / script], env=dict(env, **slurm, **variables), cwd=cwd,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))  # fmt: skip
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err


@pytest.mark.slow
def test_slurm_arrays_give_the_one_machine_bytes(tmp_path, cli_env):
    corpus = tmp_path / "corpus"
    write_corpus(corpus, files=4, per_similarity=4)
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "copies.jsonl").write_text((corpus / "00001.jsonl").read_text())  # all shared
    env = {k: v for k, v in cli_env.items() if not k.startswith("SLURM")}
    staged, single = tmp_path / "staged", tmp_path / "single"
    staged.mkdir(), single.mkdir()
    sources = f"books={corpus}/*.jsonl web={tmp_path}/web/*.jsonl"
    env.update(LLM_PREP=" ".join(map(shlex.quote, PREP)), OUT="out", SOURCES=sources)
    _array("dedup-array.sbatch", 3, env, staged, STAGE="signatures")
    _array("dedup-array.sbatch", 4, env, staged, STAGE="buckets")
    assert subprocess.run(["bash", SLURM / "dedup-clusters.sbatch"], env=env, cwd=staged, capture_output=True,
                          timeout=600).returncode == 0  # fmt: skip
    _array("dedup-array.sbatch", 2, env, staged, STAGE="apply")
    args = [arg for source in sources.split() for arg in ("--source", source)]
    _run([*args, "-o", "out", "-q"], single, env)
    ours, one = _files(staged / "out"), _files(single / "out")
    assert ours.keys() == one.keys() and all(ours[k] == one[k] for k in one), [
        k for k in one if ours.get(k) != one[k]
    ]
    stats = json.loads(one["stats.json"])
    web = stats["sources"]["web"]
    # each is removed: as an exact copy, or as a near one when its cluster kept a planted neighbour instead
    assert web["removed"] == web["documents"] == web["exact_duplicates"] + web["near_duplicates"] > 0
    assert web["exact_duplicates"] > 0.9 * web["documents"]
    shared_pair = [
        c for c in stats["across_sources"] if (c["removed_from"], c["kept_in"]) == ("web", "books")
    ][0]
    assert shared_pair["documents"] == web["documents"]
    assert one["kept/web/000004-copies.jsonl"] == b""  # every document of web was kept in books, ranked first


def test_a_stage_run_again_does_only_what_is_missing(tmp_path, cli_env):
    corpus = tmp_path / "corpus"
    write_corpus(corpus, files=4, per_similarity=1)
    first = _run(["signatures", f"{corpus}/*.jsonl", "-o", "out", "--no-near", "--shard", "1/2", "--json", "-q"],
                 tmp_path, cli_env)  # fmt: skip
    assert json.loads(first.stdout)["done"] == {"signatures": [2, 3]}
    # a task killed before its commit leaves a temporary beside its unit, never the unit itself
    (tmp_path / "out" / "work" / "sig" / "000000.tmp-deadbeef").mkdir()
    again = _run(["all", f"{corpus}/*.jsonl", "-o", "out", "--no-near", "--json", "-q"], tmp_path, cli_env)
    record = json.loads(again.stdout)
    assert not (tmp_path / "out" / "work" / "sig" / "000000.tmp-deadbeef").exists()  # cleaned when retaken
    assert record["done"]["signatures"] == [0, 1] and record["skipped"]["signatures"] == [2, 3]
    assert record["done"]["apply"] == [0, 1, 2, 3]
    clusters = [json.loads(line) for line in (tmp_path / "out" / "clusters.jsonl").read_text().splitlines()]
    assert [c["cluster"] for c in clusters] == list(range(len(clusters))) and clusters
    removed = sum(len((tmp_path / "out" / "kept" / "corpus" / f).read_text().splitlines())
                  for f in os.listdir(tmp_path / "out" / "kept" / "corpus") if f.endswith(".removed"))  # fmt: skip
    assert removed == sum(c["size"] - 1 for c in clusters)
    outputs = sorted((tmp_path / "out" / "kept" / "corpus").glob("*.stats.json"))
    assert len(outputs) == 4 and sum(read_stats(p)["documents"]["removed"] for p in outputs) == removed
    for c in clusters:  # exact dedup alone: the first copy in input order stays, the others are exact copies
        assert c["kept"] == c["members"][0] and all(m["kind"] == "exact" for m in c["members"][1:])
        assert c["size"] == len(c["members"]) >= 2
    last = _run(["--no-near", f"{corpus}/*.jsonl", "-o", "out", "--json", "-q"], tmp_path, cli_env)
    assert json.loads(last.stdout)["done"] == {}  # complete: nothing left to do
    # other options on the same run folder are refused, with or without the inputs
    later = _run(["apply", "-o", "out", "--n-grams", "3"], tmp_path, cli_env, code=2)
    assert "planned with other options" in later.stderr
    other = _run([f"{corpus}/*.jsonl", "-o", "out", "--no-near", "--no-exact"], tmp_path, cli_env, code=2)
    assert "nothing to find" in other.stderr
    other = _run(
        [f"{corpus}/*.jsonl", "-o", "out", "--no-near", "--text-key", "id"], tmp_path, cli_env, code=2
    )
    assert "other options or inputs" in other.stderr and other.stderr.count("\n") == 1


BAD = [
    ("malformed", b'{"text": "fine words here"}\n{"text": oops}\n', "a.jsonl:2:", "malformed_json"),
    ("missing key", b'{"text": "fine"}\n{"body": "x"}\n', "a.jsonl:2: missing key 'text'", "missing_key"),
    ("empty text", b'{"text": ""}\n{"text": "fine"}\n', "a.jsonl:1:", "empty_text"),
    ("bad utf-8", b'{"text": "fine"}\n{"text": "\xff"}\n', "a.jsonl:2:", "invalid_utf8"),
]


@pytest.mark.parametrize(("case", "data", "words", "kind"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_named_in_one_line(tmp_path, cli_env, case, data, words, kind):
    (tmp_path / "a.jsonl").write_bytes(data)
    bad = _run(["a.jsonl", "-o", "out", "--no-near"], tmp_path, cli_env, code=2)
    assert words in bad.stderr and "Traceback" not in bad.stderr and bad.stderr.count("\n") == 1
    assert not (tmp_path / "out" / "kept").exists() and not list((tmp_path / "out").rglob("*.npy"))
    _run(["a.jsonl", "-o", "out", "--no-near", "--skip-bad", "--force", "-q"], tmp_path, cli_env)
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["sources"]["corpus"]["skipped"] == {kind: 1}


def test_stdin_and_unknown_folders_are_refused(tmp_path, cli_env):
    assert "stdin" in _run(["-", "-o", "out"], tmp_path, cli_env, code=2).stderr
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    refused = _run(["a.jsonl", "-o", "mine", "--force"], tmp_path, cli_env, code=2)
    assert "not a dedup run" in refused.stderr and (tmp_path / "mine" / "notes.txt").exists()


def test_explain_prints_the_curve(tmp_path, cli_env):
    out = _run(["--explain", "--json"], tmp_path, cli_env).stdout
    info = json.loads(out)
    # the same float64 formula on both sides, printed by JSON's shortest repr: equal but for the last bit
    assert abs(info["threshold"] - (1 / 14) ** (1 / 8)) < 1e-12
    assert abs(info["catch_probability"]["0.8"] - (1 - (1 - 0.8**8) ** 14)) < 1e-12  # likewise
    text = _run(["--explain", "--bands", "20", "--rows", "5"], tmp_path, cli_env).stdout
    assert f"{(1 / 20) ** (1 / 5):.4f}" in text and f"s=0.8: {1 - (1 - 0.8**5) ** 20:.4f}" in text
