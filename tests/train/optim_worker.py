"""Two-rank optimizer scenarios, run under ``torchrun --nproc_per_node 2`` by tests/train/test_optimizers.py.

One launch runs them all (a process start costs seconds): each is a real ``llmtools.train.loop.train`` run
of the tiny model whose folder the test reads afterwards (metrics.jsonl, checkpoints). With two ranks ZeRO
cuts the flat parameter buffer in the middle of a matrix, which Muon must gather whole.

    python -m torch.distributed.run --nproc_per_node 2 tests/train/optim_worker.py MIX OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

# name: (optimizer, ZeRO stage)
SCENARIOS = {"muon-zero2": ("muon", 2), "muon-zero1": ("muon", 1)}
STEPS = 8


def scenario_config(mix: str, optimizer: str, **overrides):
    """The config every scenario runs, on two ranks here and on one rank by the test."""
    from tests.train.conftest import tiny_config

    extra = {"optimizer__lr": 1e-3, "optimizer__weight_decay": 0.5} if optimizer == "lion" else {}
    # 3 layers with a 320-wide MLP: the hidden matrices' flat buffer (3 x 116,736 elements) splits between
    # the two ranks inside layer 1's up_proj, so that matrix has a piece on each rank.
    return tiny_config(
        mix,
        model__num_hidden_layers=3,
        model__intermediate_size=320,
        optimizer__name=optimizer,
        training__train_steps=STEPS,
        **extra,
        **overrides,
    )


def main() -> None:
    from llmtools.train.deepspeed_config import load_ds_config
    from llmtools.train.loop import RunOptions, train

    mix, out = sys.argv[1], Path(sys.argv[2])
    for name, (optimizer, stage) in SCENARIOS.items():
        ds = load_ds_config(REPO / f"configs/deepspeed/zero{stage}.json")
        train(scenario_config(mix, optimizer), ds, RunOptions(run_dir=out / name, quiet=True))


def end() -> None:
    """Every rank done before any tears gloo down; then out without the native teardown, as llm-train
    ends (``exit_without_native_teardown`` says why)."""
    from llmtools.train.distributed import barrier, destroy, exit_without_native_teardown

    barrier()
    destroy()
    exit_without_native_teardown(0)


if __name__ == "__main__":
    main()
    end()
