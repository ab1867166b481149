"""Two-rank MoE scenarios, run under ``torchrun --nproc_per_node 2`` by tests/train/test_moe_training.py.

One launch runs them all (a process start costs seconds): each is a real ``llmtools.train.loop.train`` run
of the tiny MoE whose folder the test reads afterwards (metrics.jsonl, checkpoints).

    python -m torch.distributed.run --nproc_per_node 2 tests/train/moe_worker.py MIX OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

# name: (ZeRO stage, expert_parallel, save_every, resume from (scenario, step) or None)
SCENARIOS = {
    "ep2-zero2": (2, 2, 6, None),
    "ep2-zero2-resumed": (2, 2, 6, ("ep2-zero2", 6)),
    "ep2-zero1": (1, 2, 0, None),
    "ep2-zero3": (3, 2, 0, None),
    "zero2": (2, None, 6, None),
}


def moe_config(mix: str, expert_parallel: int | None = None, save_every: int = 0, **overrides):
    """The tiny MoE shrunk for tests: 2 layers of 4 experts (2 per token) over the byte vocabulary."""
    from llmtools.train.config import from_dict

    raw = {
        "model": {
            "preset": "tiny-moe",
            "vocab_size": 320,
            "num_hidden_layers": 2,
            "hidden_size": 96,
            "head_dim": 16,
            "num_experts": 4,
            "moe_intermediate_size": 64,
            **({"expert_parallel": expert_parallel} if expert_parallel else {}),
        },
        "data": {"mix": mix},
        "training": {"micro_batch_size": 4, "global_batch_size": 8, "train_steps": 12, "seed": 1234},
        "optimizer": {"lr": 3e-3, "weight_decay": 0.1},
        "schedule": {"kind": "cosine", "warmup_steps": 3, "total_steps": 12},
        "logging": {"log_every": 1},
        "checkpoint": {"save_every": save_every, "save_final": bool(save_every)},
    }
    for dotted, value in overrides.items():
        section, key = dotted.split("__")
        raw.setdefault(section, {})[key] = value
    return from_dict(raw, "moe-test.yaml")


def run(mix: str, out: Path, name: str, stage: int, ep: int | None, save_every: int, resume) -> None:
    from llmtools.train.deepspeed_config import load_ds_config
    from llmtools.train.loop import RunOptions, train

    spec = None
    if resume is not None:
        spec = str(out / resume[0] / "checkpoints" / f"step_{resume[1]:08d}")
    ds = load_ds_config(REPO / f"configs/deepspeed/zero{stage}.json")
    train(moe_config(mix, ep, save_every), ds, RunOptions(run_dir=out / name, quiet=True, resume=spec))


def main() -> None:
    mix, out = sys.argv[1], Path(sys.argv[2])
    for name, (stage, ep, save_every, resume) in SCENARIOS.items():
        run(mix, out, name, stage, ep, save_every, resume)


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
