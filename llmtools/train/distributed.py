"""One process without a launcher, or many under deepspeed / torchrun / srun: find out which, and set up.

Under a launcher, RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT are in the environment
(deepspeed and torchrun set them). Under torchrun's elastic agent the workers share the agent's store
across restarts; they take a fresh namespace in it per round (:mod:`~llmtools.train.rendezvous`). Under ``srun`` they are derived from SLURM_* (the first host of the
allocation is the master). Alone, a one-rank gloo group over an in-memory store is made, which needs no
port. Gloo is used on CPU, NCCL on CUDA. The process group is created here, before DeepSpeed sees it, so
DeepSpeed neither probes MPI nor builds its shared-memory comm op (a ~90 s C++ build on CPU machines).
"""

from __future__ import annotations

import atexit
import datetime
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import NoReturn

from llmtools.errors import RuntimeFailure, UsageError
from llmtools.train.device import process_group_backend
from llmtools.train.rendezvous import round_store


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: str  # "cpu" or "cuda:N"
    launcher: str  # none | torchrun/deepspeed | srun

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"environment variable {name}={value!r} is not an integer") from None


def _slurm_master() -> str:
    nodes = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST") or "localhost"
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodes], capture_output=True, text=True, check=True
        )
        return out.stdout.split()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return nodes.split(",")[0].split("[")[0]


def detect_environment() -> str:
    """Fill RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* for the current launcher; returns the launcher's name."""
    if _env_int("RANK") is not None and _env_int("WORLD_SIZE") is not None:
        os.environ.setdefault("LOCAL_RANK", os.environ.get("LOCAL_RANK", "0"))
        return "launcher"
    if _env_int("SLURM_PROCID") is not None and _env_int("SLURM_NTASKS") is not None:
        os.environ["RANK"] = os.environ["SLURM_PROCID"]
        os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
        os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
        os.environ.setdefault("MASTER_ADDR", _slurm_master())
        os.environ.setdefault("MASTER_PORT", str(29500 + (_env_int("SLURM_JOB_ID") or 0) % 1000))
        return "srun"
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
    return "none"


DEFAULT_TIMEOUT_S = 600.0


