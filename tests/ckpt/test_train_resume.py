"""Resume through the real training loop (llmtools.train.loop.train, in process): exact continuation,
refusal of another model shape or data, --reset-data, SIGTERM."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from llmtools.ckpt.manager import CheckpointManager
from llmtools.ckpt.reader import CheckpointReader
from llmtools.errors import InputError
from tests.train.conftest import tiny_config, write_byte_prefix

ROOT = Path(__file__).resolve().parents[2]
STEPS = 12


@pytest.fixture(scope="module")
def byte_mix(tmp_path_factory):
    from llmtools.data import mix as mixlib
    from tests.conftest import shared

    folder = tmp_path_factory.mktemp("bytes")
    shakespeare = write_byte_prefix(
        shared("tinyshakespeare/input.jsonl"), folder / "shakespeare_text_document", limit_docs=2000
    )
    wiki = write_byte_prefix(shared("wikitext-2/valid.jsonl"), folder / "wiki_text_document")
    config = mixlib.MixConfig(
        blend=mixlib.Blend([str(shakespeare), str(wiki)], [0.7, 0.3]),
        seq_length=64,
        num_samples=400,
        valid_samples=0,
        test_samples=0,
        split="100,0,0",
    )
    mix_path = folder / "mix.json"
    mixlib.save_plan(mixlib.build_plan(config), mix_path)
    return {"mix": str(mix_path), "shakespeare": str(shakespeare), "wiki": str(wiki)}


def _train(mix, run_dir: Path, stage=2, resume=None, reset_data=False, **overrides):
    from llmtools.train.deepspeed_config import load_ds_config
    from llmtools.train.loop import RunOptions, train

    overrides.setdefault("training__train_steps", STEPS)
    overrides.setdefault("checkpoint__save_every", 6)
    overrides.setdefault("checkpoint__save_final", True)
    cfg = tiny_config(mix, **overrides)
    ds = load_ds_config(ROOT / f"configs/deepspeed/zero{stage}.json")
    return train(cfg, ds, RunOptions(run_dir=run_dir, quiet=True, resume=resume, reset_data=reset_data))


def _records(run_dir: Path, kind: str = "train") -> list[dict]:
    return [
        r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind
    ]


def _weights(checkpoint: Path) -> dict:
    with CheckpointReader(checkpoint) as reader:
        return {name: source.load() for name, source in reader.sources().items()}


@pytest.fixture(scope="module")
def uninterrupted(byte_mix, tmp_path_factory):
    run = tmp_path_factory.mktemp("full") / "run"
    result = _train(byte_mix["mix"], run)
    return run, result


def _resume_from_step6(uninterrupted, tmp_path) -> Path:
    source, _ = uninterrupted
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(source / "checkpoints" / "step_00000006", run / "checkpoints" / "step_00000006")
    return run


def test_trainer_resume_auto_is_exact(byte_mix, uninterrupted, tmp_path):
    import torch

    full_run, full = uninterrupted
    run = _resume_from_step6(uninterrupted, tmp_path)
    resumed = _train(byte_mix["mix"], run, resume="auto")
    # bitwise: a resume repeats the interrupted run's steps on the same machine, kernels and batches
    assert resumed.losses == full.losses[6:]
    assert [r["consumed_samples"] for r in _records(run)] == [
        r["consumed_samples"] for r in _records(full_run)
    ][6:]
    assert [r["lr"] for r in _records(run)] == [r["lr"] for r in _records(full_run)][6:]
    a, b = (
        _weights(full_run / "checkpoints" / "step_00000012"),
        _weights(run / "checkpoints" / "step_00000012"),
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_trainer_resume_auto_on_a_fresh_run_starts_fresh(byte_mix, tmp_path):
    result = _train(
        byte_mix["mix"],
        tmp_path / "run",
        resume="auto",
        training__train_steps=2,
        checkpoint__save_every=0,
        checkpoint__save_final=False,
    )
    assert result.steps == 2 and len(result.losses) == 2


def test_trainer_refuses_another_model_shape(byte_mix, uninterrupted, tmp_path):
    run = _resume_from_step6(uninterrupted, tmp_path)
    with pytest.raises(InputError, match=r"model.hidden_size\]: checkpoint has 96, the config has 120"):
        _train(byte_mix["mix"], run, resume="auto", model__hidden_size=120)


def test_a_changed_data_section_naming_the_same_plan_continues_and_says_so(byte_mix, uninterrupted, tmp_path):
    # data.seed does not shape a mix (the mix has its own seed): the plan, hence the data, is the same
    full_run, full = uninterrupted
    run = _resume_from_step6(uninterrupted, tmp_path)
    resumed = _train(byte_mix["mix"], run, resume="auto", data__seed=99)
    # bitwise: a resume repeats the interrupted run's steps on the same machine, kernels and batches
    assert resumed.losses == full.losses[6:]
    (event,) = [e for e in _records(run, "event") if e["event"] == "config_change"]
    assert (event["key"], event["old"], event["new"]) == ("data.seed", 1234, 99)
    assert "continued by the data ledger" in event["message"]
    assert not [e for e in _records(run, "event") if e["event"] == "data"]  # the plan, so the data: unchanged


def test_reset_data_keeps_steps_and_schedule_restarts_data(byte_mix, uninterrupted, tmp_path):
    full_run, _ = uninterrupted
    run = _resume_from_step6(uninterrupted, tmp_path)
    result = _train(byte_mix["mix"], run, resume="auto", reset_data=True, data__seed=99)
    records = _records(run)
    assert [r["step"] for r in records] == list(range(7, STEPS + 1))
    assert [r["lr"] for r in records] == [r["lr"] for r in _records(full_run)][6:]  # the same LR curve
    assert records[0]["consumed_samples"] == 8  # the new data from its beginning (one global batch in)
    assert result.steps == STEPS


def test_resume_specs_fail_clearly(byte_mix, uninterrupted, tmp_path):
    run = _resume_from_step6(uninterrupted, tmp_path)
    with pytest.raises(InputError, match="no checkpoint for step 7"):
        _train(byte_mix["mix"], run, resume="7")
    with pytest.raises(InputError, match="latest: missing"):
        _train(byte_mix["mix"], run, resume="latest")


def test_sigterm_in_the_trainer_saves_and_resumes_exactly(byte_mix, uninterrupted, tmp_path):
    full_run, full = uninterrupted
    run = tmp_path / "run"

    def send_sigterm_after_step_3():
        deadline = time.time() + 300
        while time.time() < deadline:
            if (run / "metrics.jsonl").exists() and len(_records(run)) >= 3:
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.01)

    before = signal.getsignal(signal.SIGTERM)
    sender = threading.Thread(target=send_sigterm_after_step_3, daemon=True)
    sender.start()
    stopped = _train(byte_mix["mix"], run, checkpoint__save_every=0)
    sender.join()
    assert stopped.stopped == "SIGTERM" and 3 <= stopped.steps < STEPS
    saved = CheckpointManager(run).resolve("auto")
    assert saved is not None and saved.name == f"step_{stopped.steps:08d}"
    assert _records(run, "event")[-1]["event"] == "stop"
    assert signal.getsignal(signal.SIGTERM) is before  # handlers restored
    resumed = _train(byte_mix["mix"], run, resume="auto", checkpoint__save_every=0)
    # bitwise: a resume repeats the interrupted run's steps on the same machine, kernels and batches
    assert stopped.losses + resumed.losses == full.losses


def test_reset_data_needs_resume(cli_env, tmp_path):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "llmtools.cli.train", str(tmp_path / "c.yaml"), "--deepspeed", "ds.json",
         "--reset-data"],
        capture_output=True, text=True, env=cli_env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        == "llm-train: error: --reset-data: only with --resume (it restarts the data of a resumed run)"
    )


@pytest.mark.parametrize(
    "stage, precision", [(0, "fp32"), (1, "fp32"), (3, "fp32"), (2, "bf16"), (0, "bf16")]
)
def test_trainer_exact_resume_other_stages(byte_mix, tmp_path, stage, precision):
    import torch

    steps = dict(training__train_steps=6, checkpoint__save_every=3, training__precision=precision)
    full = _train(byte_mix["mix"], tmp_path / "full", stage=stage, **steps)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(
        tmp_path / "full" / "checkpoints" / "step_00000003", run / "checkpoints" / "step_00000003"
    )
    resumed = _train(byte_mix["mix"], run, stage=stage, resume="auto", **steps)
    # bitwise: a resume repeats the interrupted run's steps on the same machine, kernels and batches
    assert resumed.losses == full.losses[3:]
    a = _weights(tmp_path / "full" / "checkpoints" / "step_00000006")
    b = _weights(run / "checkpoints" / "step_00000006")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_background_saves_in_the_trainer_resume_exactly(byte_mix, uninterrupted, tmp_path):
    """checkpoint.async: true through the loop: a background save every 3 steps (each committed while
    training goes on), then a run resumed from one of them equals the uninterrupted synchronous run."""
    import torch

    full_run, full = uninterrupted
    run = tmp_path / "run"
    result = _train(byte_mix["mix"], run, checkpoint__save_every=3, **{"checkpoint__async": True})
    # bitwise: the background save only reads the weights; the same kernels run the same steps
    assert result.losses == full.losses  # saving in the background changes nothing in training
    events = [r for r in _records(run, "event") if r["event"] == "checkpoint"]
    assert [e["step"] for e in events] == [3, 6, 9, 12]
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.is_dir()) == [
        f"step_{s:08d}" for s in (3, 6, 9, 12)
    ]
    # The step-6 checkpoint written in the background resumes to the uninterrupted run, bitwise.
    resumed_run = tmp_path / "resumed"
    (resumed_run / "checkpoints").mkdir(parents=True)
    shutil.copytree(run / "checkpoints" / "step_00000006", resumed_run / "checkpoints" / "step_00000006")
    resumed = _train(byte_mix["mix"], resumed_run, resume="auto")
    # bitwise: a resume repeats the interrupted run's steps on the same machine, kernels and batches
    assert resumed.losses == full.losses[6:]
    a, b = (
        _weights(full_run / "checkpoints" / "step_00000012"),
        _weights(resumed_run / "checkpoints" / "step_00000012"),
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


DOC_MASKING = {
    "data__reset_position_ids": True,
    "data__reset_attention_mask": True,
    "data__eod_mask_loss": True,
}


def test_document_masking_changes_the_losses_and_resumes_exactly(byte_mix, uninterrupted, tmp_path):
    """Megatron's three flags: every sample holds several EOD-ended lines, so the losses move; a run
    resumed from step 6 continues bit for bit."""
    import torch

    _, plain = uninterrupted
    full_run = tmp_path / "full"
    full = _train(byte_mix["mix"], full_run, **DOC_MASKING)
    assert full.losses[0] != plain.losses[0]
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(full_run / "checkpoints" / "step_00000006", run / "checkpoints" / "step_00000006")
    resumed = _train(byte_mix["mix"], run, resume="auto", **DOC_MASKING)
    assert resumed.losses == full.losses[6:]
    a, b = (_weights(r / "checkpoints" / "step_00000012") for r in (full_run, run))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
