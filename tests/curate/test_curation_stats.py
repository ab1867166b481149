"""The stats file: built and read back; an untrusted one is refused in one line naming what is wrong;
provenance ties a stats file to the bytes json2bin read, through a chain of stages."""

from __future__ import annotations

import json

import pytest

from llmtools.errors import InputError
from llmtools.formats.curation_stats import build_stats, provenance, read_stats

SHA_A, SHA_B, SHA_C = "a" * 64, "b" * 64, "c" * 64


def stats(command="filter", read=SHA_A, wrote=SHA_B) -> dict:
    return build_stats(
        command=command, steps=[{"name": "language", "params": {}}],
        inputs=[{"path": "raw.jsonl", "size": 10, "sha256": read}], shard=None,
        output={"path": "clean.jsonl", "bytes": 5, "sha256": wrote}, removed="clean.jsonl.removed",
        documents={"in": 4, "kept": 3, "removed": 1, "changed": 0},
        characters={"in": 100, "kept": 90, "removed": 10}, skipped={},
        rules={"language.not_wanted": {"documents": 1, "characters": 10}}, changes={},
    )  # fmt: skip


def test_round_trip_and_shares(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(stats()))
    back = read_stats(path)
    assert back["rules"]["language.not_wanted"] == {
        "documents": 1,
        "characters": 10,
        "share": 0.25,
        "character_share": 0.1,
    }


@pytest.mark.parametrize(
    "edit,words",
    [
        (lambda s: s.update(format="other"), "format is 'other'"),
        (lambda s: s.update(version=3), "version 3"),
        (lambda s: s["documents"].update(kept=-1), "documents.kept: expected a count"),
        (lambda s: s["documents"].update(kept=1), "kept + removed is not in"),
        (lambda s: s["output"].update(sha256="zz"), "output.sha256"),
        (lambda s: s["rules"]["language.not_wanted"].update(share=2), "share from 0 to 1"),
        (
            lambda s: s["rules"].update(
                x={"documents": 1, "characters": 0, "share": 0, "character_share": 0}
            ),
            "do not add up",
        ),
        (lambda s: s.update(command="rm -rf"), "command: expected one of"),
    ],
)
def test_bad_files_are_refused_in_one_line(tmp_path, edit, words):
    record = stats()
    edit(record)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(record))
    with pytest.raises(InputError, match="not a curation stats file") as caught:
        read_stats(path)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_unreadable_json_and_nan_are_refused(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('{"format": NaN}')
    with pytest.raises(InputError, match="not valid JSON"):
        read_stats(path)


def test_provenance_follows_a_chain_of_stages():
    filtered, deduped = stats("filter", SHA_A, SHA_B), stats("dedup", SHA_B, SHA_C)
    block = provenance(
        [("f.json", filtered), ("d.json", deduped)], [{"path": "-", "size": 1, "sha256": SHA_C}]
    )
    assert [b["command"] for b in block] == ["filter", "dedup"]
    with pytest.raises(InputError, match="f.json: describes the output clean.jsonl"):
        provenance([("f.json", filtered)], [{"path": "-", "size": 1, "sha256": SHA_C}])
