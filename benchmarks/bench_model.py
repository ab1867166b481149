"""llmtools' LLaMA decoder against transformers' on the same weights, and HF export speed.

Prints two tables, measured side by side in one run (the machine is shared: read the ratios):

1. training step time (forward + backward of the loss) of ``llmtools.model.LlamaForCausalLM`` vs
   ``transformers.LlamaForCausalLM`` (SDPA attention), interleaved rounds, median per step, in CPU
   seconds of this process (one thread), so that other load on the machine does not count;
2. writing a Hugging Face folder: ``save_hf_folder`` (streamed, sharded, fsynced) vs
   ``safetensors.torch.save_file`` of the whole state dict, with the RSS growth of each.

    python benchmarks/bench_model.py            # tiny and 125m shapes
    python benchmarks/bench_model.py --quick    # tiny only, fewer rounds
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 1e6


def step_times(preset: str, batch: int, seq: int, rounds: int, steps: int) -> dict[str, float]:
    import torch
    import transformers

    from llmtools.model.hf import to_hf_config
    from llmtools.model.llama import LlamaForCausalLM
    from llmtools.model.presets import load_model_config

    config = load_model_config(preset)
    torch.manual_seed(0)
    ours = LlamaForCausalLM(config)
    hf_config = transformers.AutoConfig.for_model(**to_hf_config(config))
    hf = transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation="sdpa")
    hf.load_state_dict(ours.state_dict())
    ids = torch.randint(0, config.vocab_size, (batch, seq + 1))

    def run_ours():
        ours.loss(ids[:, :-1], ids[:, 1:]).backward()

    def run_hf():
        hf(input_ids=ids[:, :-1], labels=ids[:, :-1]).loss.backward()

    times: dict[str, list[float]] = {"llmtools": [], "transformers": []}
    for fn in (run_ours, run_hf):  # warm-up
        fn()
    for _ in range(rounds):
        for name, fn in (("llmtools", run_ours), ("transformers", run_hf)):
            # CPU time of this process, not wall time: on a shared machine preemption would dominate.
            start = time.process_time()
            for _ in range(steps):
                fn()
            times[name].append((time.process_time() - start) / steps)
    return {name: statistics.median(values) for name, values in times.items()}


def export_times(preset: str) -> dict[str, tuple[float, float]]:
    from safetensors.torch import save_file

    from llmtools.model.hf import save_hf_folder
    from llmtools.model.llama import LlamaForCausalLM
    from llmtools.model.presets import load_model_config

    config = load_model_config(preset)
    model = LlamaForCausalLM(config)
    state = {
        k: v
        for k, v in model.state_dict().items()
        if not (k == "lm_head.weight" and config.tie_word_embeddings)
    }
    folder = Path(tempfile.mkdtemp(prefix="bench_model-"))
    try:
        before = rss_mb()
        start = time.perf_counter()
        save_hf_folder(model, config, folder / "ours", max_shard_size="200MB")
        ours = (time.perf_counter() - start, rss_mb() - before)
        before = rss_mb()
        start = time.perf_counter()
        save_file(
            {k: v.contiguous() for k, v in state.items()},
            folder / "ref.safetensors",
            metadata={"format": "pt"},
        )
        ref = (time.perf_counter() - start, rss_mb() - before)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"save_hf_folder": ours, "safetensors.save_file": ref}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shape only, few rounds (a smoke run)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    cases = [("tiny", 8, 128)] if args.quick else [("tiny", 8, 128), ("125m", 1, 128)]
    rounds, steps = (2, 2) if args.quick else (3, 2)
    print(
        f"# training step (fwd+bwd), CPU ms per step, median of {rounds} interleaved rounds x {steps} steps, "
        f"{torch.get_num_threads()} thread(s)"
    )
    print(f"{'preset':8} {'batch x seq':>12} {'llmtools ms':>12} {'transformers ms':>16} {'ratio':>7}")
    for preset, batch, seq in cases:
        t = step_times(preset, batch, seq, rounds, steps)
        print(
            f"{preset:8} {f'{batch} x {seq}':>12} {t['llmtools'] * 1e3:12.1f} {t['transformers'] * 1e3:16.1f} "
            f"{t['llmtools'] / t['transformers']:7.2f}"
        )
    preset = "tiny" if args.quick else "125m"
    print(f"\n# HF export of {preset} (fp32)")
    print(f"{'writer':24} {'seconds':>8} {'RSS growth MB':>14}")
    for name, (seconds, grown) in export_times(preset).items():
        print(f"{name:24} {seconds:8.2f} {grown:14.0f}")


if __name__ == "__main__":
    main()
