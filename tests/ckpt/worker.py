"""A tiny, fully deterministic DeepSpeed training loop used by the checkpoint tests.

Run in-process (world size 1, gloo over a HashStore) or as a script under ``torchrun`` (1 or 2 ranks). The
data stream depends only on the global sample index and a dropout layer draws from torch's global RNG, so
a resumed run equals the uninterrupted one bitwise only if model, optimizer, scheduler, data position and
RNG states are all restored.

Script use (prints nothing on stdout; appends ``step loss`` lines to --losses, writes final weights):
    python tests/ckpt/worker.py --run-dir DIR --zero 2 --steps 6 --save-every 2 --resume auto \
        (losses to RUN/losses.txt, final weights to RUN/final.pt)
"""

from __future__ import annotations

import argparse
import atexit
import os
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")

GLOBAL_BATCH = 4
MICRO_BATCH = 2
DIM = 7
HIDDEN = 13


def init_dist() -> None:
    """One process without a launcher: gloo over a HashStore (no port); under torchrun: env:// rendezvous."""
    import torch
    import torch.distributed as tdist

    torch.set_num_threads(1)
    if tdist.is_initialized():
        return
    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
        tdist.init_process_group("gloo")
    else:
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        tdist.init_process_group("gloo", store=tdist.HashStore(), rank=0, world_size=1)
    # Torn down while Python is alive: a gloo group left to interpreter finalization can abort the process.
    atexit.register(lambda: tdist.is_initialized() and tdist.destroy_process_group())
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # skip the ~90 s shm op build


def make_model(dropout: float):
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = torch.nn.Linear(DIM, HIDDEN)
            self.drop = torch.nn.Dropout(dropout)
            self.out = torch.nn.Linear(HIDDEN, DIM)

        def forward(self, x):
            return self.out(self.drop(torch.tanh(self.inp(x))))

    return Net()


# what build_engine made in this process and has not released: DeepSpeed never frees an engine itself
LIVE_ENGINES: list = []


def ds_config(zero: int, world: int) -> dict:
    return {
        "train_batch_size": GLOBAL_BATCH,
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": GLOBAL_BATCH // (MICRO_BATCH * world),
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01, "torch_adam": True}},
        "scheduler": {
            "type": "WarmupDecayLR",
            "params": {
                "warmup_min_lr": 0.0,
                "warmup_max_lr": 1e-2,
                "warmup_num_steps": 3,
                "total_num_steps": 40,
            },
        },
        "zero_optimization": {"stage": zero},
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def build_engine(zero: int, seed: int = 1234, dropout: float = 0.1):
    import numpy as np
    import torch
    import torch.distributed as tdist

    init_dist()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    world = tdist.get_world_size()
    return initialize(make_model(dropout), ds_config(zero, world))


def initialize(model, config: dict):
    """``deepspeed.initialize`` for every engine a test builds in this process, so each is released."""
    import deepspeed

    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    LIVE_ENGINES.append(engine)
    return engine


def release_engines() -> None:
    """Free the engines built so far in this process (tests/conftest.py does it after every test)."""
    from llmtools.train.engine import release_engine

    while LIVE_ENGINES:
        release_engine(LIVE_ENGINES.pop())


def sample(index: int):
    import torch

    gen = torch.Generator().manual_seed(10_000 + index)
    x = torch.randn(DIM, generator=gen)
    return x, torch.sin(3 * x)


