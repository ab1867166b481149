"""A weight decay changed on resume reaches every optimizer group a fresh run decays, under ZeRO-3 too.

Real ``llm-train`` processes, one rank: under ZeRO-3 the module's parameters are partitioned placeholders
(``torch.Size([0])``; DeepSpeed keeps the real shape in ``ds_shape``), so the layout rebuilt from them on
resume must read the real shapes. LoRA adapters of rank 16 are all matrices above ZeRO-3's persistence
threshold: a fresh run has one decayed group, and placeholder shapes lay them out as "no decay" (the
resume was refused: 1 group in the checkpoint, 2 rebuilt). Muon is refused with ZeRO-3 before compute,
so AdamW (whole model, and LoRA) and Lion stand for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.train.test_exactness import llm_train, write_config
from tests.train.test_resume_changes import optimizer_decay

BOUND = 300  # seconds per process
ZERO3 = ("--deepspeed", str(REPO / "configs/deepspeed/zero3.json"))
CASES = {
    "adamw": {"optimizer": {"name": "adamw"}},
    "adamw-lora": {"optimizer": {"name": "adamw"}, "lora": {"r": 16}},
    "lion": {"optimizer": {"name": "lion"}},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_weight_decay_change_under_zero3_reaches_every_group_a_fresh_run_decays(byte_data, tmp_path, case):
    def config(wd: float, steps: int) -> Path:
        settings = {**CASES[case], "training": {"train_steps": steps}}
        settings["optimizer"] = {**settings["optimizer"], "lr": 1e-3, "weight_decay": wd}
        return write_config(tmp_path / f"{wd}-{steps}.yaml", byte_data["mix"], settings)

    fresh, run = tmp_path / "fresh", tmp_path / "run"
    for proc in (
        llm_train(config(0.1, 1), fresh, *ZERO3, timeout=BOUND),
        llm_train(config(0.0, 1), run, *ZERO3, timeout=BOUND),
    ):
        assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    resumed = llm_train(config(0.1, 2), run, *ZERO3, "--resume", "auto", timeout=BOUND)
    assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
    assert b"optimizer.weight_decay" in resumed.stderr
    expected = optimizer_decay(fresh / "checkpoints" / "step_00000001")
    assert 0.1 in expected
    assert optimizer_decay(run / "checkpoints" / "step_00000002") == expected
