"""``llm-prep merge``: Megatron's merge_datasets.py bytes (checked against megatron-core's own builder),
bounded-memory streaming, merged sidecars, and every refusal through the real command.

megatron-core's ``IndexedDatasetBuilder.add_index`` + ``finalize`` is exactly what Megatron-LM's
``tools/merge_datasets.py`` calls for each prefix in turn; importing it costs ~6 s once per module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from llmtools.errors import InputError, UsageError
from llmtools.formats.indexed import HEADER_SIZE, IndexedDatasetReader, IndexedDatasetWriter
from llmtools.formats.sidecar import read_sidecar, write_sidecar
from llmtools.prep.merge import merge
from tests.conftest import REPO

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed" on CPU
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder


def make_dataset(
    prefix: Path, rng, dtype=np.uint16, docs: int | None = None, sidecar: dict | None = None
) -> Path:
    """Random documents: some empty, some of several sentences, lengths from 0 to 80."""
    high = 60_000 if np.dtype(dtype) == np.uint16 else 2**31 - 1
    with IndexedDatasetWriter(prefix, dtype, durable=False) as writer:
        for j in range(int(rng.integers(0, 40)) if docs is None else docs):
            n = int(rng.integers(0, 80))
            if j % 5 == 4 and n:
                writer.add_document(rng.integers(0, high, 2 * n), [n, n])
            else:
                writer.add_document(rng.integers(0, high, n))
    if sidecar is not None:
        write_sidecar(prefix, sidecar)
    return prefix


def megatron_merge(prefixes, out: Path, dtype) -> Path:
    """What tools/merge_datasets.py does with the same datasets in the same order."""
    builder = IndexedDatasetBuilder(f"{out}.bin", dtype=dtype)
    for prefix in prefixes:
        builder.add_index(str(prefix))
    builder.finalize(f"{out}.idx")
    return out


def same_files(a, b) -> bool:
    return all(Path(f"{a}{s}").read_bytes() == Path(f"{b}{s}").read_bytes() for s in (".bin", ".idx"))


def sidecar_for(tokenizer_hash: str, key: str = "text") -> dict:
    return {
        "format": "llmtools.indexed-sidecar",
        "version": 1,
        "tool": "test",
        "created": "2026-01-01T00:00:00+00:00",
        "tokenizer": {
            "kind": "byte",
            "source": "byte",
            "name": "t",
            "hash": tokenizer_hash,
            "vocab_size": 257,
            "eod_id": 256,
            "bos_id": None,
        },
        "json_key": key,
        "append_eod": True,
        "dtype": "uint16",
        "special_tokens": "auto",
        "inputs": [{"path": f"{key}.jsonl", "size": 1, "sha256": "0" * 64}],
        "counts": {
            "documents": 0,
            "sequences": 0,
            "tokens": 0,
            "empty_documents": 0,
            "skipped": {"blank_line": 1},
        },
    }


def prep(args, env, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "llmtools.cli.prep", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        cwd=cwd or REPO,
        timeout=300,
    )


# -- the bytes ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.uint16, np.int32], ids=["uint16", "int32"])
def test_merge_equals_megatron_core_add_index(tmp_path, dtype):
    rng = np.random.default_rng(7)
    # (few parts: megatron-core's add_index runs gc.collect() each time, ~0.5 s with torch imported)
    prefixes = [make_dataset(tmp_path / f"part{k:02d}", rng, dtype) for k in range(5)]
    prefixes.insert(3, make_dataset(tmp_path / "only-empty-docs", rng, dtype, docs=3))  # empty docs only
    # ... and one with no document at all
    with IndexedDatasetWriter(tmp_path / "nothing", dtype, durable=False):
        pass
    prefixes.insert(5, tmp_path / "nothing")
    result = merge([str(p) for p in prefixes], str(tmp_path / "ours"), durable=False)
    megatron_merge(prefixes, tmp_path / "theirs", dtype)
    assert same_files(tmp_path / "ours", tmp_path / "theirs")
    ours = IndexedDatasetReader(tmp_path / "ours")
    ours.validate()
    assert (
        result.documents == ours.num_documents == sum(IndexedDatasetReader(p).num_documents for p in prefixes)
    )
    assert result.tokens == ours.num_tokens
    assert result.paths == [f"{tmp_path}/ours.bin", f"{tmp_path}/ours.idx"]  # no sidecars in, none out


def test_streaming_in_small_chunks_gives_the_same_bytes(tmp_path):
    """Chunk boundaries inside the lengths and document indices must not show in the output."""
    rng = np.random.default_rng(3)
    prefixes = [make_dataset(tmp_path / f"p{k}", rng, docs=50) for k in range(3)]
    with IndexedDatasetWriter(tmp_path / "chunked", np.uint16, durable=False) as writer:
        for prefix in prefixes:
            added = writer.add_index(IndexedDatasetReader(prefix), chunk=7)
            assert added["documents"] == 50
    megatron_merge(prefixes, tmp_path / "theirs", np.uint16)
    assert same_files(tmp_path / "chunked", tmp_path / "theirs")


def test_globs_lists_and_order(tmp_path):
    rng = np.random.default_rng(11)
    for name in ("b", "a", "c-1", "c"):
        make_dataset(tmp_path / "shards" / name, rng, docs=5)
    megatron_merge([tmp_path / "shards" / n for n in ("a", "b", "c", "c-1")], tmp_path / "sorted", np.uint16)
    merge([str(tmp_path / "shards" / "*")], str(tmp_path / "glob"), durable=False)  # sorted by prefix
    assert same_files(tmp_path / "glob", tmp_path / "sorted")
    listing = tmp_path / "list.txt"
    listing.write_text(f"# order as listed\n{tmp_path}/shards/c.idx\n\n{tmp_path}/shards/a\n")
    merge([f"@{listing}", str(tmp_path / "shards" / "b.bin")], str(tmp_path / "listed"), durable=False)
    megatron_merge([tmp_path / "shards" / n for n in ("c", "a", "b")], tmp_path / "given", np.uint16)
    assert same_files(tmp_path / "listed", tmp_path / "given")
    with pytest.raises(InputError, match="named twice"):
        merge(
            [str(tmp_path / "shards/a"), str(tmp_path / "shards/b"), str(tmp_path / "shards/a.idx")],
            str(tmp_path / "x"),
        )
    # adjacent names of two files of one dataset are one dataset; the same name twice is a repeat
    merge(
        [str(tmp_path / "shards/a.bin"), str(tmp_path / "shards/a.idx")], str(tmp_path / "one"), durable=False
    )
    for twice in (["a", "a"], ["a.idx", "a.idx"], ["a", "./a"], ["a", "a.bin"]):
        with pytest.raises(InputError, match="named twice"):
            merge([os.path.join(tmp_path, "shards", name) for name in twice], str(tmp_path / "x"))
    with pytest.raises(UsageError, match="both an input and the output"):
        merge([str(tmp_path / "shards/a")], str(tmp_path / "shards/a"), force=True)


def test_merged_sidecar_and_staged_merge(tmp_path, cli_env):
    """Shards of a json2bin --shard run: a staged merge (--partial) then the rest gives the one-shot bytes;
    the sidecar sums counts, keeps every input and records which shards it holds."""
    rng = np.random.default_rng(5)
    plan = "ab" * 8
    shards = []
    for i in range(4):
        side = sidecar_for("sha256:" + "1" * 64)
        side["shard"] = {"index": i, "count": 4, "plan": plan}
        side["inputs"] = [{"path": f"in{i}.jsonl", "size": i, "sha256": f"{i}" * 64}]
        shards.append(make_dataset(tmp_path / f"web-{i:05d}-of-00004", rng, docs=10 + i, sidecar=side))
    one = prep(["merge", f"{tmp_path}/web-*-of-00004", "-o", tmp_path / "all", "--json", "-q"], cli_env)
    assert one.returncode == 0, one.stderr
    summary = json.loads(one.stdout)
    assert summary["documents"] == 10 + 11 + 12 + 13 and summary["paths"][-1] == f"{tmp_path}/all.json"
    side = read_sidecar(tmp_path / "all")
    assert side["counts"]["documents"] == 46 and side["counts"]["skipped"] == {"blank_line": 4}
    assert [e["path"] for e in side["inputs"]] == ["in0.jsonl", "in1.jsonl", "in2.jsonl", "in3.jsonl"]
    assert side["shards"] == [{"plan": plan, "json_key": "text", "count": 4, "ranges": [[0, 4]]}]
    assert [m["prefix"] for m in side["merged"]["from"]] == [str(p) for p in shards]
    assert side["tokenizer"]["hash"] == "sha256:" + "1" * 64
    schema = json.loads((REPO / "schemas" / "sidecar.schema.json").read_text())
    import jsonschema

    jsonschema.validate(side, schema)
    # staged: shards 1 and 3 first (partial), then with 0 and 2 -- in shard order the bytes are the same
    first = prep(["merge", shards[0], shards[1], "-o", tmp_path / "stage01", "--partial", "-q"], cli_env)
    assert first.returncode == 0, first.stderr
    assert read_sidecar(tmp_path / "stage01")["shards"][0]["ranges"] == [[0, 2]]
    rest = prep(
        ["merge", tmp_path / "stage01", shards[2], shards[3], "-o", tmp_path / "staged", "-q"], cli_env
    )
    assert rest.returncode == 0, rest.stderr
    assert same_files(tmp_path / "staged", tmp_path / "all")
    assert read_sidecar(tmp_path / "staged")["shards"][0]["ranges"] == [[0, 4]]
    shuffled = prep(
        ["merge", shards[1], shards[0], shards[2], shards[3], "-o", tmp_path / "shuffled"], cli_env
    )
    assert shuffled.returncode == 0 and "not in shard order" in shuffled.stderr


def test_megatron_spelling_input_dir(tmp_path, cli_env):
    rng = np.random.default_rng(2)
    folder = tmp_path / "in dir[1]"  # glob characters in the folder name are taken literally
    for name in ("x", "y"):
        make_dataset(folder / name, rng, docs=4)
    result = prep(["merge", "--input", folder, "--output-prefix", tmp_path / "out"], cli_env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"{tmp_path}/out.bin", f"{tmp_path}/out.idx"]
    megatron_merge([folder / "x", folder / "y"], tmp_path / "theirs", np.uint16)
    assert same_files(tmp_path / "out", tmp_path / "theirs")


# -- refusals: exit 2, one line naming the offender, nothing written -----------------------------------
def _thousand(folder: Path) -> None:
    rng = np.random.default_rng(0)
    for k in range(1000):
        make_dataset(folder / f"s{k:04d}", rng, docs=2)


def _case_corrupt_among_1000(folder: Path) -> tuple[list, str]:
    """A middle byte pointer that is not the running sum of the lengths: the header, the sizes and the
    .bin length stay valid, so only the full check while streaming (after 617 datasets) can see it."""
    _thousand(folder)
    with IndexedDatasetWriter(folder / "s0617", np.uint16, durable=False) as writer:
        for n in (3, 4, 5):
            writer.add_document(np.arange(n))
    with open(folder / "s0617.idx", "r+b") as handle:
        handle.seek(HEADER_SIZE + 4 * 3 + 8 * 1)
        handle.write(np.int64(4).tobytes())  # 6 is right
    return [f"{folder}/s*"], "s0617.idx@byte 54: pointer of sequence 1 is 4, expected 6"


def _case_truncated_bin(folder: Path) -> tuple[list, str]:
    rng = np.random.default_rng(1)
    make_dataset(folder / "a", rng, docs=5)
    make_dataset(folder / "b", rng, docs=5)
    data = (folder / "b.bin").read_bytes()
    (folder / "b.bin").write_bytes(data[:-2])
    return [folder / "a", folder / "b"], "b.bin@byte"


def _case_missing_shard(folder: Path) -> tuple[list, str]:
    rng = np.random.default_rng(1)
    for i in (0, 2):
        side = sidecar_for("sha256:" + "1" * 64)
        side["shard"] = {"index": i, "count": 3, "plan": "f" * 16}
        make_dataset(folder / f"w-{i}", rng, docs=3, sidecar=side)
    return [f"{folder}/w-*"], "missing shard(s) 1 of 3"


def _case_shard_twice(folder: Path) -> tuple[list, str]:
    rng = np.random.default_rng(1)
    for name in ("w-0", "copy-of-w-0"):
        side = sidecar_for("sha256:" + "1" * 64)
        side["shard"] = {"index": 0, "count": 1, "plan": "f" * 16}
        make_dataset(folder / name, rng, docs=3, sidecar=side)
    return [folder / "w-0", folder / "copy-of-w-0"], "shard 0/1 is also in"


def _case_mixed_tokenizers(folder: Path) -> tuple[list, str]:
    rng = np.random.default_rng(1)
    make_dataset(folder / "a", rng, docs=3, sidecar=sidecar_for("sha256:" + "1" * 64))
    make_dataset(folder / "b", rng, docs=3, sidecar=sidecar_for("sha256:" + "1" * 64))
    make_dataset(folder / "c", rng, docs=3, sidecar=sidecar_for("sha256:" + "2" * 64))
    return [folder / "a", folder / "b", folder / "c"], "c: tokenized with"


def _case_mixed_dtypes(folder: Path) -> tuple[list, str]:
    rng = np.random.default_rng(1)
    make_dataset(folder / "a", rng, np.uint16, docs=3)
    make_dataset(folder / "b", rng, np.int32, docs=3)
    return [folder / "a", folder / "b"], "b: token dtype int32, but"


def _case_empty_list(folder: Path) -> tuple[list, str]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "list.txt").write_text("# nothing yet\n\n")
    return [f"@{folder}/list.txt"], "list.txt: the list file names nothing"


def _case_missing_dataset(folder: Path) -> tuple[list, str]:
    make_dataset(folder / "a", np.random.default_rng(1), docs=3)
    return [folder / "a", folder / "gone"], "gone.idx: no such file"


def _case_glob_matches_nothing(folder: Path) -> tuple[list, str]:
    folder.mkdir(parents=True, exist_ok=True)
    return [f"{folder}/nothing-*"], "no dataset matches this pattern"


def _case_bad_sidecar(folder: Path) -> tuple[list, str]:
    make_dataset(folder / "a", np.random.default_rng(1), docs=3)
    (folder / "a.json").write_text("{not json")
    return [folder / "a"], "a.json: not a valid sidecar"


REFUSALS = {
    "corrupt index among 1,000": _case_corrupt_among_1000,
    "truncated .bin": _case_truncated_bin,
    "missing shard": _case_missing_shard,
    "shard given twice": _case_shard_twice,
    "mixed tokenizers": _case_mixed_tokenizers,
    "mixed dtypes": _case_mixed_dtypes,
    "list file naming nothing": _case_empty_list,
    "missing dataset": _case_missing_dataset,
    "glob matching nothing": _case_glob_matches_nothing,
    "corrupt sidecar": _case_bad_sidecar,
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusals_exit_2_and_write_nothing(tmp_path, cli_env, case):
    inputs, words = REFUSALS[case](tmp_path / "in")
    before = sorted(p.name for p in (tmp_path / "in").iterdir())
    out = tmp_path / "out" / "merged"
    result = prep(["merge", *inputs, "-o", out], cli_env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llm-prep: error: "), result.stderr
    assert words in lines[0], lines[0]
    assert "Traceback" not in result.stderr
    out_dir = tmp_path / "out"
    written = sorted(p.name for p in out_dir.iterdir() if p.suffix != ".lock") if out_dir.exists() else []
    assert written == [], f"left behind: {written}"  # (the writer's lock file may stay, as for every command)
    assert sorted(p.name for p in (tmp_path / "in").iterdir()) == before  # inputs untouched


def test_existing_output_needs_force(tmp_path, cli_env):
    make_dataset(tmp_path / "a", np.random.default_rng(1), docs=3)
    assert prep(["merge", tmp_path / "a", "-o", tmp_path / "m", "-q"], cli_env).returncode == 0
    again = prep(["merge", tmp_path / "a", "-o", tmp_path / "m"], cli_env)
    assert again.returncode == 2 and "already exists (use --force" in again.stderr
    assert prep(["merge", tmp_path / "a", "-o", tmp_path / "m", "--force", "-q"], cli_env).returncode == 0
