"""A quarantine decided mid-run takes effect at once, exactly as a resume from that step applies it.

Real ``llm-train`` processes: a poisoned document (its tokens' embedding row is NaN in the init weights)
is drawn at step Q, where the health gate skips the update and quarantines it, and drawn again by the
plan after the stop at Q + 1. The uninterrupted run must pass over it from Q on, as the run stopped at
Q + 1 and resumed does: losses and final weights bitwise equal. A running job that kept reading the
document would meet the NaN again where the resumed run reads other samples."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.train.conftest import TINY
from tests.train.test_exactness import (
    STEPS,
    check,
    check_stopped,
    events,
    llm_train,
    losses,
    weights,
    write_config,
)

SEQ, GBS = 64, 8  # write_config's global batch
POISON = 255  # byte 0xFF: valid UTF-8 text never holds it; the init weights' embedding row for it is NaN
BOUND = 300  # seconds per process


@pytest.fixture(scope="module")
def poisoned(byte_data, tmp_path_factory):
    """A mix of shakespeare and a small source holding one long poisoned document among clean ones,
    init weights that make any sample reading the poison NaN (and no other), and the steps the plan
    draws the poisoned document at."""
    import torch

    from llmtools.data import mix as M
    from llmtools.data.reconcile import open_run_data
    from llmtools.data.train_streams import TrainStreams
    from llmtools.formats.indexed import IndexedDatasetReader, IndexedDatasetWriter
    from llmtools.formats.sidecar import read_sidecar, write_sidecar
    from llmtools.model import LlamaForCausalLM, load_model_config
    from llmtools.model.hf import save_hf_folder

    folder = tmp_path_factory.mktemp("quarantine-in-flight")
    clean_prefix = byte_data["prefixes"][0]
    clean = IndexedDatasetReader(clean_prefix)
    prefix, doc = folder / "poisoned", 3
    with IndexedDatasetWriter(prefix, np.uint16, durable=False) as writer:
        for j in range(24):
            if j == doc:
                writer.add_document(np.full(4 * SEQ, POISON, dtype=np.uint16))
            else:
                writer.add_document(np.asarray(clean.document(j)))
    write_sidecar(prefix, read_sidecar(clean_prefix))
    config = M.MixConfig(blend=M.Blend([clean_prefix, str(prefix)], [0.5, 0.5]), seq_length=SEQ,
                         num_samples=STEPS * GBS, split="100,0,0")  # fmt: skip
    mix = folder / "mix.json"
    M.save_plan(M.build_plan(config), mix)
    run_data, _ = open_run_data(TrainStreams.from_mix(str(mix)), None, 0)
    steps = sorted(
        {
            p // GBS + 1
            for p, d in enumerate(run_data.describe(range(STEPS * GBS)))
            if d["source"] == "poisoned" and any(x["document"] == doc for x in d["documents"])
        }
    )
    model_config = load_model_config({**load_model_config("tiny").to_dict(), **TINY})
    torch.manual_seed(0)
    model = LlamaForCausalLM(model_config)
    with torch.no_grad():
        model.model.embed_tokens.weight[POISON] = float("nan")
    init = save_hf_folder(model, model_config, folder / "nan-init")
    return {"mix": str(mix), "doc": doc, "steps": steps, "init": str(init)}


def test_a_quarantine_in_flight_is_applied_as_a_resume_applies_it(poisoned, tmp_path):
    first, later = poisoned["steps"][0], poisoned["steps"][1:]
    stop = first + 1
    # the plan draws the document again after the stop: only the in-flight quarantine passes over it there
    assert stop < STEPS and any(stop < s <= STEPS for s in later), poisoned["steps"]
    settings = {"model": {"init_from": poisoned["init"]}, "health": {"nan_action": "skip"}}
    config = write_config(tmp_path / "train.yaml", poisoned["mix"], settings)
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    check(llm_train(config, full, timeout=BOUND), "the uninterrupted run")
    stopped = llm_train(config, resumed, stop_at=stop, timeout=BOUND)
    check_stopped(stopped)
    assert b"stopped by SIGTERM" in stopped.stderr and max(losses(resumed)) == stop
    check(llm_train(config, resumed, "--resume", "auto", timeout=BOUND), "the resumed run")
    assert_bitwise(full, resumed)
    # one skipped step and one quarantine, at the first draw, before the stop: never met again
    assert events(full, "nan", "quarantine") == [(first, "nan"), (first, "quarantine")], events(full)
    records = [json.loads(line) for line in (full / "quarantine.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [first]
    named = [s for r in records for s in r["samples"]]
    assert named and all(poisoned["doc"] in {d["document"] for d in s["documents"]} for s in named)


def assert_bitwise(full, resumed) -> None:
    """Losses and final weights bitwise equal, the poison's NaN embedding row included (NaN != NaN for
    ``torch.equal``, so the weights are compared as bytes); no other weight is NaN."""
    import torch

    def bits(tensor):
        return tensor.detach().contiguous().reshape(-1).view(torch.uint8)

    assert losses(resumed) == losses(full)  # the same floats, step by step
    final = f"checkpoints/step_{STEPS:08d}"
    a, b = weights(full / final), weights(resumed / final)
    assert a.keys() == b.keys()
    different = [name for name in a if not torch.equal(bits(a[name]), bits(b[name]))]
    assert not different, f"weights differ after the resume: {different[:5]}"
    embedding = a["model.embed_tokens.weight"]
    assert [name for name, t in a.items() if not torch.isfinite(t).all()] == ["model.embed_tokens.weight"]
    assert torch.isnan(embedding[POISON]).all() and torch.isfinite(embedding[:POISON]).all()
