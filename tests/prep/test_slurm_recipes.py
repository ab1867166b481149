"""``configs/slurm/json2bin-*.sbatch``: the array's tasks emulated as concurrent processes with the
``SLURM_ARRAY_*`` variables Slurm sets, then the dependent merge job; the result equals one json2bin
run. ``json2bin-submit.sh`` is run against a stand-in ``sbatch`` that records its calls."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from llmtools.formats.sidecar import read_sidecar
from tests.conftest import REPO, shared

SLURM = REPO / "configs" / "slurm"


def test_array_then_merge_equals_one_run(tmp_path, cli_env):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = shared("tinyshakespeare/input.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    for k in range(9):  # files of very different sizes
        (corpus / f"shard-{k}.jsonl").write_text(
            "".join(lines[k * k * 40 : (k + 1) * (k + 1) * 40]), encoding="utf-8"
        )
    llm_prep = f"{shlex.quote(sys.executable)} -m llmtools.cli.prep"
    env = dict(cli_env, INPUTS=f"{corpus}/*.jsonl", OUT=str(tmp_path / "out" / "web"), TOKENIZER="byte")
    env.update(
        LLM_PREP=llm_prep, JSON2BIN_ARGS="--append-eod --json-keys text", KEYS="text", REMOVE_SHARDS="1"
    )
    env = {k: v for k, v in env.items() if not k.startswith("SLURM")}
    # --array=1-4: Slurm sets these for every task (and SLURM_CPUS_PER_TASK from --cpus-per-task)
    tasks = []
    for task_id in range(1, 5):
        task_env = dict(
            env,
            SLURM_ARRAY_JOB_ID="4242",
            SLURM_ARRAY_TASK_ID=str(task_id),
            SLURM_ARRAY_TASK_COUNT="4",
            SLURM_ARRAY_TASK_MIN="1",
            SLURM_ARRAY_TASK_MAX="4",
            SLURM_ARRAY_TASK_STEP="1",
            SLURM_CPUS_PER_TASK="1",
        )
        tasks.append(
            subprocess.Popen(
                ["bash", SLURM / "json2bin-array.sbatch"],
                env=task_env,
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for task in tasks:
        out, err = task.communicate(timeout=300)
        assert task.returncode == 0, err
    shards = sorted(p.name for p in (tmp_path / "out").glob("web-*.idx"))
    assert shards == [f"web-{i:05d}-of-00004_text_document.idx" for i in range(4)]
    merge = subprocess.run(
        ["bash", SLURM / "json2bin-merge.sbatch"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert merge.returncode == 0, merge.stderr
    one = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmtools.cli.prep",
            "json2bin",
            f"{corpus}/*.jsonl",
            "-t",
            "byte",
            "-o",
            tmp_path / "one",
        ]
        + ["--append-eod", "-q"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert one.returncode == 0, one.stderr
    for suffix in (".bin", ".idx"):
        merged = (tmp_path / "out" / f"web_text_document{suffix}").read_bytes()
        assert merged == (tmp_path / f"one_text_document{suffix}").read_bytes()
    assert read_sidecar(tmp_path / "out" / "web_text_document")["shards"][0]["ranges"] == [[0, 4]]
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.suffix != ".lock") == [
        "web_text_document.bin",
        "web_text_document.idx",
        "web_text_document.json",
    ]  # REMOVE_SHARDS=1 removed the shards after the merge


def test_a_failed_task_stops_the_merge(tmp_path, cli_env):
    """A task that fails leaves no shard, and the merge refuses the incomplete run (exit 2)."""
    (tmp_path / "a.jsonl").write_text('{"text": "one"}\n')
    (tmp_path / "b.jsonl").write_text('{"text": "two"}\nnot json\n')
    llm_prep = f"{shlex.quote(sys.executable)} -m llmtools.cli.prep"
    env = {k: v for k, v in cli_env.items() if not k.startswith("SLURM")}
    env.update(INPUTS=f"{tmp_path}/*.jsonl", OUT=str(tmp_path / "w"), TOKENIZER="byte", LLM_PREP=llm_prep)
    codes = []
    for task_id in (0, 1):
        task_env = dict(env, SLURM_ARRAY_TASK_ID=str(task_id), SLURM_ARRAY_TASK_COUNT="2")
        result = subprocess.run(
            ["bash", SLURM / "json2bin-array.sbatch"],
            env=task_env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        codes.append(result.returncode)
    assert codes == [0, 2]
    merge = subprocess.run(
        ["bash", SLURM / "json2bin-merge.sbatch"], env=env, capture_output=True, text=True, timeout=300
    )
    assert merge.returncode == 2 and "missing shard(s) 1 of 2" in merge.stderr
    assert not (tmp_path / "w_text_document.bin").exists()


def test_submit_script_chains_the_merge_after_the_array(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "sbatch.log"
    fake = bin_dir / "sbatch"
    fake.write_text(
        "#!/bin/bash\n"
        f'echo "$*" >> {shlex.quote(str(log))}\n'
        "n=$(wc -l < " + shlex.quote(str(log)) + ")\n"
        'echo "$((1000 + n));cluster"\n'
    )
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    result = subprocess.run(
        ["bash", SLURM / "json2bin-submit.sh", "16", "--account=proj"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines()
    assert len(calls) == 2
    assert (
        "--array=0-15" in calls[0]
        and "--account=proj" in calls[0]
        and calls[0].endswith("json2bin-array.sbatch")
    )
    assert "--dependency=afterok:1001" in calls[1] and calls[1].endswith("json2bin-merge.sbatch")
    assert "1001 (16 tasks)" in result.stdout and "merge: 1002" in result.stdout


def test_scripts_are_valid_bash():
    for name in ("json2bin-array.sbatch", "json2bin-merge.sbatch", "json2bin-submit.sh"):
        path = SLURM / name
        assert subprocess.run(["bash", "-n", path], capture_output=True).returncode == 0, name
        assert os.access(path, os.X_OK) and path.read_text().startswith("#!/bin/bash\n")
    assert "#SBATCH --array=" in (SLURM / "json2bin-array.sbatch").read_text()
    assert Path(SLURM / "json2bin-merge.sbatch").read_text().count("#SBATCH --array") == 0
