"""llm-log plot writes a PNG whose four panels hold curves."""

from __future__ import annotations

import pytest

from llmtools.errors import InputError, OutputExistsError, UsageError
from llmtools.logs.plot import PANELS, Curves, PlotConfig, ema, plot_runs
from llmtools.logs.records import Record
from llmtools.logs.runs import collect_curves
from tests.logs.helpers import FIXTURES


def panel_ink(png, rows: int = 2) -> list[float]:
    """Share of non-background pixels inside each of the four panel areas of the first two rows."""
    import matplotlib.image as mpimg
    import numpy as np

    image = mpimg.imread(png)[..., :3]
    height, width = image.shape[:2]
    # 0.9: an ink threshold on pixel values in [0, 1], not a tolerance
    ink = (image < 0.9).any(axis=2)
    shares = []
    for row in range(2):
        for col in range(2):
            y0, y1 = int(height * (row + 0.25) / rows), int(height * (row + 0.9) / rows)
            x0, x1 = int(width * (0.1 + col * 0.5)), int(width * (0.45 + col * 0.5))
            shares.append(float(np.mean(ink[y0:y1, x0:x1])))
    return shares


def test_plot_png_has_four_non_empty_panels(tmp_path):
    runs, _ = collect_curves([str(FIXTURES / "metrics.jsonl"), str(FIXTURES / "megatron.log")])
    out = tmp_path / "curves.png"
    drawn = plot_runs(runs, PlotConfig(output=out, dpi=50))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image as mpimg

    # Megatron-LM logs the parameter norm: a third row (update ratio, parameter norm) holds it.
    assert mpimg.imread(out).shape[:2] == (12 * 50, 12 * 50)
    assert set(drawn) == {*PANELS, "update_ratio", "params_norm"}
    assert drawn["loss"] == {"fixtures": 60 + 3, "megatron": 20 + 3}  # the resume superseded 110..150
    assert all(drawn[p] for p in PANELS) and drawn["params_norm"] == {"megatron": 20}
    assert min(panel_ink(out, rows=3)) > 0.005  # each panel carries visible lines, not only axes


def test_plot_x_tokens_needs_token_counts(tmp_path):
    runs, _ = collect_curves([str(FIXTURES / "megatron.log")], x="tokens")
    with pytest.raises(InputError, match="--x steps"):
        plot_runs(runs, PlotConfig(output=tmp_path / "t.png", x="tokens"))
    runs, _ = collect_curves([str(FIXTURES / "megatron.log")], x="tokens", seq_length=1024)
    assert runs[0].series["loss"][0][-1] == 200 * 32 * 1024
    runs, _ = collect_curves([str(FIXTURES / "metrics.jsonl")], x="tokens")
    plot_runs(runs, PlotConfig(output=tmp_path / "t.png", x="tokens", dpi=40))
    assert runs[0].series["loss"][0][-1] == 60 * 8 * 256


def test_plot_refuses_to_overwrite_and_bad_options(tmp_path):
    out = tmp_path / "c.png"
    out.write_bytes(b"old")
    runs, _ = collect_curves([str(FIXTURES / "generic.log")])
    with pytest.raises(OutputExistsError):
        plot_runs(runs, PlotConfig(output=out))
    with pytest.raises(UsageError, match="--x"):
        PlotConfig(output=out, x="time")
    with pytest.raises(UsageError, match=".png"):
        PlotConfig(output=tmp_path / "c.svg")


def test_resume_supersedes_and_ema_starts_at_first_value():
    curves = Curves("r")
    for step, loss in [(1, 5.0), (2, 4.0), (3, 3.0), (2, 3.5), (3, 3.2)]:
        curves.add(Record("train", step, None, {"loss": loss}), "steps", [None])
    assert list(curves.series["loss"][0]) == [1, 2, 3] and list(curves.series["loss"][1]) == [5.0, 3.5, 3.2]
    # float64 arithmetic on both sides in another order: pytest's default rel=1e-6 is ~2^30 of its ulps
    assert ema([2.0, 2.0], 0.9) == pytest.approx([2.0, 2.0])


