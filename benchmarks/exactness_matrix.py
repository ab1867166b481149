#!/usr/bin/env python3
"""The exactness matrix in full: every optional training feature on its own (and the combinations tests
run), through the real ``llm-train``: the uninterrupted run, then the same run stopped at a chosen step
(SIGTERM, as a scheduler stops it: the loop saves and exits) and resumed with ``--resume auto``. A cell
passes when every train record's loss and every final weight are bitwise those of the uninterrupted run
(same machine, same kernels). tests/train/test_exactness.py runs three combined cells in ``make test``.

    python benchmarks/exactness_matrix.py                    # every cell, 16 steps, stop at 7
    python benchmarks/exactness_matrix.py --cells lion muon  # some cells
    python benchmarks/exactness_matrix.py --steps 40 --stop 23

Needs ../shared/data (tinyshakespeare, wikitext-2). Prints one row per cell: result, steps, the stop,
updates skipped and documents quarantined in the uninterrupted run, seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests.train.conftest import TINY, write_byte_prefix  # noqa: E402
from tests.train.test_exactness import SPIKES, events, llm_train, losses, weights, write_config  # noqa: E402

NOISY = {"micro_batch_size": 1, "global_batch_size": 2}
HEALTH = {"health": SPIKES, "training": NOISY, "optimizer": {"lr": 1e-2}}


def cells(data: dict) -> dict[str, dict]:
    return {
        "baseline (adamw, fp32)": {},
        "spike detection": HEALTH,
        # grad-norm spikes only: with a loss-spike factor of 1.01 one noisy sample of other data can look
        # as bad as the spiking batch, and the config would be blamed
        "quarantine (a short source)": {
            **HEALTH,
            "health": {**SPIKES, "loss_spike_factor": 0.0},
            "data": {"mix": data["short_mix"]},
        },  # fmt: skip
        "stages": {"data": {"mix": data["staged_mix"]}},
        "async saves": {"checkpoint": {"async": True}},
        "lion": {"optimizer": {"name": "lion", "lr": 3e-4}},
        "muon": {"optimizer": {"name": "muon", "lr": 2e-2}},
        "adafactor": {"optimizer": {"name": "adafactor", "lr": 1e-2}},
        "moe aux loss": {"model": {"preset": "tiny-moe", **TINY}},
        "lora": {"lora": {"r": 4}},
        "dpo": {
            "task": "dpo",
            "data": {"mix": None, "prefixes": [data["pref"]], "seq_length": 128},
            "dpo": {"beta": 0.1},
        },  # fmt: skip
        "bf16": {"training": {"precision": "bf16"}},
        "bf16 + muon + spikes": {
            **HEALTH,
            "optimizer": {"name": "muon", "lr": 2e-2},
            "training": {**NOISY, "precision": "bf16"},
        },  # fmt: skip
    }


def build_data(folder: Path) -> dict:
    from llmtools.data import mix as M
    from llmtools.data.stages import StageKey, StageSpec
    from tests.conftest import shared
    from tests.train.tasks.test_dpo import make_pref_prefix

    a = write_byte_prefix(shared("tinyshakespeare/input.jsonl"), folder / "shakespeare")
    b = write_byte_prefix(shared("wikitext-2/valid.jsonl"), folder / "wiki")
    short = write_byte_prefix(shared("wikitext-2/valid.jsonl"), folder / "wiki-short", limit_docs=30)

    def plan(name, prefixes, weights=None, stages=None):
        config = M.MixConfig(blend=M.Blend([str(p) for p in prefixes], weights), seq_length=64,
                             num_samples=4000, split="100,0,0", stages=stages, global_batch_size=8)  # fmt: skip
        M.save_plan(M.build_plan(config), folder / name)
        return str(folder / name)

    stages = [
        StageSpec(StageKey("samples", 0), StageKey("step", 5), (0.7, 0.3)),
        StageSpec(StageKey("step", 5), StageKey("end"), (0.2, 0.8)),
    ]
    return {
        "mix": plan("mix.json", [a, b], [0.7, 0.3]),
        "short_mix": plan("short.json", [a, short], [0.5, 0.5]),
        "staged_mix": plan("staged.json", [a, b], stages=stages),
        "pref": make_pref_prefix(folder, "pairs"),
    }


def run_cell(name: str, settings: dict, data: dict, steps: int, stop: int, root: Path) -> dict:
    import torch

    folder = root / name.replace(" ", "_").replace("(", "").replace(")", "").replace(",", "").replace("+", "")
    folder.mkdir(parents=True)
    base = {"training": {"train_steps": steps}}
    merged = {**base, **settings, "training": {**base["training"], **settings.get("training", {})}}
    config = write_config(folder / "train.yaml", data["mix"], merged)
    full, resumed = folder / "full", folder / "resumed"
    started = time.perf_counter()
    out = {"cell": name, "result": "?", "skipped": 0, "quarantined": 0}
    for what, proc in (
        ("uninterrupted", lambda: llm_train(config, full, timeout=1800)),
        ("stopped", lambda: llm_train(config, resumed, stop_at=stop, timeout=1800)),
        ("resumed", lambda: llm_train(config, resumed, "--resume", "auto", timeout=1800)),
    ):
        done = proc()
        if done.returncode != 0:
            out["result"] = f"{what} run failed: {done.stderr.decode().strip().splitlines()[-1][:200]}"
            out["seconds"] = time.perf_counter() - started
            return out
    out["skipped"] = len(events(full, "spike", "loss_spike", "nan"))
    q = full / "quarantine.jsonl"
    if q.exists():
        records = [json.loads(line) for line in q.read_text().splitlines()]
        out["quarantined"] = len({(s["source"], d["document"]) for r in records for s in r["samples"]
                                  for d in s["documents"]})  # fmt: skip
    a, b = losses(full), losses(resumed)
    final = f"checkpoints/step_{steps:08d}"
    wa, wb = weights(full / final), weights(resumed / final)
    same_weights = wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    if a == b and same_weights:
        out["result"] = "bitwise equal"
    else:
        first = next((s for s in sorted(a) if a[s] != b.get(s)), None)
        out["result"] = f"DIFFERS (losses from step {first})" if first else "DIFFERS (weights)"
    out["seconds"] = time.perf_counter() - started
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--stop", type=int, default=7)
    parser.add_argument("--cells", nargs="*", help="substrings of the cell names to run (default: all)")
    parser.add_argument("--keep", action="store_true", help="keep the run folders (printed)")
    args = parser.parse_args()
    if not 0 < args.stop < args.steps:
        parser.error("--stop must be between 0 and --steps")
    root = Path(tempfile.mkdtemp(prefix="exactness-"))
    data = build_data(root / "data")
    chosen = {k: v for k, v in cells(data).items() if not args.cells or any(c in k for c in args.cells)}
    print(f"{'cell':<28} {'result':<40} {'skipped':>7} {'quar. docs':>10} {'s':>6}")
    failed = 0
    for name, settings in chosen.items():
        row = run_cell(name, settings, data, args.steps, args.stop, root)
        failed += row["result"] != "bitwise equal"
        print(f"{name:<28} {row['result']:<40} {row['skipped']:>7} {row['quarantined']:>10} {row['seconds']:>6.0f}",
              flush=True)  # fmt: skip
    print(
        f"{len(chosen) - failed}/{len(chosen)} cells bitwise equal ({args.steps} steps, stopped at {args.stop})"
    )
    if args.keep:
        print(f"run folders: {root}")
    else:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
