"""Run under torchrun with 2 processes: DeepSpeed AutoTP training (``tensor_parallel.autotp_size: 2``)
shards our decoder on the CPU accelerator over gloo, and a step's loss equals the unsharded model's.
Prints one JSON line per rank."""

from __future__ import annotations

import json
import os

import deepspeed
import torch
import torch.distributed as dist

from llmtools.model import LlamaForCausalLM
from llmtools.model.config import ModelConfig


def main() -> None:
    dist.init_process_group("gloo")
    deepspeed.init_distributed(dist_backend="gloo")
    config = ModelConfig(vocab_size=320, hidden_size=96, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    reference = LlamaForCausalLM(config)
    reference.load_state_dict(model.state_dict())
    ds = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "tensor_parallel": {"autotp_size": 2},
        "zero_optimization": {"stage": int(os.environ.get("STAGE", "1"))},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
    batch = torch.randint(0, 320, (2, 33), generator=torch.Generator().manual_seed(1))
    loss = engine.module.loss(batch[:, :-1], batch[:, 1:])
    expected = reference.loss(batch[:, :-1], batch[:, 1:])
    engine.backward(loss)
    engine.step()
    q_proj = engine.module.model.layers[0].self_attn.q_proj
    print(json.dumps({"rank": dist.get_rank(), "loss": float(loss), "expected": float(expected),
                      "q_proj": list(q_proj.weight.shape)}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
    # Both ranks leave their last collective before either tears gloo down; then out without the native
    # teardown (a worker died there, SIGABRT, in whole-suite runs: see exit_without_native_teardown).
    from llmtools.train.distributed import barrier, destroy, exit_without_native_teardown

    barrier()
    destroy()
    exit_without_native_teardown(0)