def test_moe_runs_get_router_panels(tmp_path):
    """A metrics.jsonl with llm-train's router metrics: two more panels (load-balancing loss, load CV)."""
    import json

    import matplotlib.image as mpimg

    lines = []
    for step in range(1, 31):
        layers = [
            {
                "layer": i,
                "load": [0.25] * 4,
                "cv": 0.5 / step + i,
                "max_load": 1.5,
                "dropped": 0.0,
                "aux_loss": 2.1,
                "z_loss": 3.0,
            }
            for i in range(2)
        ]
        record = {
            "kind": "train",
            "step": step,
            "time": 1.0 + step,
            "consumed_samples": 8 * step,
            "consumed_tokens": 512 * step,
            "loss": 5.0 - step / 10,
            "grad_norm": 1.0,
            "lr": 1e-3,
            "step_time_s": 0.1,
            "tokens_per_s": 5000.0,
            "mfu": None,
            "memory_mb": None,
            "moe_aux_loss": 2.0 + 1 / step,
            "moe_z_loss": 3.0,
            "moe_load_cv": 0.5,
            "moe_load_cv_max": 1.5,
            "moe_dropped": 0.0,
            "moe_layers": layers,
        }
        lines.append(json.dumps(record))
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    runs, _ = collect_curves([str(tmp_path / "metrics.jsonl")])
    out = tmp_path / "moe.png"
    drawn = plot_runs(runs, PlotConfig(output=out, dpi=40))
    assert list(drawn["moe_aux_loss"].values()) == [30] and list(drawn["moe_load_cv"].values()) == [60]
    assert mpimg.imread(out).shape[:2] == (12 * 40, 12 * 40)  # a third row of panels
    # and a dense run keeps its four panels
    dense, _ = collect_curves([str(FIXTURES / "metrics.jsonl")])
    assert "moe_aux_loss" not in plot_runs(dense, PlotConfig(output=tmp_path / "dense.png", dpi=40))


def test_optimizer_and_eval_rows_and_the_fp16_loss_scale(tmp_path):
    """llm-train's update ratio, parameter norm, eval accuracy and bits per byte get a row each; an fp16
    run's loss scale is drawn beside the grad norm; a bf16 run's constant scale of 1 is not."""
    import json

    lines = []
    for step in range(1, 21):
        scale = 2.0 ** (16 - (step > 10))
        lines.append({"kind": "train", "step": step, "time": 1.0 + step, "consumed_tokens": 512 * step,
                      "loss": 5.0 - step / 10, "grad_norm": 1.0, "lr": 1e-3, "tokens_per_s": 5000.0,
                      "params_norm": 100.0 + step, "update_norm": 0.1, "update_ratio": 1e-3 / step,
                      "loss_scale": scale})  # fmt: skip
        if step % 5 == 0:
            lines.append({"kind": "eval", "step": step, "time": 1.5 + step, "eval_loss": 4.0,
                          "eval_ppl": 54.6, "eval_accuracy": 0.2 + step / 100, "eval_bpb": 3.0 - step / 20})  # fmt: skip
    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in lines))
    runs, _ = collect_curves([str(log)])
    drawn = plot_runs(runs, PlotConfig(output=tmp_path / "p.png", dpi=40))
    run = runs[0].name
    assert drawn["update_ratio"] == {run: 20} and drawn["params_norm"] == {run: 20}
    assert drawn["eval_accuracy"] == {run: 4} and drawn["eval_bpb"] == {run: 4}
    assert drawn["grad_norm"] == {run: 20 + 20}  # the grad norm and the loss scale
    import matplotlib.image as mpimg

    assert mpimg.imread(tmp_path / "p.png").shape[0] == 4 * 40 * 4  # four rows of 4 inches
    assert runs[0].series["loss_scale"][1][-1] == 2.0**15
