"""A checkpoint file carrying a pickle payload (its sha256 in meta.json recomputed, as anyone who supplies the
file can) is refused by every command that reads it, with exit 2 naming the file and the global, and the
payload never runs: verify, inspect, convert, ``llm-train --resume`` (auto, STEP, latest, PATH) and
``--init-from``. The control test shows the planted payload really runs under a plain ``torch.load``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from llmtools.ckpt.safeload import ALLOWED, globals_in, normalized
from tests.trust.conftest import cli, error_line, plant_payload, rehash, snapshot

STEP4 = "checkpoints/step_00000004"
MODEL = f"{STEP4}/mp_rank_00_model_states.pt"
OPTIM = f"{STEP4}/zero_pp_rank_0_mp_rank_00_optim_states.pt"
RNG = f"{STEP4}/rng_rank0000.pt"


def poison(run, name: str, marker) -> None:
    plant_payload(run / name, marker)
    rehash(run / STEP4)


def refused(proc, run, name: str, marker) -> None:
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = error_line(proc)
    assert str(run / name) in line and "os.system" in line, line
    assert not marker.exists(), "the payload ran"


def test_control_the_planted_payload_runs_under_a_plain_torch_load(run, marker, env):
    poison(run, MODEL, marker)
    code = "import sys, torch; torch.load(sys.argv[1], weights_only=False)"
    subprocess.run([sys.executable, "-c", code, str(run / MODEL)], env=env, timeout=300, capture_output=True)
    assert marker.exists()  # so the refusals below are refusals of a live payload


def test_verify_refuses_every_kind_of_file(run, marker, env):
    from llmtools.ckpt.verify import verify

    for name in (OPTIM, RNG, MODEL):  # the library on each kind, the command on the last
        poison(run, name, marker)
        report = verify(run / STEP4)
        assert not report.ok and report.unsafe is not None and str(run / name) in report.first_problem()
    refused(cli("ckpt", "verify", run / STEP4, env=env), run, MODEL, marker)


def test_inspect_and_convert_refuse(run, marker, env, tmp_path):
    poison(run, MODEL, marker)
    refused(cli("ckpt", "inspect", run / STEP4, env=env), run, MODEL, marker)
    proc = cli(
        "ckpt", "convert", run / STEP4, "--to", "safetensors", "-o", tmp_path / "m.safetensors", env=env
    )
    refused(proc, run, MODEL, marker)
    assert not (tmp_path / "m.safetensors").exists()
    # a run folder: its newest checkpoint holds the payload, which stops the search (never skipped)
    refused(cli("ckpt", "convert", run, "--to", "hf", "-o", tmp_path / "hf", env=env), run, MODEL, marker)


def test_verify_refuses_a_bare_deepspeed_folder_too(run, marker, env):
    """Without meta.json there is nothing to verify against, but the pickles are still checked."""
    poison(run, OPTIM, marker)
    (run / STEP4 / "meta.json").unlink()
    refused(cli("ckpt", "inspect", run / STEP4, env=env), run, OPTIM, marker)


@pytest.mark.parametrize(("name", "spec"), [(OPTIM, "auto"), (RNG, "4")], ids=["auto-optim", "step-rng"])
def test_resume_refuses(run, marker, env, train_files, name, spec):
    """DeepSpeed's optimizer file (auto) and our RNG file (a step): refused before DeepSpeed sees them."""
    poison(run, name, marker)
    before = snapshot(run / "checkpoints")
    config, ds = train_files
    proc = cli("train", config, "--deepspeed", ds, "-o", run, "--resume", spec, env=env, timeout=600)
    refused(proc, run, name, marker)
    assert snapshot(run / "checkpoints") == before


def test_init_from_refuses(run, marker, env, train_files, tmp_path):
    poison(run, MODEL, marker)
    config, ds = train_files
    out = tmp_path / "fresh"
    proc = cli(
        "train", config, "--deepspeed", ds, "-o", out, "--init-from", run / STEP4, env=env, timeout=600
    )
    refused(proc, run, MODEL, marker)
    assert not (out / "checkpoints").exists()


def test_the_allowlist_is_what_real_checkpoints_hold(run_master):
    """Every global in the run's files (model, optimizer, RNG) is on the allowlist, and the files use
    the entries for what the reasons say (the DeepSpeed classes in optimizer states only)."""
    seen = set()
    for file in sorted((run_master / STEP4).glob("*.pt")):
        names = {normalized(*name) for name in globals_in(file)}
        assert names <= set(ALLOWED), (file.name, names - set(ALLOWED))
        if "optim_states" not in file.name:
            assert not any(module.startswith("deepspeed") for module, _ in names), file.name
        seen |= names
    assert ("deepspeed.runtime.fp16.loss_scaler", "LossScaler") in seen
    assert ("numpy._core.multiarray", "_reconstruct") in seen
