"""The reference model's log-probabilities for preference training: one pass before the first step, stored.

DPO compares the policy with the model it started from. Rather than keep a second, frozen model in memory
for the whole run (and run it on every micro-batch), the reference's answer log-probabilities are computed
once, with the starting weights, in one forward-only pass over the pairs (each rank a share of them; with
LoRA the adapters are switched off, which leaves exactly the frozen base), and then read with the batches.

Where they are kept: in the run folder, ``RUN/reference/`` (:mod:`llmtools.formats.reference`), not beside
the data. The run folder is the one place llm-train owns and writes: a data folder may be read-only or shared
by concurrent runs, and a run writing next to its inputs would be a surprise. Kept in the run, the reference
travels with the checkpoints that depend on it and is reused by every resume of the run without a second
pass. A sweep over ``dpo.beta`` (same weights, same data) can reuse one run's reference with
``dpo.reference: RUN/reference``. Either way a stored reference is used only if it was computed from the
same starting weights (sha256 over every parameter), model config, data files (sha256) and sequence length:
otherwise the run stops and says which of them differs, except that the run's own reference is computed again
when only the data differs (a resume with ``--reset-data`` onto new data; without it the trainer refuses the
change itself).

Every rank takes part (ZeRO-3 gathers parameters collectively); rank 0 alone reads and writes the folder and
shares what it found, so ranks on hosts that do not share the run folder agree.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from pathlib import Path

import numpy as np

from llmtools.errors import InputError
from llmtools.train.tasks.base import RunContext

REFERENCE_DIR = "reference"
# What may differ in the run's own stored reference and still be replaced by a fresh pass: the data (the trainer
# refuses changed data on resume unless --reset-data asks for it). Other starting weights are refused: a
# checkpoint of the run was trained against the stored reference.
RECOMPUTABLE = {"data", "seq_length"}


def weights_sha256(module, lora: bool) -> str:
    """sha256 over the name, shape, dtype and bytes of every parameter, in order (the frozen base alone when
    ``lora``: the adapters are not part of the reference). Collective under ZeRO-3 (each parameter is
    gathered in turn), so every rank must call it."""
    import torch

    from llmtools.model.lora import is_adapter_name

    digest = hashlib.sha256()
    for name, param in module.named_parameters():
        if lora and is_adapter_name(name):
            continue
        with _gathered(param):
            tensor = param.detach().to("cpu").contiguous()
        digest.update(f"{name}\0{tuple(tensor.shape)}\0{tensor.dtype}\n".encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy())  # hashed in place, no copy
    return digest.hexdigest()


def _gathered(param):
    if hasattr(param, "ds_id"):  # a ZeRO-3 partition: the whole parameter exists only inside this block
        from llmtools.thirdparty import import_deepspeed

        deepspeed = import_deepspeed()

        return deepspeed.zero.GatheredParameters([param], modifier_rank=None)
    return contextlib.nullcontext()


def data_identity(data) -> dict:
    """The pairs a reference is computed over: their count and the sha256 of every file, by file name."""
    from llmtools.fsutil import sha256_file

    return {
        "prefix": data.prefix,  # for people; not compared (a moved data folder still matches)
        "pairs": data.pairs,
        "files": {path.name: sha256_file(path) for path in data.dataset.files()},
    }


def reference_logps(
    model, data, run: RunContext, *, lora: bool, stored: str | None
) -> tuple[np.ndarray, str]:
    """The reference log-probs of every pair of ``data`` (float64, pairs x 2) and the sha256 of the starting
    weights they belong to: read from ``stored`` (``dpo.reference``) or ``RUN/reference`` when it holds them
    for exactly this run's starting weights and data, else computed now and stored in ``RUN/reference``."""
    from llmtools.formats import reference as ref_file

    module = getattr(model, "module", model)
    weights = weights_sha256(module, lora)
    folder = Path(stored) if stored else run.run_dir / REFERENCE_DIR
    decision: dict = {}
    if run.rank == 0:
        identity = {
            "weights": {"sha256": weights, "lora_base_only": lora},
            "model": module.config.to_dict(),
            "data": data_identity(data),
            "seq_length": data.seq_length,
        }
        decision = {"identity": identity, "action": "compute", "error": None, "why": ""}
        try:
            if ref_file.exists(folder):
                decision["logps"] = ref_file.read_reference(folder, identity)
                decision["action"] = "load"
            elif stored:
                raise InputError(
                    f"dpo.reference: {stored}: holds no stored reference (reference.json); leave dpo.reference "
                    "out to compute one in the run folder"
                )
        except ref_file.ReferenceMismatch as error:
            if stored or not set(error.parts) <= RECOMPUTABLE:
                decision["error"] = str(error) + ("" if stored else f"; remove {folder} to compute it again")
            else:  # the run's own, over data it no longer reads (--reset-data): computed again below
                decision["why"] = f" ({folder} was computed over other {' and '.join(error.parts)})"
        except InputError as error:
            decision["error"] = str(error) + ("" if stored else f"; remove {folder} to compute it again")
    decision = _share(decision, run)
    if decision["error"]:
        raise InputError(decision["error"])
    if decision["action"] == "load":
        run.log(f"reference log-probs of {data.pairs} pairs from {folder} (same starting weights and data)")
        return _share_array(decision.get("logps"), (data.pairs, 2), run), weights
    run.log(
        f"reference log-probs: one forward pass over {data.pairs} pairs with the starting weights"
        + (" (LoRA adapters off)" if lora else "")
        + f" -> {folder}{decision['why']}"
    )
    logps = compute_reference_logps(model, data, run, lora=lora)
    if run.rank == 0:
        ref_file.write_reference(folder, logps, decision["identity"])
    _barrier()
    return logps, weights


