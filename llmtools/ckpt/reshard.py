"""Change of world size: DeepSpeed universal checkpoints.

A ZeRO-1/2/3 checkpoint stores each rank's partition of the fp32 master weights and Adam moments, so it
loads only at the world size that saved it. DeepSpeed's ``ds_to_universal`` rewrites it as one file per
parameter (fp32 weight, exp_avg, exp_avg_sq), which an engine of any world size loads with
``load_universal``. Model, optimizer and scheduler state are kept; RNG states are per rank and are not
(the data position is: consumed samples count global samples, which do not depend on the world size).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from llmtools.ckpt import dist, dstool, layout, safeload, tensor_shards
from llmtools.errors import DiskFullError, InputError, LlmtoolsError, RuntimeFailure
from llmtools.fsutil import FULL_MARGIN, TMP_MARK, free_bytes


def needs_universal(saved_partitions: int, partitions: int, saved_stage: int, stage: int) -> bool:
    """Whether a checkpoint loads only through a universal checkpoint: ZeRO partitioned its state over
    another number of ranks, or another stage saved it (ZeRO-0 keeps whole copies, loadable anywhere)."""
    return (saved_partitions != partitions and saved_stage > 0) or saved_stage != stage


def _saved_sequence(meta: dict[str, Any]) -> int:
    config = meta.get("config")
    parallel = config.get("parallel") if isinstance(config, dict) else None
    value = parallel.get("sequence") if isinstance(parallel, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


def check_layout(
    meta: dict[str, Any], where: Path, *, world: int, stage: int, tensor: int = 1, sequence: int = 1
) -> None:
    """Refuse, before any work, a checkpoint this layout (``world`` ranks, ZeRO-``stage``, the tensor and
    sequence degrees) cannot load, naming the layouts that resume it. What loads here is what
    :meth:`~llmtools.ckpt.manager.CheckpointManager.load` loads: the same ZeRO partitions as saved, or a
    conversion through DeepSpeed's universal checkpoint, which reads model-parallel files as tensor-parallel
    shards and so cannot take a sequence- or tensor-parallel checkpoint to another partition count."""
    if meta.get("init_only"):
        return  # weights only: every layout loads them
    try:
        saved_world = int(meta["world_size"])
        saved_parts = int(meta.get("dp_world_size") or saved_world)
        saved_stage = int(meta["zero_stage"])
    except (KeyError, TypeError, ValueError):
        return  # an older or partial meta.json: the load names what is missing
    saved_tensor, saved_sequence = tensor_shards.degree(meta), _saved_sequence(meta)
    parts = world // max(tensor, 1)
    if not needs_universal(saved_parts, parts, saved_stage, stage):
        return
    if saved_tensor > 1:
        kind = f"a tensor-parallel checkpoint (parallel.tensor {saved_tensor})"
        why = "its model files are tensor-parallel shards"
    elif saved_sequence > 1:
        kind = f"a sequence-parallel checkpoint (parallel.sequence {saved_sequence})"
        why = "DeepSpeed's universal conversion reads its files as tensor-parallel shards"
    elif sequence > 1 or tensor > 1:
        kind = "a checkpoint"
        why = "DeepSpeed's universal loader cannot load into a sequence- or tensor-parallel run"
    else:
        return
    same = f"ZeRO-{saved_stage} on {saved_world} rank(s)"
    if saved_tensor > 1:
        same += f" with parallel.tensor {saved_tensor}"
    elif saved_world > 1:
        same += f" (any parallel.sequence dividing {saved_world})"
    if saved_tensor == 1 and saved_sequence == 1:
        same += f", or on {world} rank(s) with parallel.sequence 1 and parallel.tensor 1"
    raise InputError(
        f"{where}: {kind} saved with ZeRO-{saved_stage} over {saved_world} rank(s) cannot be resharded for "
        f"ZeRO-{stage} over {world} rank(s) with parallel.sequence {sequence} ({why}); the checkpoint is whole "
        f"and nothing was changed: resume it with {same}, or start a new run from its weights (llm-ckpt "
        "convert --to hf, then model.init_from)"
    )


def to_universal(ckpt: str | os.PathLike, out_dir: str | os.PathLike, zero_stage: int) -> Path:
    """Run DeepSpeed's converter (in a child process: it prints on stdout and may fork workers).

    Every ``.pt`` of ``ckpt`` is checked here first, and the child reads them through
    :func:`llmtools.ckpt.safeload.load` (:mod:`llmtools.ckpt.dstool`).
    """
    out_dir = Path(out_dir)
    from llmtools.ckpt.verify import check_pickles

    check_pickles(ckpt)  # the error names the file; the child's loads are routed through safeload as well
    command = [
        sys.executable,
        "-m",
        "llmtools.ckpt.dstool",
        "deepspeed.checkpoint.ds_to_universal",
        "--input_folder",
        str(ckpt),
        "--output_folder",
        str(out_dir),
        "--num_extract_workers",
        "1",
        "--num_merge_workers",
        "1",
    ]
    if zero_stage <= 2:
        # ZeRO-1/2 checkpoints lack a few keys the converter insists on; DeepSpeed can fill them in.
        command.append("--inject_missing_state")
    env = dict(os.environ)
    env.setdefault("DS_ACCELERATOR", "cpu")
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    if done.returncode == dstool.INPUT_ERROR:
        raise InputError(
            dstool.input_error(done.stdout) or f"{ckpt}: DeepSpeed's ds_to_universal refused a file"
        )
    if done.returncode != 0:
        tail = "\n".join(done.stdout.strip().splitlines()[-5:])
        free = free_bytes(out_dir)
        if free is not None and free < FULL_MARGIN:  # the converter's torch.save says "unexpected pos"
            raise DiskFullError(out_dir, f"{free} bytes free; DeepSpeed's ds_to_universal stopped")
        raise RuntimeFailure(f"{ckpt}: DeepSpeed's ds_to_universal failed (exit {done.returncode}): {tail}")
    # The converter leaves the model-states files of the source behind in the output; our meta.json and
    # RNG files are not part of a universal checkpoint.
    return out_dir


def load_resharded(engine, path: Path, meta: dict[str, Any], load_optimizer_states: bool = True) -> dict:
    """Convert ``path`` to universal form (rank 0), load it into ``engine`` (all ranks), clean up: the
    checkpoints folder is left as it was whether the load succeeds or fails."""
    universal = path.parent / f"{path.name}{TMP_MARK}universal"
    pointer = universal.parent / "latest_universal"  # written by ds_to_universal beside its output
    before = pointer.read_bytes() if dist.rank() == 0 and pointer.is_file() else None
    try:
        return _load_universal(engine, path, universal, meta, load_optimizer_states)
    finally:
        dist.barrier()
        if dist.rank() == 0:
            shutil.rmtree(universal, ignore_errors=True)
            if before is not None:
                pointer.write_bytes(before)
            elif pointer.is_file():
                pointer.unlink()


def _load_universal(
    engine, path: Path, universal: Path, meta: dict[str, Any], load_optimizer_states: bool
) -> dict:
    error: LlmtoolsError | None = None
    if dist.rank() == 0:
        shutil.rmtree(universal, ignore_errors=True)
        print(
            f"resharding {path} (saved by {meta['world_size']} ranks) for {dist.world_size()} ranks "
            "through a DeepSpeed universal checkpoint",
            file=sys.stderr,
            flush=True,
        )
        try:
            to_universal(path, universal, int(meta["zero_stage"]))
        except LlmtoolsError as failure:  # every rank raises it alike
            error = failure
    error = dist.broadcast(error)
    if error is not None:
        raise error
    config = engine._config
    previous = config.load_universal_checkpoint
    config.load_universal_checkpoint = True
    try:
        with safeload.routed_torch_load():  # the universal loader reads with torch.load(weights_only=False)
            load_path, client_state = engine.load_checkpoint(
                str(universal.parent),
                tag=universal.name,
                load_optimizer_states=load_optimizer_states,
                load_lr_scheduler_states=load_optimizer_states,
            )
    finally:
        config.load_universal_checkpoint = previous
    if load_path is None:
        raise RuntimeFailure(f"{path}: DeepSpeed could not load the universal form of this checkpoint")
    if not client_state or "step" not in client_state:
        client_state = _client_state_of(path)
    return client_state


def _client_state_of(path: Path) -> dict:
    """The trainer's keys from the original model-states file (read lazily: no weights are loaded)."""
    from llmtools.ckpt.torchfile import LazyTensor, load_lazy

    state = load_lazy(layout.model_states_file(path))
    internal = {"module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params"}
    internal |= {
        "frozen_param_fragments",
        "lr_scheduler",
        "data_sampler",
        "random_ltd",
        "sparse_tensor_module_names",
    }
    internal |= {
        "skipped_steps",
        "global_steps",
        "global_samples",
        "dp_world_size",
        "mp_world_size",
        "ds_config",
    }
    internal |= {"ds_version"}
    return {k: v for k, v in state.items() if k not in internal and not isinstance(v, LazyTensor)}
