"""An ``.idx`` whose header is fine but whose lengths, pointers or document index are wrong is refused by every
command on open (exit 2 naming the file and byte offset): llm-mix no longer plans 2.1 billion tokens from
it, llm-export and llm-train no longer die of SIGSEGV, llm-prep cat no longer prints the wrong document.
"""

from __future__ import annotations

import json
import shutil
import struct

import pytest

from llmtools.formats.indexed import HEADER_SIZE, IndexedDatasetReader
from tests.trust.conftest import TRAIN_YAML, cli, error_line

CASES = {
    # (what, byte offset in .idx as a function of S, packed value)
    "huge-length": (lambda s: HEADER_SIZE + 4 * 5, struct.pack("<i", 2**31 - 1)),
    "overlapping-pointers": (lambda s: HEADER_SIZE + 4 * s + 8 * 7, None),  # pointer 7 := pointer 6
    "document-index-backwards": (lambda s: HEADER_SIZE + 12 * s + 8 * 10, struct.pack("<q", 0)),
}
EXPECT = {
    "huge-length": "pointer of sequence 6",
    "overlapping-pointers": "pointer of sequence 7",
    "document-index-backwards": "document index 10 is 0",
}


def corrupt(prefix, case: str) -> None:
    reader = IndexedDatasetReader(prefix)
    s = reader.num_sequences
    offset, value = CASES[case][0](s), CASES[case][1]
    if value is None:
        value = struct.pack("<q", int(reader.sequence_pointers[6]))
    del reader
    with open(f"{prefix}.idx", "r+b") as handle:
        handle.seek(offset)
        handle.write(value)


@pytest.fixture
def data(trust_data, tmp_path):
    folder = tmp_path / "data"
    shutil.copytree(trust_data["folder"], folder)
    mix = folder / "mix.json"
    plan = json.loads(mix.read_text())
    plan["sources"][0]["prefix"] = str(folder / "shk_text_document")  # the copy, not the original
    mix.write_text(json.dumps(plan))
    return {"prefix": folder / "shk_text_document", "mix": mix, "folder": folder}


@pytest.mark.parametrize("case", list(CASES))
def test_every_command_refuses_a_corrupt_index(data, env, tmp_path, train_files, case):
    prefix = data["prefix"]
    corrupt(prefix, case)
    runs = {
        "mix": ("mix", prefix, "--seq-length", "32", "--num-samples", "100", "-o", tmp_path / "m.json"),
        "export": ("export", "hf", prefix, "-o", tmp_path / "hf", "--packed", "--seq-length", "16"),
        "cat": ("prep", "cat", prefix, "--docs", "10", "-t", "byte"),
        "inspect": ("prep", "inspect", prefix, "--no-validate"),
    }
    if case == "huge-length":  # one llm-train, on the prefix itself (a mix notices the .idx changed first)
        _, ds = train_files
        config = tmp_path / "t.yaml"
        config.write_text(TRAIN_YAML.replace("{mix: MIX}", f"{{prefixes: [{prefix}], seq_length: 32}}"))
        runs["train"] = ("train", config, "--deepspeed", ds, "-o", tmp_path / "run")
    for name, args in runs.items():
        proc = cli(*args, env=env)
        assert proc.returncode == 2, (name, proc.returncode, proc.stderr[-1500:])
        line = error_line(proc)
        assert "shk_text_document.idx@byte" in line and EXPECT[case] in line, (name, line)
        assert proc.stdout == "", name
    assert not any((tmp_path / p).exists() for p in ("m.json", "hf", "run"))