def compute_reference_logps(model, data, run: RunContext, *, lora: bool) -> np.ndarray:
    """Every pair's summed answer log-probs under ``model`` as it is now (no gradients, eval mode; LoRA
    adapters off when ``lora``): rank ``r`` takes pairs ``r, r + world, ...`` in micro-batches, and every rank
    gets the whole (pairs x 2) float64 array. Every rank runs the same number of forwards (ZeRO-3)."""
    import torch

    from llmtools.model.lora import adapters_disabled
    from llmtools.train.tasks.dpo import pair_logps

    module = getattr(model, "module", model)
    micro, world = max(1, run.micro_batch_size), max(1, run.world_size)
    mine = np.arange(run.rank, data.pairs, world)
    steps = math.ceil(math.ceil(data.pairs / world) / micro)
    found = np.full((steps * micro, 3), -1.0)  # pair index, chosen, rejected; index -1 = nothing
    training = module.training
    model.eval()
    bar = _progress(steps, run)
    try:
        with torch.no_grad(), adapters_disabled(module) if lora else contextlib.nullcontext():
            for s in range(steps):
                rows = mine[s * micro : (s + 1) * micro]
                chosen, rejected, _ = pair_logps(
                    model, data.pair_batch(rows if rows.size else [0]), run.device
                )
                if rows.size:
                    found[s * micro : s * micro + rows.size] = np.stack(
                        [rows, chosen.double().cpu().numpy(), rejected.double().cpu().numpy()], axis=1
                    )
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        model.train(training)
    everything = _all_gather(found, run)
    logps = np.full((data.pairs, 2), np.nan)
    for row in everything[everything[:, 0] >= 0]:
        logps[int(row[0])] = row[1:]
    if not np.isfinite(logps).all():
        raise RuntimeError("reference pass: some pairs got no (or a non-finite) log-probability")
    return logps


def _progress(total: int, run: RunContext):
    if run.rank != 0 or run.quiet:
        return None
    from llmtools.progress import Progress

    return Progress(total, "reference log-probs", unit="batch")


def _distributed(run: RunContext) -> bool:
    import torch.distributed as dist

    return run.world_size > 1 and dist.is_initialized()


def _share(obj: dict, run: RunContext) -> dict:
    """Rank 0's ``obj`` (without arrays) on every rank."""
    if not _distributed(run):
        return obj
    import torch.distributed as dist

    box = [{k: v for k, v in obj.items() if k != "logps"} if run.rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return {**box[0], **({"logps": obj.get("logps")} if run.rank == 0 else {})}


def _share_array(array: np.ndarray | None, shape: tuple[int, int], run: RunContext) -> np.ndarray:
    """Rank 0's float64 array on every rank."""
    if not _distributed(run):
        return array
    import torch
    import torch.distributed as dist

    tensor = torch.from_numpy(array) if run.rank == 0 else torch.empty(shape, dtype=torch.float64)
    tensor = tensor.to(run.device)
    dist.broadcast(tensor, src=0)
    return tensor.cpu().numpy()


def _all_gather(array: np.ndarray, run: RunContext) -> np.ndarray:
    if not _distributed(run):
        return array
    import torch
    import torch.distributed as dist

    local = torch.from_numpy(array).to(run.device)
    parts = [torch.empty_like(local) for _ in range(run.world_size)]
    dist.all_gather(parts, local)
    return torch.cat(parts).cpu().numpy()


def _barrier() -> None:
    from llmtools.train.distributed import barrier

    barrier()
