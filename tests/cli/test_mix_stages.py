"""llm-mix --stage: mixture schedules written, explained per stage, and refused when malformed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from llmtools.cli._common import expand_multi_value_flags
from llmtools.cli.mix import GROUPED_FLAGS, MULTI_VALUE_FLAGS
from llmtools.cli.mix_args import parse_stage_key, parse_stages
from llmtools.data.stages import StageKey
from llmtools.errors import InputError, UsageError
from tests.cli.test_mix import REPO, llm_mix, write_source


@pytest.fixture
def data(tmp_path):
    a = write_source(tmp_path / "web", 200, 1, "sha256:same")
    b = write_source(tmp_path / "code", 80, 2, "sha256:same")
    c = write_source(tmp_path / "hq", 40, 3, "sha256:same")
    return tmp_path, a, b, c


def test_stage_spelling():
    argv = ["--stage", "90%", "0.7", "0.3", "-o", "m.json", "--stage", "end", "1,0", "--data-path", "1", "a"]
    assert expand_multi_value_flags(argv, MULTI_VALUE_FLAGS, grouped=GROUPED_FLAGS) == [
        "--stage", "90% 0.7 0.3", "-o", "m.json", "--stage", "end 1,0", "--data-path", "1", "--data-path", "a",
    ]  # fmt: skip
    assert parse_stage_key("step:800") == StageKey("step", 800)
    assert parse_stage_key("Tokens:1.8B") == StageKey("tokens", 1_800_000_000)
    assert parse_stage_key("samples:12K") == StageKey("samples", 12_000)
    assert parse_stage_key("90%") == StageKey("percent", 90.0)
    assert parse_stage_key("end") == StageKey("end")
    stages = parse_stages(["step:10 0.5,0.5", "end 1 0"])
    assert [s.start for s in stages] == [StageKey("samples", 0), StageKey("step", 10)]
    assert [s.weights for s in stages] == [(0.5, 0.5), (1.0, 0.0)]
    for bad, words in (
        ("hours:3", "give step:N, tokens:T, samples:N"),
        ("150%", "(0%, 100%]"),
        ("step:-3", "not a positive integer"),
    ):
        with pytest.raises(
            UsageError, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
        ):
            parse_stage_key(bad)
    with pytest.raises(UsageError, match="weight 2 .'x'. is not a number"):
        parse_stages(["end 0.5 x"])


def test_stage_weights_from_a_file(tmp_path):
    listed = tmp_path / "w.txt"
    listed.write_text("# anneal\n0.5, 0.25\n0.25\n")
    (stage,) = parse_stages([f"end @{listed}"])
    assert stage.weights == (0.5, 0.25, 0.25)
    (stage,) = parse_stages([f"end 1 @{listed} 2"])
    assert stage.weights == (1.0, 0.5, 0.25, 0.25, 2.0)
    listed.write_text("0.5 half\n")
    with pytest.raises(UsageError, match=f"--stage 1: weight 2 .'half' in {listed}. is not a number"):
        parse_stages([f"end @{listed}"])
    with pytest.raises(InputError, match="no such list file"):
        parse_stages([f"end @{tmp_path / 'missing.txt'}"])


def test_a_schedule_is_written_and_explained_per_stage(monkeypatch, capsys, data):
    tmp, a, b, c = data
    out = tmp / "mix.json"
    code, stdout, err = llm_mix(
        monkeypatch, capsys, a, b, c, "--seq-length", "16", "--num-samples", "2000", "-o", out,
        "--global-batch-size", "20", "--stage", "step:50", "0.7", "0.3", "0",
        "--stage", "90%", "0.5,0.5,0", "--stage", "end", "0.2", "0.2", "0.6", "--explain",
    )  # fmt: skip
    assert code == 0, err
    assert "[train] 2000 samples (requested 2000)" in stdout and "3 stages" in stdout
    assert "stage 0: samples:0 .. step:50 = samples [0, 1000), steps 1-50" in stdout
    assert "stage 1: step:50 .. 90% = samples [1000, 1800)" in stdout
    assert "stage 2: 90% .. end = samples [1800, 2000)" in stdout
    assert "whole schedule:" in stdout
    mix = json.loads(out.read_text())
    assert [(s["start"], s["end"]) for s in mix["stages"]] == [(0, 1000), (1000, 1800), (1800, 2000)]
    assert mix["global_batch_size"] == 20 and mix["splits"]["train"]["blend_weights"] == []
    # the offsets carry the streams across stages: stage k starts each source where stage k-1 left it
    first, second = mix["stages"][0], mix["stages"][1]
    assert second["offsets"] == first["positions_after"]
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(mix, json.loads((REPO / "schemas" / "mix.schema.json").read_text()))


@pytest.mark.parametrize(
    "stages, extra, message",
    [
        (["end 0.5 0.5"], [], "--stage 1 (end): 2 weight(s) for 3 source(s)"),
        (["step:5 1 0 0", "end 0 1 0"], [], "--stage in steps needs --global-batch-size N"),
        (
            ["samples:500 1 0 0", "samples:400 0 1 0", "end 0 0 1"],
            [],
            "--stage 2 (samples:400): ends at sample 400, not after its start at sample 500 (samples:500): the stages overlap or are out of order",
        ),
        (
            ["samples:500 1 0 0", "samples:900 0 1 0"],
            [],
            "--stage 2 (samples:900): the schedule ends at sample 900, before the plan's 1000 samples",
        ),
        (["samples:5000 1 0 0"], [], "beyond the plan's 1000 samples"),
        (["end 0 0 0"], [], "all weights are zero"),
        (["end 1 -1 0"], [], "weight 2 is negative"),
    ],
)
def test_bad_schedules_exit_2_in_one_line(monkeypatch, capsys, data, stages, extra, message):
    tmp, a, b, c = data
    argv = [a, b, c, "--seq-length", "16", "--num-samples", "1000", "-o", tmp / "mix.json", *extra]
    for stage in stages:
        argv += ["--stage", *stage.split()]
    code, out, err = llm_mix(monkeypatch, capsys, *argv)
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("llm-mix: error: ") and message in err, err
    assert not (tmp / "mix.json").exists()


def test_the_real_command_refuses_a_bad_schedule(data, cli_env):
    tmp, a, b, c = data
    done = subprocess.run(
        [sys.executable, "-m", "llmtools.cli.mix", a, b, "--seq-length", "16", "--num-samples", "100",
         "--stage", "samples:60", "1", "0", "--stage", "samples:50", "0", "1", "-o", str(tmp / "m.json")],
        capture_output=True, text=True, env=cli_env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "llm-mix: error: --stage 2 (samples:50): ends at sample 50, not after its start at sample 60 "
        "(samples:60): the stages overlap or are out of order"
    )
    assert not (tmp / "m.json").exists()


def test_the_same_data_under_two_names_is_refused_in_a_schedule(data, cli_env):
    """A schedule follows each source by its content: a copy of one source listed beside it is one line,
    exit 2 (it was an internal error)."""
    import shutil

    tmp, a, b, _ = data
    copy = tmp / "copy_of_web"
    for suffix in (".bin", ".idx"):
        shutil.copyfile(f"{a}{suffix}", f"{copy}{suffix}")
    done = subprocess.run(
        [sys.executable, "-m", "llmtools.cli.mix", a, b, str(copy), "--seq-length", "16", "--num-samples", "100",
         "--stage", "90%", "0.7,0.3,0", "--stage", "end", "0.3,0.2,0.5", "-o", str(tmp / "m.json")],
        capture_output=True, text=True, env=cli_env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "the same data as" in lines[0] and "copy_of_web" in lines[0], done.stderr
    assert not (tmp / "m.json").exists()


def test_a_schedule_over_many_sources_named_by_a_glob_is_explained_per_stage_and_folder(tmp_path, cli_env):
    import numpy as np

    from llmtools.formats.indexed import IndexedDatasetWriter

    rng = np.random.default_rng(0)
    for k in range(24):  # 8 code shards, 16 web shards: more than --explain lists one by one
        with IndexedDatasetWriter(
            tmp_path / ("web" if k % 3 else "code") / f"s{k:02d}_text_document", np.uint16, durable=False
        ) as writer:
            lengths = rng.integers(20, 300, 30)
            writer.add_documents(rng.integers(0, 1000, int(lengths.sum())), lengths)
    # one weight per shard, from files: the glob sorts code/ first, then web/
    (tmp_path / "web_only.txt").write_text("# code shards out\n" + "0 " * 8 + "\n" + "1\n" * 16)
    done = subprocess.run(
        [sys.executable, "-m", "llmtools.cli.mix", "*/s*_text_document", "--seq-length", "64",
         "--num-samples", "2000", "--stage", "50%", "@web_only.txt", "--stage", "end", *["1"] * 24,
         "--explain", "-o", "m.json"],
        capture_output=True, text=True, env=cli_env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "24 sources, grouped by folder (llm-mix --json lists every source)" in lines
    titles = [i for i, line in enumerate(lines) if line.startswith("  stage ") or line == "  whole schedule:"]
    assert [lines[i].split("=")[0].strip() for i in titles] == [
        "stage 0: samples:0 .. 50%",
        "stage 1: 50% .. end",
        "whole schedule:",
    ]
    rows = {}
    for t, title in enumerate(titles):
        block = lines[title + 2 : titles[t + 1] if t + 1 < len(titles) else None]
        rows[t] = {
            r.split()[0]: r.split() for r in block if r.startswith("    ") and r.split()[0].endswith("/")
        }
    assert list(rows[0]) == ["web/"] and rows[0]["web/"][1] == "16"  # code left out of stage 0
    assert rows[1]["code/"][1] == "8" and rows[1]["web/"][1] == "16"
    # the whole schedule adds up what the stages drew
    mix = json.loads((tmp_path / "m.json").read_text())
    drawn = sum(int(rows[2][f][4]) for f in rows[2])
    assert (
        drawn
        == mix["splits"]["train"]["num_samples"]
        == int(rows[0]["web/"][4]) + sum(int(r[4]) for r in rows[1].values())
    )
