"""Inputs that are odd but valid work through the real commands: non-finite metric values are plotted,
summarized and converted (NaN losses become markers), steps that cannot be stored are counted as invalid
lines, and ``llm-ckpt prune`` reports only what it really removed."""

from __future__ import annotations

import json
import shutil

from tests.contract.conftest import World, run_cli


def test_log_commands_take_nan_and_inf(tmp_path):
    records = []
    for step in range(1, 31):
        loss = float("nan") if step == 5 else float("inf") if step == 6 else 3.0 - step * 0.01
        records.append({"kind": "train", "step": step, "loss": loss, "lr": 1e-3, "grad_norm": float("inf") if step == 7 else 1.0,
                        "consumed_tokens": step * 64, "tokens_per_s": float("nan") if step == 8 else 100.0})  # fmt: skip
    records.append({"kind": "eval", "step": 30, "eval_loss": float("inf")})
    records.append({"kind": "train", "step": 10**30, "loss": 1.0})  # a step TensorBoard cannot store
    text = "\n".join(json.dumps(r) for r in records) + "\n"  # NaN and Infinity, as Python writes them
    (tmp_path / "metrics.jsonl").write_text(text)
    plot = run_cli(["llm-log", "plot", "metrics.jsonl", "-o", "curves.png", "--x", "tokens"], tmp_path)
    assert plot.returncode == 0, plot.stderr.decode()
    assert (tmp_path / "curves.png").stat().st_size > 1000
    summary = run_cli(["llm-log", "summary", "metrics.jsonl", "--json"], tmp_path)
    assert summary.returncode == 0, summary.stderr.decode()
    (run,) = json.loads(summary.stdout)
    assert run["steps"] == 30
    assert "outside 0..2**63-1" in summary.stderr.decode() or "2**63" in summary.stderr.decode()
    tb = run_cli(["llm-log", "tb", "metrics.jsonl", "--logdir", "tb"], tmp_path)
    assert tb.returncode == 0, tb.stderr.decode()
    assert "Traceback" not in plot.stderr.decode() + summary.stderr.decode() + tb.stderr.decode()


def test_prune_reports_only_what_it_removed(world: World, tmp_path):
    """A step folder that is a symbolic link is not deleted through the link: it is named in a warning,
    not printed as removed; the real folders are pruned."""
    run = tmp_path / "run"
    shutil.copytree(world.run, run, symlinks=True)
    step1 = run / "checkpoints" / "step_00000001"
    elsewhere = tmp_path / "kept-elsewhere"
    shutil.move(step1, elsewhere)
    step1.symlink_to(elsewhere, target_is_directory=True)
    proc = run_cli(["llm-ckpt", "prune", "run", "--keep", "1"], tmp_path)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert proc.stdout.decode().strip() == ""  # nothing was removed
    assert "not pruning" in err and "symbolic link" in err
    assert elsewhere.is_dir() and step1.is_symlink()
    step1.unlink()
    shutil.copytree(elsewhere, step1)
    proc = run_cli(["llm-ckpt", "prune", "run", "--keep", "1"], tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    removed = proc.stdout.decode().split()
    assert len(removed) == 1 and removed[0].endswith("checkpoints/step_00000001"), removed
    assert not step1.exists()
    assert "removed 1 checkpoint(s)" in proc.stderr.decode()
