"""The one dataset-output object every writer uses: a tiny writer built on it gets naming, the lock, the
existence check, the sidecar and the group commit, and leaves nothing when it fails."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llmtools.errors import OutputExistsError
from llmtools.formats.indexed import IndexedDatasetReader
from llmtools.formats.output_marks import marker_path, not_ours
from llmtools.formats.sidecar import build_sidecar
from llmtools.fsutil import TMP_MARK
from llmtools.prep.dataset_output import DatasetOutput


def tiny_writer(prefix: str, documents: list[list[int]], force: bool = False, sidecar: bool = True):
    """A whole dataset writer: what a new command needs of the skeleton."""
    with DatasetOutput([prefix], force=force, clear_stale=True, markable=True) as output:
        writer = output.open(prefix, np.uint16)
        for tokens in documents:
            writer.add_document(tokens)
        if sidecar:
            record = build_sidecar(
                tokenizer={"name": "tiny"}, dtype=np.uint16, inputs=[], documents=writer.num_documents,
                sequences=writer.num_sequences, tokens=writer.num_tokens, json_key="text", append_eod=False,
            )  # fmt: skip
            output.set_sidecar(prefix, record)
        paths = output.commit()
    output.mark("tiny")
    return paths


def test_a_tiny_writer_gets_files_sidecar_and_paths(tmp_path):
    prefix = str(tmp_path / "out")
    paths = tiny_writer(prefix, [[1, 2, 3], [4]])
    assert [p.name for p in paths] == ["out.bin", "out.idx", "out.json"]
    assert IndexedDatasetReader(prefix).num_documents == 2
    assert json.loads((tmp_path / "out.json").read_text())["counts"]["tokens"] == 4
    assert not_ours(tmp_path / "out.bin") is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin", "out.idx", "out.json"]


def test_without_a_sidecar_the_pair_is_marked(tmp_path):
    prefix = str(tmp_path / "out")
    assert [p.name for p in tiny_writer(prefix, [[1]], sidecar=False)] == ["out.bin", "out.idx"]
    assert marker_path(tmp_path / "out.bin").is_file() and not (tmp_path / "out.json").exists()
    assert not_ours(tmp_path / "out.idx") is None
    names = [p.name for p in DatasetOutput([prefix], markable=True).claimed()]
    assert names == ["out.bin", "out.idx", "out.json", "out.bin.llmtools.json", "out.idx.llmtools.json"]


def test_existing_outputs_need_force_and_force_clears_leftovers(tmp_path):
    prefix = str(tmp_path / "out")
    tiny_writer(prefix, [[1]])
    with pytest.raises(OutputExistsError):
        tiny_writer(prefix, [[2]])
    leftover = tmp_path / f"out.bin{TMP_MARK}killed"
    leftover.write_bytes(b"x")
    tiny_writer(prefix, [[2, 3]], force=True)
    assert not leftover.exists() and IndexedDatasetReader(prefix).num_tokens == 2


def test_a_failure_leaves_nothing(tmp_path):
    prefix = str(tmp_path / "out")
    with pytest.raises(RuntimeError, match="boom"):
        with DatasetOutput([prefix], files={tmp_path / "notes.txt": {"kind": "tiny"}}) as output:
            output.open(prefix, np.uint16).add_document([1, 2])
            output.path(tmp_path / "notes.txt").write_text("half")
            raise RuntimeError("boom")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_plain_files_are_committed_together_and_marked(tmp_path):
    files = {tmp_path / name: {"kind": "tiny", "n": i} for i, name in enumerate(["a.jsonl", "b.jsonl"])}
    with DatasetOutput(files=files) as output:
        for path in files:
            output.path(path).write_text("{}\n")
        assert not any(path.exists() for path in files)
        assert output.commit() == list(files)
    assert json.loads(marker_path(tmp_path / "b.jsonl").read_text())["n"] == 1
    assert all(not_ours(path) is None for path in files)
