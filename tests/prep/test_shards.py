"""``json2bin --shard I/N``: the assignment, the Slurm array variables, bytes that depend only on the
inputs (not on --workers or the backend), and shards merged == one run over all inputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmtools.errors import InputError, UsageError
from llmtools.formats.sidecar import read_sidecar
from llmtools.prep.json2bin import json2bin
from llmtools.prep.shards import ShardSpec, assign, parse_shard, plan_shards, shard_from_environment
from tests.conftest import REPO, shared

GPT2 = "tokenizers/gpt2"


# -- the assignment --------------------------------------------------------------------------------
def test_assignment_is_contiguous_balanced_and_covers_every_shard():
    sizes = [5, 100, 7, 3, 40, 40, 1, 90, 12, 60, 8, 30]
    for count in (1, 2, 3, 5, 12):
        shards = assign(sizes, count)
        assert shards == sorted(shards), "contiguous runs, in input order"
        assert shards[0] == 0 and shards[-1] == count - 1
        loads = [sum(s for s, k in zip(sizes, shards, strict=True) if k == i) for i in range(count)]
        assert max(loads) - sum(sizes) / count <= max(sizes), (count, loads)
    assert assign([10, 10, 10, 10], 2) == [0, 0, 1, 1]
    assert assign([0, 0, 0], 2) == [0, 0, 1]  # empty files: by count
    assert assign([1, 1], 5) == [1, 3]  # more shards than inputs: some shards are empty
    assert assign([], 3) == []


def test_plan_sorts_by_path_and_names_the_run(tmp_path):
    for name, size in (("c.jsonl", 30), ("a.jsonl", 10), ("b.jsonl", 20)):
        (tmp_path / name).write_bytes(b"x" * size)
    paths = [str(tmp_path / n) for n in ("c.jsonl", "a.jsonl", "b.jsonl")]
    plan = plan_shards(paths, ShardSpec(1, 2))
    assert plan.paths == sorted(paths) and plan.sizes == [10, 20, 30]
    assert plan.shards == [0, 0, 1] and plan.mine == [str(tmp_path / "c.jsonl")]
    again = plan_shards(list(reversed(paths)), ShardSpec(0, 2))
    assert again.plan == plan.plan  # every task computes the same run identity
    assert plan.record() | {} == {
        "index": 1,
        "count": 2,
        "plan": plan.plan,
        "assignment": plan.record()["assignment"],
        "inputs": 1,
        "bytes": 30,
        "inputs_total": 3,
        "bytes_total": 60,
    }
    (tmp_path / "a.jsonl").write_bytes(b"y" * 11)  # an input that changed: another run
    assert plan_shards(paths, ShardSpec(0, 2)).plan != plan.plan
    with pytest.raises(UsageError, match="stdin"):
        plan_shards(["-"], ShardSpec(0, 2))
    with pytest.raises(InputError, match="named twice"):
        plan_shards([paths[0], paths[0]], ShardSpec(0, 2))


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, None),
        ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "8"}, (3, 8)),
        ({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "10", "SLURM_ARRAY_TASK_MIN": "1"}, (0, 10)),
        ({"SLURM_ARRAY_TASK_ID": "10", "SLURM_ARRAY_TASK_COUNT": "10", "SLURM_ARRAY_TASK_MIN": "1"}, (9, 10)),
        (
            {
                "SLURM_ARRAY_TASK_ID": "14",
                "SLURM_ARRAY_TASK_COUNT": "6",
                "SLURM_ARRAY_TASK_MIN": "4",
                "SLURM_ARRAY_TASK_STEP": "2",
            },
            (5, 6),
        ),
        (
            {"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "1"},
            "cannot be derived",
        ),
        ({"SLURM_ARRAY_TASK_ID": "x", "SLURM_ARRAY_TASK_COUNT": "3"}, "cannot read"),
    ],
)
def test_slurm_array_variables(env, expected):
    if isinstance(expected, str):
        with pytest.raises(UsageError, match=expected):
            shard_from_environment(env)
        return
    spec = shard_from_environment(env)
    assert (None if spec is None else (spec.index, spec.count)) == expected


def test_parse_shard_and_names():
    assert parse_shard("3/10") == ShardSpec(3, 10) and parse_shard(" none ") is None
    assert ShardSpec(3, 10).suffix == "-00003-of-00010"
    assert ShardSpec(123456, 200000).suffix == "-123456-of-200000"
    for bad in ("3", "10/10", "-1/3", "a/b", "1/0"):
        with pytest.raises(UsageError):
            parse_shard(bad)


# -- the bytes -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Seven JSONL files of real text, of very different sizes (one starts with an empty document)."""
    folder = tmp_path_factory.mktemp("shards-in")
    lines = shared("lambada/lambada_test.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)[:700]
    cuts = [0, 30, 200, 210, 380, 500, 520, 700]
    for k, (lo, hi) in enumerate(zip(cuts, cuts[1:])):  # noqa: B905
        (folder / f"part-{k}.jsonl").write_text("".join(lines[lo:hi]), encoding="utf-8")
    (folder / "part-3.jsonl").write_text('{"text": ""}\n' + "".join(lines[380:400]), encoding="utf-8")
    return folder


def files(prefix) -> tuple[bytes, bytes]:
    return Path(f"{prefix}.bin").read_bytes(), Path(f"{prefix}.idx").read_bytes()


@pytest.mark.parametrize("shard", [1, 2])
def test_shard_bytes_do_not_depend_on_workers_or_backend(tmp_path, corpus, shard):
    """One process, worker processes, gigatoken's threads, small and large work items: the same bytes."""
    vocab = shared(GPT2) / "vocab.json"
    outputs = []
    for k, (workers, backend, chunk) in enumerate(
        [
            (1, "tokenizers", 1 << 20),
            (2, "tokenizers", 4096),
            (2, "gigatoken", 1 << 20),
            (1, "gigatoken", 777),
        ]
    ):
        prefix = tmp_path / f"run{k}"
        result = json2bin(
            [f"{corpus}/*.jsonl"],
            vocab,
            prefix,
            append_eod=True,
            workers=workers,
            backend=backend,
            chunk_bytes=chunk,
            shard=ShardSpec(shard, 3),
            progress=False,
            durable=False,
        )
        assert result.prefixes == [f"{prefix}-{shard:05d}-of-00003_text_document"]
        outputs.append(files(result.prefixes[0]))
        side = read_sidecar(result.prefixes[0])
        assert side["shard"]["index"] == shard and side["shard"]["count"] == 3
    assert all(o == outputs[0] for o in outputs[1:])


def test_shards_merged_equal_one_run(tmp_path, corpus, cli_env):
    """Shards 0..3 of 4 (one of them through the Slurm variables), merged in order == one json2bin run
    over the same glob, byte for byte; the merged sidecar says it holds the whole run."""
    vocab = shared(GPT2) / "vocab.json"
    glob = f"{corpus}/*.jsonl"

    def prep(*args, env=None):
        return subprocess.run(
            [sys.executable, "-m", "llmtools.cli.prep", *map(str, args)],
            env=env or cli_env,
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=300,
        )

    one = prep("json2bin", glob, "-t", vocab, "-o", tmp_path / "one", "--append-eod", "-q", "--workers", "2")
    assert one.returncode == 0, one.stderr
    for i in range(4):
        if i == 2:  # as a Slurm array task (--array=1-4: MIN=1)
            env = dict(cli_env, SLURM_ARRAY_TASK_ID="3", SLURM_ARRAY_TASK_COUNT="4", SLURM_ARRAY_TASK_MIN="1")
            result = prep("json2bin", glob, "-t", vocab, "-o", tmp_path / "web", "--append-eod", env=env)
            assert "shard 2/4 from SLURM_ARRAY_TASK_ID=3" in result.stderr
        else:
            result = prep(
                "json2bin", glob, "-t", vocab, "-o", tmp_path / "web", "--append-eod", "--shard", f"{i}/4"
            )
        assert result.returncode == 0, result.stderr
        assert f"shard {i}/4:" in result.stderr
        assert result.stdout.splitlines()[0] == f"{tmp_path}/web-{i:05d}-of-00004_text_document.bin"
    merged = prep("merge", f"{tmp_path}/web-*-of-00004_text_document", "-o", tmp_path / "merged", "-q")
    assert merged.returncode == 0, merged.stderr
    assert files(tmp_path / "merged") == files(tmp_path / "one_text_document")
    side = read_sidecar(tmp_path / "merged")
    ones = read_sidecar(tmp_path / "one_text_document")
    assert side["inputs"] == ones["inputs"] and side["counts"] == ones["counts"]
    assert side["tokenizer"] == ones["tokenizer"]
    assert side["shards"][0]["count"] == 4 and side["shards"][0]["ranges"] == [[0, 4]]
    # the plan is the same in every shard's sidecar
    plans = {
        read_sidecar(f"{tmp_path}/web-{i:05d}-of-00004_text_document")["shard"]["plan"] for i in range(4)
    }
    assert len(plans) == 1


def test_more_shards_than_inputs_and_list_files(tmp_path, corpus):
    """A shard with no input is an empty dataset (so merge can check the run is complete); inputs may
    come from an @list file."""
    listing = tmp_path / "inputs.txt"
    listing.write_text("\n".join(str(p) for p in sorted(corpus.glob("part-[01].jsonl"))) + "\n")
    spec_count = 5
    written = []
    for i in range(spec_count):
        result = json2bin(
            [f"@{listing}"],
            "byte",
            tmp_path / "t",
            shard=ShardSpec(i, spec_count),
            progress=False,
            durable=False,
        )
        written.append(result)
    sizes = [r.shard["inputs"] for r in written]
    assert sum(sizes) == 2 and sizes.count(0) == 3
    empty = next(r for r in written if r.shard["inputs"] == 0)
    assert empty.documents == 0 and Path(f"{empty.prefixes[0]}.bin").stat().st_size == 0
    from llmtools.prep.merge import merge

    merge([f"{tmp_path}/t-*-of-00005_text_document"], str(tmp_path / "all"), durable=False)
    one = json2bin([f"@{listing}"], "byte", tmp_path / "one", progress=False, durable=False)
    assert files(tmp_path / "all") == files(one.prefixes[0])


def test_refusals(tmp_path, cli_env):
    """stdin cannot be sharded, a list naming nothing and --partitions with --shard are refused (exit 2,
    nothing written); --shard none opts out of a Slurm array's variables."""
    (tmp_path / "empty.txt").write_text("# no inputs yet\n")
    (tmp_path / "a.jsonl").write_text('{"text": "a"}\n')
    for args, words in (
        ([f"@{tmp_path}/empty.txt", "--shard", "0/2"], "the list file names nothing"),
        ([tmp_path / "a.jsonl", "--shard", "0/2", "--partitions", "2"], "--partitions with --shard"),
        ([tmp_path / "a.jsonl", "--shard", "2/2"], "outside 0..1"),
    ):
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "llmtools.cli.prep",
                "json2bin",
                *map(str, args),
                "-t",
                "byte",
                "-o",
                tmp_path / "o",
            ],
            env=cli_env,
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )
        assert result.returncode == 2 and words in result.stderr, result.stderr
        assert not [p for p in tmp_path.glob("o*") if p.suffix != ".lock"]
    _stdin_and_opting_out(tmp_path, cli_env)


def _stdin_and_opting_out(tmp_path, cli_env):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmtools.cli.prep",
            "json2bin",
            "-",
            "-t",
            "byte",
            "-o",
            tmp_path / "x",
            "--shard",
            "0/2",
        ],
        env=cli_env,
        input=b'{"text": "a"}\n',
        capture_output=True,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 2 and b"stdin ('-') cannot be sharded" in result.stderr
    assert not [p for p in tmp_path.glob("x*") if p.suffix != ".lock"]
    env = dict(os.environ, SLURM_ARRAY_TASK_ID="0", SLURM_ARRAY_TASK_COUNT="2")
    env.update(cli_env | {k: v for k, v in env.items() if k.startswith("SLURM")})
    opted_out = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmtools.cli.prep",
            "json2bin",
            "-",
            "-t",
            "byte",
            "-o",
            tmp_path / "y",
            "--shard",
            "none",
            "--json",
        ],
        env=env,
        input=b'{"text": "a"}\n',
        capture_output=True,
        cwd=REPO,
        timeout=120,
    )
    assert opted_out.returncode == 0, opted_out.stderr
    assert json.loads(opted_out.stdout)["shard"] is None
