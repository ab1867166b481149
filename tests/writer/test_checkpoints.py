"""A checkpoint is complete only if it holds what its kind needs; --resume auto falls back when loading one
fails; each save has its own temporary name (real processes where a command is claimed)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from llmtools.ckpt import layout
from tests.writer.conftest import cli, records, run, snapshot, train_args

pytestmark = pytest.mark.slow
NEWEST = "checkpoints/step_00000004"
# two steps past the newest checkpoint: a resume with nothing left to train stops before loading anything
LONGER = ("--set", "training.train_steps=6")


def _rewrite_meta(folder: Path, edit) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    edit(meta)
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))


def _record(folder: Path, name: str):
    def edit(meta):
        data = (folder / name).read_bytes()
        meta["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    return edit


@pytest.mark.parametrize(
    "name", ["zero_pp_rank_0_mp_rank_00_optim_states.pt", "mp_rank_00_model_states.pt", "rng_rank0000.pt"]
)
def test_a_checkpoint_missing_a_file_its_kind_needs_is_not_complete(run_copy, name):
    """What two racing saves left behind: a folder whose meta.json lists only the files that are there."""
    folder = run_copy / NEWEST
    (folder / name).unlink()
    _rewrite_meta(folder, lambda meta: meta["files"].pop(name))
    done = run([*cli("ckpt"), "verify", folder])
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"llm-ckpt: error: {folder / name}: missing; a ZeRO-2 fp32 checkpoint of world size 1 needs it "
        "(incomplete save?)"
    )
    listed = json.loads(run([*cli("ckpt"), "list", run_copy, "--json", "--quick"]).stdout)
    assert [(r["step"], r["complete"], r["verified"]) for r in listed] == [(2, True, True), (4, False, False)]


def test_a_file_present_but_not_listed_is_not_trusted(run_copy):
    folder = run_copy / NEWEST
    _rewrite_meta(folder, lambda meta: meta["files"].pop("zero_pp_rank_0_mp_rank_00_optim_states.pt"))
    done = run([*cli("ckpt"), "verify", folder])
    assert (
        done.returncode == 2
        and "zero_pp_rank_0_mp_rank_00_optim_states.pt: not listed in meta.json" in done.stderr
    )


def test_resume_auto_skips_an_incomplete_checkpoint_and_resumes_the_previous(base_run, run_copy):
    folder = run_copy / NEWEST
    (folder / "zero_pp_rank_0_mp_rank_00_optim_states.pt").unlink()
    _rewrite_meta(folder, lambda meta: meta["files"].pop("zero_pp_rank_0_mp_rank_00_optim_states.pt"))
    done = run(train_args(base_run[1], run_copy, 2, "--resume", "auto", "--set", "training.train_steps=3"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        f"warning: skipping checkpoint {folder}: {folder}/zero_pp_rank_0_mp_rank_00_optim_states.pt: missing"
        in done.stderr
    )
    assert f"resumed from {run_copy}/checkpoints/step_00000002 at step 2" in done.stderr


def test_resume_auto_does_not_start_over_when_no_checkpoint_is_usable(base_run, run_copy):
    for step in ("2", "4"):
        (run_copy / f"checkpoints/step_0000000{step}/rng_rank0000.pt").write_bytes(b"torn")
    before = snapshot(run_copy)
    done = run(train_args(base_run[1], run_copy, 2, "--resume", "auto", *LONGER))
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"llm-train: error: {run_copy}/checkpoints: none of its checkpoints can be resumed (step_00000002, "
        "step_00000004; the warnings above say why); --resume STEP names one, --force starts the run over"
    )
    assert snapshot(run_copy) == before


def test_resume_auto_falls_back_when_loading_fails(base_run, run_copy, tmp_path):
    """The newest checkpoint verifies (its meta.json vouches for a file DeepSpeed cannot use): --resume auto
    warns and resumes the previous one; an explicit --resume of it fails with exit 1, writing nothing."""
    import torch

    folder = run_copy / NEWEST
    name = "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    torch.save({"optimizer_state_dict": {}}, folder / name)
    _rewrite_meta(folder, _record(folder, name))

    before = snapshot(run_copy)
    explicit = run(train_args(base_run[1], run_copy, 2, "--resume", "4", *LONGER))
    assert explicit.returncode == 1, explicit.stderr[-3000:]
    assert f"llm-train: error: {folder}: could not be loaded (" in explicit.stderr
    assert snapshot(run_copy) == before

    done = run(train_args(base_run[1], run_copy, 2, "--resume", "auto", *LONGER))
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"warning: could not load {folder} (" in done.stderr
    assert "; trying the previous complete checkpoint" in done.stderr
    assert f"resumed from {run_copy}/checkpoints/step_00000002 at step 2" in done.stderr
    assert [r["step"] for r in records(run_copy, "train")][-4:] == [3, 4, 5, 6]


def test_each_save_has_its_own_temporary_name():
    names = {layout.tmp_name(8) for _ in range(100)}
    assert len(names) == 100 and all(n.startswith("step_00000008.tmp-save-") for n in names)


@pytest.mark.parametrize(
    "stage, precision, world, expected",
    [
        (0, "fp32", 1, ["mp_rank_00_model_states.pt"]),
        (0, "bf16", 1, ["mp_rank_00_model_states.pt"]),
        (2, "bf16", 1, ["mp_rank_00_model_states.pt", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"]),
        (2, "fp32", 2, ["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                        "zero_pp_rank_1_mp_rank_00_optim_states.pt"]),
        (3, "fp32", 2, ["zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_model_states.pt",
                        "zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]),
    ],
)  # fmt: skip
def test_the_files_deepspeed_needs(stage, precision, world, expected):
    """The table behind verify; the exact-resume tests of every stage and precision (tests/ckpt) load what
    DeepSpeed saved through it, so a wrong row fails them."""
    assert layout.deepspeed_files(stage, world, precision) == expected
    meta = {"zero_stage": stage, "precision": precision, "world_size": world}
    assert layout.required_files(meta) == expected + [f"rng_rank000{r}.pt" for r in range(world)]
