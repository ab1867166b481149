"""Every loop ends, whatever a run folder holds: a source whose every document is quarantined (reached by
resuming as the stop advises, without editing a file) and a cursor edited to an absurd value are refused
in one line (exit 2) before any compute; a divergence the weights cause (not the data) quarantines
nothing. Real ``llm-train`` processes, each under a time bound (a loop that never ends fails the test)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.train.conftest import TINY
from tests.train.test_exactness import llm_train, write_config

SEQ = 64
POISON = 255  # byte 0xFF: valid UTF-8 text never holds it; the init weights' embedding row for it is NaN
BOUND = 240  # seconds: a process start and a few tiny steps take ~15 s on a loaded machine


@pytest.fixture(scope="module")
def poisoned_source(byte_data, tmp_path_factory):
    """A mix of shakespeare and a source of two documents that both hold the poison, and init weights
    that make any sample reading it NaN (and no other)."""
    import torch

    from llmtools.data import mix as M
    from llmtools.formats.indexed import IndexedDatasetWriter
    from llmtools.formats.sidecar import read_sidecar, write_sidecar
    from llmtools.model import LlamaForCausalLM, load_model_config
    from llmtools.model.hf import save_hf_folder

    folder = tmp_path_factory.mktemp("exhaust")
    clean = byte_data["prefixes"][0]
    prefix = folder / "poison"
    with IndexedDatasetWriter(prefix, np.uint16, durable=False) as writer:
        for _ in range(2):
            writer.add_document(np.full(3 * SEQ, POISON, dtype=np.uint16))
    write_sidecar(prefix, read_sidecar(clean))
    config = M.MixConfig(blend=M.Blend([clean, str(prefix)], [0.8, 0.2]), seq_length=SEQ, num_samples=400,
                         split="100,0,0")  # fmt: skip
    M.save_plan(M.build_plan(config), folder / "mix.json")
    model_config = load_model_config({**load_model_config("tiny").to_dict(), **TINY})
    torch.manual_seed(0)
    model = LlamaForCausalLM(model_config)
    with torch.no_grad():
        model.model.embed_tokens.weight[POISON] = float("nan")
    init = save_hf_folder(model, model_config, folder / "nan-init")
    return {"mix": str(folder / "mix.json"), "init": str(init)}


def one_line(proc) -> str:
    text = proc.stderr.decode().strip()
    assert proc.returncode == 2 and "\n" not in text and "Traceback" not in text, (
        proc.returncode,
        text[-3000:],
    )
    return text


def test_a_source_quarantined_whole_is_refused_in_one_line(poisoned_source, tmp_path):
    config = write_config(
        tmp_path / "train.yaml",
        poisoned_source["mix"],
        {
            "model": {"init_from": poisoned_source["init"]},
            "health": {"nan_action": "stop"},
            "training": {"train_steps": 20},
        },  # fmt: skip
    )
    run = tmp_path / "run"
    # the first NaN step names both documents: the run stops there with its last good state, saying so
    first = llm_train(config, run, timeout=BOUND)
    last = first.stderr.decode().strip().splitlines()[-1]
    assert first.returncode == 2 and "source poison is exhausted" in last and "stopped at step" in last, last
    # resuming as before: refused in one line before any compute, not a search without end
    line = one_line(llm_train(config, run, "--resume", "auto", timeout=BOUND))
    assert "source poison is exhausted: every sample of its train split reads a quarantined document" in line
    quarantined = {d["document"] for r in map(json.loads, (run / "quarantine.jsonl").read_text().splitlines())
                   for s in r["samples"] for d in s["documents"] if s["source"] == "poison"}  # fmt: skip
    assert quarantined == {0, 1}


def _edit_ledger(checkpoint: Path, edit) -> None:
    meta_path = checkpoint / "meta.json"
    meta = json.loads(meta_path.read_text())
    edit(meta["data"]["ledger"]["sources"][0])
    meta_path.write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "case, edit, expected",
    [
        ("cursor", lambda s: s.update(position=10**15), r"sources\[0\]\.position: 1000000000000000 is past"),
        (
            "cursor-and-counts",
            lambda s: s.update(position=10**15, drawn=10**15),
            r"sources\[0\]\.drawn: 1000000000000000 samples drawn",
        ),  # fmt: skip
        (
            "skip",
            lambda s: s.update(skips=[{"from": 0, "documents": [10**9]}]),
            r"skips\[0\]\.documents: document 1000000000 does not exist",
        ),  # fmt: skip
    ],
)
def test_an_absurd_ledger_is_refused_in_one_line(byte_data, tmp_path, case, edit, expected):
    import re

    config = write_config(tmp_path / "train.yaml", byte_data["mix"], {"training": {"train_steps": 2}})
    run = tmp_path / "run"
    done = llm_train(config, run, timeout=BOUND)
    assert done.returncode == 0, done.stderr[-3000:]
    _edit_ledger(run / "checkpoints" / "step_00000002", edit)
    config = write_config(tmp_path / "train.yaml", byte_data["mix"], {"training": {"train_steps": 4}})
    line = one_line(llm_train(config, run, "--resume", "2", timeout=BOUND))
    assert re.search(expected, line), line


def test_a_divergence_the_config_causes_quarantines_nothing(byte_data, tmp_path):
    """A learning rate of 1 (the top of the allowed range) with a loss-spike gate: the loss rises on
    every batch alike, so the same weights fail on other data too: the config is blamed, nothing is
    quarantined, and the state that diverged is not saved."""
    settings = {"optimizer": {"lr": 1.0}, "schedule": {"kind": "constant", "warmup_steps": 0},
                "health": {"loss_spike_factor": 1.5, "spike_window": 2, "spike_action": "stop"},
                "checkpoint": {"save_every": 1}, "training": {"train_steps": 12}}  # fmt: skip
    config = write_config(tmp_path / "train.yaml", byte_data["mix"], settings)
    run = tmp_path / "run"
    stopped = llm_train(config, run, timeout=BOUND)
    text = stopped.stderr.decode()
    assert stopped.returncode == 1, text[-3000:]
    assert "the cause is the config or the state" in text and "nothing was quarantined" in text, text[-3000:]
    assert not (run / "quarantine.jsonl").exists()
    step = int(text.split("stopped at step ")[1].split(":")[0])
    assert not (run / "checkpoints" / f"step_{step:08d}").exists()  # the diverged state is not saved
