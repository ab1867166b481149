"""``llm-mix`` over many sources: globs and ``@list`` files name them, ``--data-path @FILE`` /
``--data-args-path`` read a blend from a file, and ``--explain`` groups more than 20 sources by folder."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from llmtools.cli.mix_explain import fold
from llmtools.formats.indexed import IndexedDatasetWriter
from tests.conftest import REPO


def mix(args, env, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llmtools.cli.mix", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """24 small sources in two folders."""
    root = tmp_path_factory.mktemp("many")
    rng = np.random.default_rng(0)
    for k in range(24):
        folder = root / ("web" if k % 3 else "code")
        with IndexedDatasetWriter(folder / f"s{k:02d}_text_document", np.uint16, durable=False) as writer:
            lengths = rng.integers(20, 300, 30)
            writer.add_documents(rng.integers(0, 1000, int(lengths.sum())), lengths)
    return root


def plan_arrays(path) -> dict:
    data = json.loads(path.read_text())
    return {"sources": [s["prefix"] for s in data["sources"]], "hash": data["cache"]["hash"]}


def test_globs_and_lists_name_the_same_blend(many, cli_env, tmp_path):
    common = ["--seq-length", "64", "--num-samples", "2000"]
    explicit = sorted(str(p.with_suffix("")) for p in many.glob("*/*.idx"))
    by_name = mix([*explicit, *common, "-o", tmp_path / "a.json"], cli_env, many)
    assert by_name.returncode == 0, by_name.stderr
    by_glob = mix(["*/s*_text_document", *common, "-o", tmp_path / "b.json"], cli_env, many)
    assert by_glob.returncode == 0, by_glob.stderr
    listing = tmp_path / "sources.txt"
    listing.write_text("# every shard\n" + "".join(f"{p}.idx\n" for p in explicit))
    by_list = mix([f"@{listing}", *common, "-o", tmp_path / "c.json"], cli_env, many)
    assert by_list.returncode == 0, by_list.stderr
    expected = plan_arrays(tmp_path / "a.json")
    assert (
        plan_arrays(tmp_path / "b.json")["hash"]
        == plan_arrays(tmp_path / "c.json")["hash"]
        == expected["hash"]
    )
    weights = ",".join(["1"] * 23)
    wrong = mix(["*/s*_text_document", "--weights", weights, *common, "--explain"], cli_env, many)
    assert wrong.returncode == 2 and "23 weight(s) for 24 source(s)" in wrong.stderr


def test_blend_from_a_file(many, cli_env, tmp_path):
    common = ["--seq-length", "64", "--num-samples", "2000"]
    blend = tmp_path / "blend.txt"
    blend.write_text(
        f"# Megatron's spelling, over lines\n0.7 {many}/web/s01_text_document\n0.3 {many}/code/s00_text_document\n"
    )
    inline = mix(
        [
            "--data-path",
            "0.7",
            many / "web/s01_text_document",
            "0.3",
            many / "code/s00_text_document",
            *common,
            "-o",
            tmp_path / "i.json",
        ],
        cli_env,
        many,
    )
    assert inline.returncode == 0, inline.stderr
    for flag in (["--data-path", f"@{blend}"], ["--data-args-path", blend]):
        result = mix([*flag, *common, "-o", tmp_path / "f.json", "--force"], cli_env, many)
        assert result.returncode == 0, result.stderr
        assert plan_arrays(tmp_path / "f.json")["hash"] == plan_arrays(tmp_path / "i.json")["hash"]
    weighted_glob = mix(
        ["--data-path", "0.5", "web/*_text_document", "0.5", "code/s00_text_document", *common, "--explain"],
        cli_env,
        many,
    )
    assert weighted_glob.returncode == 2 and "glob in a weighted blend" in weighted_glob.stderr
    (tmp_path / "empty.txt").write_text("\n# nothing\n")
    empty = mix(["--data-path", f"@{tmp_path}/empty.txt", *common, "--explain"], cli_env, many)
    assert empty.returncode == 2 and "names nothing" in empty.stderr


def test_explain_groups_many_sources_by_folder(many, cli_env, tmp_path):
    result = mix(
        ["*/s*_text_document", "--seq-length", "64", "--num-samples", "2000", "--explain"], cli_env, many
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    rows = [line.split() for line in lines if line.startswith("  code/") or line.startswith("  web/")]
    assert [(r[0], r[1]) for r in rows] == [("code/", "8"), ("web/", "16")]
    assert abs(sum(float(r[3]) for r in rows) - 1.0) < 1e-3  # realized shares add up
    assert len(lines) < 15, result.stdout  # 24 sources, a handful of lines
    # the 24 notes (no sidecar) are folded into one line on stderr too
    assert result.stderr.count("no sidecar") == 1 and "24 sources (" in result.stderr


def test_fold_keeps_few_messages_and_folds_many():
    few = [f"a{k}: exhausted" for k in range(3)]
    assert fold(few) == few
    many = [f"web/s{k}: repeated {k}.5 epochs in the train split" for k in range(30)] + ["train: one line"]
    folded = fold(many)
    assert folded[0].startswith("30 sources (web/s0, web/s1, web/s2 and 27 more): repeated 0.5 epochs")
    assert folded[0].endswith("(figures of web/s0)") and folded[1] == "train: one line"


def test_help_mentions_globs(cli_env):
    out = subprocess.run(
        [sys.executable, "-m", "llmtools.cli.mix", "--help"],
        env=cli_env,
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 0 and "@list.txt" in out.stdout and "--data-args-path" in out.stdout
