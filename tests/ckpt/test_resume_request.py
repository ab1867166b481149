"""--resume parsed once (llmtools.ckpt.request.ResumeRequest), resolved by the checkpoint manager."""

from __future__ import annotations

from pathlib import Path

from llmtools.ckpt.manager import CheckpointManager
from llmtools.ckpt.request import ResumeRequest


def test_every_form_of_resume_parses_into_one_request():
    assert ResumeRequest.parse(None) is None
    assert ResumeRequest.parse(" auto ").auto
    assert ResumeRequest.parse("latest").kind == "latest"
    step = ResumeRequest.parse("12", rollback=True, reshard=True)
    assert (step.kind, step.step, step.rollback, step.reshard) == ("step", 12, True, True)
    path = ResumeRequest.parse("runs/a/checkpoints/step_00000004")
    assert (path.kind, path.path, path.given) == (
        "path",
        Path("runs/a/checkpoints/step_00000004"),
        str(path.path),
    )


def test_the_manager_resolves_a_request_as_the_value_it_parses(saved_run):
    manager = CheckpointManager(saved_run)
    for spec, rollback in (("auto", False), ("latest", False), ("2", True)):
        request = ResumeRequest.parse(spec, rollback=rollback)
        assert request.likely_checkpoint(manager.ckpt_dir) == manager.resolve(request)
