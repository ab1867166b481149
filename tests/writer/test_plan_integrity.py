"""A plan is trusted only while it is the same plan (real llm-train processes): an edited mix.json, index
arrays of another plan, a source re-tokenized in place, a sidecar naming another tokenizer, a mix rebuilt
in place under a resumed run. Each is refused with one line naming the file, before anything is written."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.writer.conftest import cli, records, run, snapshot, train_args, write_config

pytestmark = pytest.mark.slow


def _make_mix(folder: Path, byte_mix: Path, seed: int = 1234, weights=(0.7, 0.3), name="mix.json") -> Path:
    """Private copies of the two byte sources and a mix of them in ``folder`` (safe to tamper with)."""
    from llmtools.data import mix as mixlib

    folder.mkdir(parents=True, exist_ok=True)
    for stem in ("shakespeare_text_document", "wiki_text_document"):
        for ext in (".bin", ".idx", ".json"):
            if not (folder / f"{stem}{ext}").exists():
                shutil.copy2(byte_mix.parent / f"{stem}{ext}", folder / f"{stem}{ext}")
    config = mixlib.MixConfig(
        blend=mixlib.Blend([str(folder / "shakespeare_text_document"), str(folder / "wiki_text_document")],
                           list(weights)),
        seq_length=32, num_samples=400, split="100,0,0", seed=seed,
    )  # fmt: skip
    mixlib.save_plan(mixlib.build_plan(config), folder / name)
    return folder / name


def _refused(tmp_path: Path, mix: Path) -> str:
    """llm-train on ``mix`` from scratch: exit 2, one line, no traceback, no run folder, data untouched."""
    config = write_config(tmp_path / "train.yaml", mix)
    before = snapshot(mix.parent)
    done = run(train_args(config, tmp_path / "run"))
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()
    assert snapshot(mix.parent) == before
    return lines[0]


def _edit(mix: Path, edit) -> None:
    data = json.loads(mix.read_text())
    edit(data)
    mix.write_text(json.dumps(data, indent=2))


def test_weights_edited_in_mix_json_are_refused(tmp_path, byte_mix):
    mix = _make_mix(tmp_path / "data", byte_mix)

    def to_5_5(data):
        for comp in data["splits"]["train"]["components"]:
            comp["weight"] = 5.0
        for source in data["sources"]:
            source["weight"] = 5.0

    _edit(mix, to_5_5)
    assert _refused(tmp_path, mix) == (
        f"llm-train: error: {mix}[splits.train.components[0].weight]: 5.0, but the plan was built with 0.7 "
        "(config blend weights [0.7, 0.3]): edited after llm-mix wrote it; run llm-mix again"
    )


def test_an_edit_that_agrees_with_itself_is_still_refused(tmp_path, byte_mix):
    """Weights edited everywhere, consistently: the config no longer gives the plan hash of the arrays."""
    mix = _make_mix(tmp_path / "data", byte_mix)

    def everywhere(data):
        data["config"]["blend"]["weights"] = [5.0, 5.0]
        for comp in data["splits"]["train"]["components"]:
            comp.update(weight=5.0, normalized_weight=0.5)
        for source in data["sources"]:
            source.update(weight=5.0, normalized_weight=0.5)

    _edit(mix, everywhere)
    message = _refused(tmp_path, mix)
    assert message.startswith(f"llm-train: error: {mix}[cache.hash]: ")
    assert "but its config and sources give plan " in message and "edited after llm-mix wrote it" in message


def test_index_arrays_of_another_plan_are_refused(tmp_path, byte_mix):
    mix = _make_mix(tmp_path / "data", byte_mix)
    other = _make_mix(tmp_path / "other", byte_mix, seed=99)
    name = json.loads(mix.read_text())["cache"]["files"]["train"]["0.shuffle_index"]
    theirs = json.loads(other.read_text())["cache"]["files"]["train"]["0.shuffle_index"]
    shutil.copy(other.parent / theirs, mix.parent / name)  # a stale array under the name mix.json points to
    assert _refused(tmp_path, mix) == (
        f"llm-train: error: {mix.parent / name}: not the index array {mix} was made with (its size or sha256 "
        "differs from cache.digests.train[0.shuffle_index]: left from another plan?); remove it to have it "
        "rebuilt, or run llm-mix again"
    )


def test_a_source_retokenized_in_place_is_refused(tmp_path, byte_mix):
    from tests.conftest import shared
    from tests.train.conftest import write_byte_prefix

    mix = _make_mix(tmp_path / "data", byte_mix)
    prefix = mix.parent / "shakespeare_text_document"
    size = prefix.with_suffix(".idx").stat().st_size
    write_byte_prefix(shared("tinyshakespeare/input.jsonl"), prefix, 300)  # other documents, same names
    new_size = prefix.with_suffix(".idx").stat().st_size
    assert _refused(tmp_path, mix) == (
        f"llm-train: error: {prefix}.idx: changed since {mix} was made (size {size} -> {new_size}): "
        "re-tokenized or replaced in place; run llm-mix again"
    )


def test_same_size_other_tokens_is_refused(tmp_path, byte_mix):
    mix = _make_mix(tmp_path / "data", byte_mix)
    binary = mix.parent / "shakespeare_text_document.bin"
    tokens = np.fromfile(binary, dtype=np.uint16)
    tokens[:64] = tokens[:64][::-1]
    tokens.tofile(binary)
    stat = binary.stat()
    os.utime(binary, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert _refused(tmp_path, mix) == (
        f"llm-train: error: {binary}: changed since {mix} was made (same size, other content (sampled sha256 "
        "differs)): re-tokenized or replaced in place; run llm-mix again"
    )


def test_a_sidecar_naming_another_tokenizer_is_refused(tmp_path, byte_mix):
    mix = _make_mix(tmp_path / "data", byte_mix)
    sidecar = mix.parent / "wiki_text_document.json"
    data = json.loads(sidecar.read_text())
    data["tokenizer"].update(name="gpt2", vocab_size=50257, hash="sha256:0123")
    sidecar.write_text(json.dumps(data))
    message = _refused(tmp_path, mix)
    assert message.startswith(
        f"llm-train: error: {sidecar}: names tokenizer 'gpt2' (50257 ids, sha256:0123), but "
    )
    assert message.endswith(": the data or its sidecar changed; run llm-mix again")


def test_a_sidecar_that_never_described_its_data_stops_at_the_first_batch(tmp_path, byte_mix):
    """The sidecar claimed a 100-id tokenizer from the start (llm-mix believed it): the first batch with a
    larger id stops the run with exit 2 naming the .bin, not an index error inside the embedding."""
    folder = tmp_path / "data"
    folder.mkdir()
    for stem in ("shakespeare_text_document", "wiki_text_document"):
        for ext in (".bin", ".idx"):
            shutil.copy2(byte_mix.parent / f"{stem}{ext}", folder / f"{stem}{ext}")
        data = json.loads((byte_mix.parent / f"{stem}.json").read_text())
        data["tokenizer"].update(vocab_size=100, hash="sha256:small")
        (folder / f"{stem}.json").write_text(json.dumps(data))
    mix = _make_mix(folder, byte_mix)
    config = write_config(tmp_path / "train.yaml", mix)
    done = run(train_args(config, tmp_path / "run"))
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("llm-train: error: ") and ".bin: token id " in last
    assert last.endswith(
        "is outside the 100 ids of the tokenizer its sidecar names: the sidecar does not describe this data"
    )
    assert "Traceback" not in done.stderr


def test_a_mix_rebuilt_in_place_is_continued_and_said_so(tmp_path, byte_mix):
    """A run trained on mix.json; llm-mix --force rebuilds it in place with other weights and seed; the resume
    sees another plan under the same path and continues it by the data ledger's rules, announced (never
    silently): every source at its cursor, the new weights from the resumed sample on."""
    mix = _make_mix(tmp_path / "data", byte_mix)
    config = write_config(tmp_path / "train.yaml", mix, training={"train_steps": 2})
    run_dir = tmp_path / "run"
    first = run(train_args(config, run_dir))
    assert first.returncode == 0, first.stderr[-3000:]
    rebuilt = run([*cli("mix"), mix.parent / "shakespeare_text_document", mix.parent / "wiki_text_document",
                   "--weights", "0.5,0.5", "--seed", "7", "--seq-length", "32", "--num-samples", "400",
                   "--split", "100,0,0", "-o", mix, "--force"])  # fmt: skip
    assert rebuilt.returncode == 0, rebuilt.stderr
    done = run(train_args(config, run_dir, 2, "--resume", "auto", "--set", "training.train_steps=4"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resume: data.plan: " in done.stderr and "continued by the data ledger" in done.stderr
    assert "data: the mix changed at sample 16: now " in done.stderr
    assert "shakespeare_text_document: continues at sample" in done.stderr
    assert "wiki_text_document: continues at sample" in done.stderr
    events = [e for e in records(run_dir, "event") if e["event"] == "data"]
    assert [e["change"] for e in events] == ["continued"]