def _agent_store_shared() -> bool:
    """Whether torchrun's agent hosts the store the workers share across restart rounds."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def init_distributed(timeout_s: float = DEFAULT_TIMEOUT_S) -> DistInfo:
    """Create the process group (idempotent) and return who we are.

    ``timeout_s`` bounds the set-up and every collective afterwards (gloo and NCCL both honour it).
    """
    import torch
    import torch.distributed as dist

    launcher = detect_environment()
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    cuda = torch.cuda.is_available()
    backend = process_group_backend("cuda" if cuda else "cpu")
    if cuda:
        # srun --gpus-per-task=1 (or --gpu-bind) shows each task only its own device(s): index modulo what is seen.
        index = local % torch.cuda.device_count()
        torch.cuda.set_device(index)
        device = f"cuda:{index}"
        # Told, NCCL binds this rank's communicator to its device instead of guessing it from the global
        # rank (a warning, and a hang where ranks map to devices unevenly).
        bound = {"device_id": torch.device(device)}
    else:
        device, bound = "cpu", {}
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        _skip_ds_shm_op()
        # One thread per rank on small CPU machines, unless the user chose: oversubscription makes step times
        # swing by 100x.
        if "OMP_NUM_THREADS" not in os.environ:
            # Ranks on this node share its cores (SLURM_NTASKS_PER_NODE may read "2(x3)": then the world size).
            per_node = _env_int("LOCAL_WORLD_SIZE")
            if per_node is None and os.environ.get("SLURM_NTASKS_PER_NODE", "").isdigit():
                per_node = int(os.environ["SLURM_NTASKS_PER_NODE"])
            per_node = per_node or world
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(per_node, 1)))
    if not dist.is_initialized():
        timeout = datetime.timedelta(seconds=timeout_s)
        try:
            if world == 1 and "MASTER_ADDR" not in os.environ:  # alone: no rendezvous, no port
                store = dist.HashStore()
                dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timeout, **bound)
            elif _agent_store_shared():
                store = round_store(
                    os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), rank, world, timeout_s
                )
                dist.init_process_group(
                    backend, store=store, rank=rank, world_size=world, timeout=timeout, **bound
                )
            else:
                dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout, **bound)
        except (RuntimeError, ValueError) as error:
            raise RuntimeFailure(
                f"could not initialise the {backend} process group (rank {rank}/{world}): {error}"
            ) from None
        _default_group_timeout(timeout)
        # A gloo group still alive when the interpreter finalizes can abort the process at exit
        # ("terminate called without an active exception") after all its work succeeded: whoever
        # called us (a script of the user's, not only llm-train) gets it torn down while Python is alive.
        atexit.register(destroy)
    return DistInfo(rank, world, local, backend, device, launcher)


def _default_group_timeout(timeout: datetime.timedelta) -> None:
    """Make ``timeout`` the default of every group created from now on.

    DeepSpeed makes its own groups (data parallel, ZeRO partitions) with ``new_group(ranks)``, which takes
    torch's built-in default (30 min for gloo, 10 for NCCL), not the default group's timeout: a ZeRO
    all-reduce whose peer vanished would wait half an hour.
    """
    from torch.distributed import distributed_c10d

    distributed_c10d.default_pg_timeout = timeout
    if hasattr(distributed_c10d, "default_pg_nccl_timeout"):
        distributed_c10d.default_pg_nccl_timeout = timeout


def _skip_ds_shm_op() -> None:
    """Tell DeepSpeed its CPU shared-memory comm op is unavailable, so it uses plain gloo (same results)."""
    try:
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    except (ImportError, AttributeError):
        pass


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def destroy() -> None:
    import sys

    dist = sys.modules.get("torch.distributed")  # never imported: nothing to tear down (and stay fast)
    if dist is not None and dist.is_initialized():
        dist.destroy_process_group()


EXIT_BOUND_S = 10.0
"""Seconds the end of a process may wait for the threads libraries left running (pools, writers)."""


def exit_without_native_teardown(code: int, bound_s: float = EXIT_BOUND_S) -> NoReturn:
    """End a process whose distributed work is done and torn down (:func:`barrier`, :func:`destroy`),
    within ``bound_s`` seconds whatever threads are still running.

    After every file was closed and every group destroyed, a worker sometimes died in the C++ destructors
    that run after Python's (SIGABRT, "terminate called without an active exception"; gloo and DeepSpeed
    keep native threads), turning finished work into a failure for its launcher. Here Python's own
    shutdown is done by hand (thread pools told to stop, other threads joined, atexit handlers, streams
    flushed) and the process ends without the native teardown. Each part waits only until the bound: a
    pool nobody told to stop (inductor's compile workers) or a thread that never returns would otherwise
    keep a finished run alive forever, and its scheduler and every ``--resume`` chain behind it waiting.
    llm-train ends so; so do the tests' own distributed workers."""
    import threading

    # Whatever below waits on a library's thread, this ends the process at the bound.
    threading.Thread(target=_end_at_bound, args=(code, bound_s), name="llmtools-exit", daemon=True).start()
    # What the interpreter's own shutdown does before it joins threads: concurrent.futures' executors
    # (and any library that registered the same way) wake their idle workers and let them return.
    _stop_thread_pools()
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    _flush()
    os._exit(code)


def _end_at_bound(code: int, bound_s: float) -> None:
    import threading
    import time

    time.sleep(bound_s)
    left = [t.name for t in threading.enumerate() if t.is_alive() and not t.daemon]
    print(
        f"warning: the process still waited {bound_s:g} s after its end (threads: {', '.join(left[:6])}): "
        "it ends without them",
        file=sys.stderr,
    )
    _flush()
    os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or gone stream: nothing more can be said on it
            pass


def _stop_thread_pools() -> None:
    """Run the callbacks libraries registered with ``threading._register_atexit`` (how the interpreter
    tells concurrent.futures' pools to stop), last registered first, as the interpreter does."""
    import threading

    for callback in reversed(list(getattr(threading, "_threading_atexits", []))):
        try:
            callback()
        except Exception as error:  # noqa: BLE001 - one library's failure must not keep the others running
            print(f"warning: at exit: {type(error).__name__}: {error}", file=sys.stderr)


def log0(message: str, rank: int, quiet: bool = False) -> None:
    """A line on stderr, from rank 0 only (progress and logs go to stderr; results to stdout)."""
    if rank == 0 and not quiet:
        print(message, file=sys.stderr, flush=True)


def all_mean(values: list[float], device) -> list[float]:
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor)
        tensor /= dist.get_world_size()
    return tensor.tolist()


def any_rank(flag: bool, device) -> bool:
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([1.0 if flag else 0.0], device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item() > 0)


def mean_over_ranks(value: float, device) -> float:
    """The mean of ``value`` over the ranks (every rank gets the same number)."""
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([float(value)], dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        tensor /= dist.get_world_size()
    return float(tensor.item())


def gather_objects(value) -> list:
    """Every rank's ``value`` (picklable), in rank order, on every rank."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [value]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out