def train_step(engine, step: int) -> float:
    """Step ``step`` (1-based) consumes global samples [(step-1)*GB, step*GB); returns the global mean loss."""
    import torch
    import torch.distributed as tdist

    rank, world = tdist.get_rank(), tdist.get_world_size()
    per_rank = GLOBAL_BATCH // world
    first = (step - 1) * GLOBAL_BATCH + rank * per_rank
    total = torch.zeros(1, dtype=torch.float64)
    for micro in range(per_rank // MICRO_BATCH):
        idx = [first + micro * MICRO_BATCH + j for j in range(MICRO_BATCH)]
        xs, ys = zip(*(sample(i) for i in idx), strict=True)
        x, y = torch.stack(xs), torch.stack(ys)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        total += loss.detach().double()
    tdist.all_reduce(total)
    return float(total.item() / (GLOBAL_BATCH // MICRO_BATCH))


def client_state(step: int) -> dict:
    return {
        "step": step,
        "consumed_samples": step * GLOBAL_BATCH,
        "consumed_tokens": step * GLOBAL_BATCH * DIM,
        "config_hash": "test",
        "model": {"hidden_size": HIDDEN, "vocab_size": DIM},
        "tokenizer": None,
        "data_fingerprint": "sin3x",
    }


def full_weights(engine) -> dict:
    """Every parameter, gathered (ZeRO-3) and cloned, in fp32."""
    import deepspeed

    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(
        params, modifier_rank=None, enabled=engine.zero_optimization_stage() == 3
    ):
        return {name: p.detach().clone().float() for name, p in engine.module.named_parameters()}


TINY_LLAMA = {
    "vocab_size": 67,
    "hidden_size": 32,
    "intermediate_size": 56,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}


def build_llama_engine(zero: int, model: dict | None = None, seed: int = 1234):
    """A DeepSpeed engine around the project's LlamaForCausalLM (a tiny shape; odd sizes on purpose)."""
    import torch
    import torch.distributed as tdist

    from llmtools.model import LlamaForCausalLM, load_model_config

    init_dist()
    torch.manual_seed(seed)
    config = load_model_config(dict(model or TINY_LLAMA))
    net = LlamaForCausalLM(config)
    return initialize(net, ds_config(zero, tdist.get_world_size()))


def llama_step(engine, step: int, seq: int = 12) -> float:
    import torch

    vocab = engine.module.config.vocab_size
    total = 0.0
    for micro in range(engine.gradient_accumulation_steps()):
        gen = torch.Generator().manual_seed(step * 100 + micro)
        tokens = torch.randint(0, vocab, (MICRO_BATCH, seq + 1), generator=gen)
        logits = engine(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        engine.backward(loss)
        engine.step()
        total += float(loss)
    return total


def _install_crash(spec: str) -> None:
    """``STEP:PHASE``: SIGKILL this process inside the save of STEP, at PHASE:
    write (in the middle of writing its files: with --async, in the background thread while training goes
    on), hash (every file written and hashed, meta.json not yet), rename (meta.json written, folder not yet
    renamed), latest (renamed, ``latest`` not yet updated)."""
    import signal

    from llmtools.ckpt import manager as mod
    from llmtools.ckpt import writer as writer_mod

    step_text, phase = spec.split(":")
    target = mod.layout.step_name(int(step_text))
    module = writer_mod if phase == "write" else mod
    names = {
        "write": "write_file",
        "hash": "atomic_file",
        "rename": "fsync_dir",
        "latest": "write_text_atomic",
    }
    original = getattr(module, names[phase])

    def wrapper(*args, **kwargs):
        # write, hash and rename are called with a path inside / of the temporary folder; latest with its text
        if target in str(args[1] if phase in ("latest", "write") else args[0]):
            if phase == "write":  # half of a file on disk, then gone
                with open(args[1], "wb") as handle:
                    handle.write(b"PK" + bytes(1000))
            os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)

    setattr(module, names[phase], wrapper)


def train(args, zero: int, run_dir: str, losses_path: str, weights_path: str) -> None:
    import time

    import torch
    import torch.distributed as tdist

    from llmtools.ckpt.manager import CheckpointManager
    from llmtools.ckpt.signals import StopRequested

    engine = build_engine(zero, dropout=args.dropout)
    manager = CheckpointManager(
        run_dir, keep_last=args.keep_last, async_save=getattr(args, "async_save", False)
    )
    start = 0
    if args.resume:
        path = manager.resolve(args.resume)
        if path is not None:
            state = manager.load(engine, path)
            start = int(state["step"])
    rank = tdist.get_rank()
    losses = open(losses_path, "a", encoding="utf-8") if (losses_path and rank == 0) else None  # noqa: SIM115
    with StopRequested(announce=False) as stop:
        for step in range(start + 1, args.steps + 1):
            loss = train_step(engine, step)
            if losses:
                losses.write(f"{step} {loss!r}\n")
                losses.flush()
            if args.step_sleep:
                time.sleep(args.step_sleep)
            stopping = stop.should_stop()
            if (args.save_every and step % args.save_every == 0) or stopping:
                saved = manager.save(engine, step, client_state(step), blocking=True if stopping else None)
            else:
                manager.poll()
            if stopping:
                print(stop.resume_hint("worker", str(saved)), file=sys.stderr)
                break
    manager.wait()
    weights = full_weights(engine)
    if weights_path and rank == 0:
        torch.save(weights, weights_path)


def matrix(args) -> None:
    """Exact resume for every ZeRO stage at this world size, in this process; results to --out JSON."""
    import json

    import numpy as np
    import torch
    import torch.distributed as tdist

    from llmtools.ckpt.manager import CheckpointManager

    results = {}
    for zero in args.zeros:
        manager = CheckpointManager(os.path.join(args.run_dir, f"matrix_z{zero}"))
        reference = build_engine(zero)
        losses = []
        for step in range(1, 7):
            losses.append(train_step(reference, step))
            if step == 3:
                manager.save(reference, 3, client_state(3))
        expected = full_weights(reference)
        resumed = build_engine(zero, seed=999)
        random.seed(5), np.random.seed(5), torch.manual_seed(5)
        state = manager.load(resumed, manager.resolve("auto"))
        again = [train_step(resumed, step) for step in range(state["step"] + 1, 7)]
        got = full_weights(resumed)
        results[zero] = {
            "losses_equal": again == losses[3:],
            "weights_equal": all(torch.equal(got[k], expected[k]) for k in expected),
        }
    if tdist.get_rank() == 0:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(results, handle)


def reference_run(zero: int, run_dir: str, steps: int = 6, save_at: int = 3, dropout: float = 0.0) -> tuple:
    """Train ``steps`` steps, saving at ``save_at``; returns (losses by step, final weights)."""
    from llmtools.ckpt.manager import CheckpointManager

    engine = build_engine(zero, dropout=dropout)
    manager = CheckpointManager(run_dir)
    losses = {}
    for step in range(1, steps + 1):
        losses[step] = train_step(engine, step)
        if step == save_at:
            manager.save(engine, step, client_state(step))
    return losses, full_weights(engine)


def resumed_run(zero: int, run_dir: str, spec: str, steps: int = 6, dropout: float = 0.0) -> tuple:
    """Resume from ``spec`` in ``run_dir`` and train to ``steps``; returns (losses by step, final weights)."""
    from llmtools.ckpt.manager import CheckpointManager

    engine = build_engine(zero, seed=999, dropout=dropout)
    manager = CheckpointManager(run_dir)
    state = manager.load(engine, manager.resolve(spec))
    losses = {step: train_step(engine, step) for step in range(int(state["step"]) + 1, steps + 1)}
    return losses, full_weights(engine)


def dist_scenario(args) -> None:
    """Everything the 2-rank tests need from one launch (process starts are the expensive part):
    the exact-resume matrix, 2-rank reference runs saved at step 3 (for 2 -> 1), and resumes of the
    1-rank checkpoints in --from-w1 (1 -> 2). Results as JSON in --out."""
    import json

    import torch.distributed as tdist

    matrix(args)
    results: dict = {"reference": {}, "from_w1": {}}
    for zero in (2, 3):
        losses, _ = reference_run(zero, os.path.join(args.run_dir, f"w2_z{zero}"))
        results["reference"][zero] = losses
        if args.from_w1:
            source = os.path.join(args.from_w1, f"z{zero}", "checkpoints", "step_00000003")
            losses, _ = resumed_run(zero, os.path.join(args.run_dir, f"from_w1_z{zero}"), source)
            results["from_w1"][zero] = losses
    if tdist.get_rank() == 0:
        with open(args.out, encoding="utf-8") as handle:
            results["matrix"] = json.load(handle)
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(results, handle)


def run(args) -> int:
    if args.scenario:
        dist_scenario(args)
        return 0
    if args.crash_at:
        _install_crash(args.crash_at)
    if args.matrix:
        matrix(args)
        return 0
    for zero in args.zeros:
        suffix = f"z{zero}" if len(args.zeros) > 1 else ""
        run_dir = os.path.join(args.run_dir, suffix) if suffix else args.run_dir
        os.makedirs(run_dir, exist_ok=True)
        losses = os.path.join(run_dir, "losses.txt") if args.losses == "auto" else args.losses
        weights = os.path.join(run_dir, "final.pt") if args.weights == "auto" else args.weights
        train(args, zero, run_dir, losses, weights)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--zero", dest="zeros", type=lambda t: [int(z) for z in t.split(",")], default=[2])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--save-every", type=int, default=0)
    parser.add_argument("--keep-last", type=int, default=None)
    parser.add_argument("--resume", default="")
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--losses", default="auto", help="file, or auto: RUN/losses.txt")
    parser.add_argument("--weights", default="auto", help="file, or auto: RUN/final.pt")
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument(
        "--crash-at", default="", help="STEP:write|hash|rename|latest - SIGKILL inside that save"
    )
    parser.add_argument("--async", dest="async_save", action="store_true", help="background saves")
    parser.add_argument("--matrix", action="store_true")
    parser.add_argument("--out", default="")
    parser.add_argument("--scenario", action="store_true")
    parser.add_argument("--from-w1", default="")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    # Out without the native teardown, as llm-train ends (exit_without_native_teardown says why); the
    # process group goes with the atexit handler registered above.
    from llmtools.train.distributed import exit_without_native_teardown

    exit_without_native_teardown(main() or 0)
