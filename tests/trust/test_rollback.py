"""Resuming from a step older than the run's newest complete checkpoint needs ``--rollback``, which moves the
later checkpoints into ``checkpoints/abandoned-<time>/`` (never deletes them), so ``--resume auto`` cannot
jump back to the abandoned timeline; without it, exit 2 naming the later steps, before any compute.
"""

from __future__ import annotations

import json

from tests.trust.conftest import cli, error_line, snapshot


def test_rollback_is_explicit_and_moves_later_checkpoints_aside(run, env, train_files):
    config, ds = train_files
    ckpt = run / "checkpoints"
    old_meta = json.loads((ckpt / "step_00000004" / "meta.json").read_text())
    before = snapshot(run)

    proc = cli("train", config, "--deepspeed", ds, "-o", run, "--resume", "2", env=env)
    assert proc.returncode == 2
    line = error_line(proc)
    assert (
        "step 2 is older than this run's newest checkpoint (later steps: 4)" in line and "--rollback" in line
    )
    assert snapshot(run) == before  # nothing trained, nothing moved

    proc = cli("train", config, "--deepspeed", ds, "-o", run, "--resume", "auto", "--rollback", env=env)
    assert proc.returncode == 2 and "--rollback: only with --resume STEP, PATH or latest" in error_line(proc)

    proc = cli(
        "train", config, "--deepspeed", ds, "-o", run, "--resume", "2", "--rollback", env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (abandoned,) = ckpt.glob("abandoned-*")
    assert json.loads((abandoned / "step_00000004" / "meta.json").read_text()) == old_meta  # kept as it was
    new_meta = json.loads((ckpt / "step_00000004" / "meta.json").read_text())
    assert new_meta["time"] > old_meta["time"]  # step 4 trained again from step 2
    assert (ckpt / "latest").read_text().strip() == "step_00000004"

    listed = json.loads(cli("ckpt", "list", run, "--json", env=env).stdout)
    assert [row["step"] for row in listed] == [2, 4] and all(row["verified"] for row in listed)
    from llmtools.ckpt.manager import CheckpointManager

    assert CheckpointManager(run).resolve("auto") == ckpt / "step_00000004"  # the new timeline's step 4
