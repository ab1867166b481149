"""Where checkpoints live and what their files are called.

    RUN/checkpoints/
        latest                      one line: the tag of the newest committed checkpoint (DeepSpeed reads it too)
        zero_to_fp32.py             DeepSpeed's recovery script (DeepSpeed copies it here)
        step_00000010/              one folder per saved step: DeepSpeed's files, our rng files, meta.json last
            mp_rank_00_model_states.pt
            zero_pp_rank_0_mp_rank_00_optim_states.pt ...
            rng_rank0000.pt ...
            meta.json
        step_00000020.tmp-save-ID/  a save in progress (or killed): never read, removed by the next save
        abandoned-20260101T120000Z/ checkpoints newer than a --rollback target, moved aside (never read)

A folder is a checkpoint only when its name is ``step_<digits>`` exactly; anything with ``.tmp-`` in its
name is work in progress. Since the temporary folder is renamed into place only after meta.json is written
and flushed, a ``step_*`` folder without a valid meta.json can only come from outside interference
(a copy cut short, a disk error), and verification catches that.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from llmtools.fsutil import TMP_MARK

CHECKPOINTS = "checkpoints"
META = "meta.json"
LATEST = "latest"
STEP_RE = re.compile(r"^step_(\d{8,})$")
ABANDONED = "abandoned-"  # + UTC time: where --rollback moves the checkpoints of an abandoned timeline
META_FORMAT = "llmtools.checkpoint"
META_VERSION = 1


def meta_header(step: int, tag: str) -> dict:
    """The first fields of every meta.json: format, version, tool, creation time, step and tag."""
    import datetime
    import time

    from llmtools import __version__

    return {
        "format": META_FORMAT,
        "version": META_VERSION,
        "tool": f"llmtools {__version__}",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "time": time.time(),
        "step": step,
        "tag": tag,
    }


def step_name(step: int) -> str:
    return f"step_{step:08d}"


def parse_step(name: str) -> int | None:
    """The step of a checkpoint folder name, or None when the name is not one."""
    match = STEP_RE.match(name)
    return int(match.group(1)) if match else None


def tmp_name(step: int, token: str | None = None) -> str:
    """The temporary name of a save in progress: ``step_N.tmp-save-TOKEN``, unique to one save.

    Unique so that two saves never write into one folder (a second writer racing the first, a save of a
    step saved before); rank 0 draws the token and sends it to the others. Leftovers of killed saves are
    removed before the next save starts (the run folder's lock says no other writer is alive).
    """
    if token is None:
        import secrets

        token = f"{os.getpid()}-{secrets.token_hex(4)}"
    return f"{step_name(step)}{TMP_MARK}save-{token}"


def rng_name(rank: int) -> str:
    return f"rng_rank{rank:04d}.pt"


def deepspeed_files(
    zero_stage: int, dp_world_size: int, precision: str, tensor_parallel: int = 1
) -> list[str]:
    """The files DeepSpeed's ``load_checkpoint`` needs from a checkpoint it saved.

    Its own naming (``DeepSpeedEngine._get_ckpt_name`` / ``_get_zero_ckpt_name``): the module state in
    ``mp_rank_00_model_states.pt``, one per data-parallel rank under ZeRO-3 (``zero_pp_rank_R_...``);
    the optimizer partitions in ``zero_pp_rank_R_mp_rank_00_optim_states.pt`` per rank under ZeRO-1/2/3
    (``bf16_`` in front in bf16, whichever wrapper DeepSpeed picked); ZeRO-0 keeps the optimizer inside the
    model-states file (fp32, and bf16 without pipeline parallelism: DeepSpeed's DDP-style bf16 wrapper).
    Each tensor-parallel shard ``M`` has the same files, ``mp_rank_MM`` in their names.
    """
    ranks = range(max(1, int(dp_world_size)))
    files = []
    for m in range(max(1, int(tensor_parallel))):
        mp = f"mp_rank_{m:02d}"
        if zero_stage == 3:
            files += [f"zero_pp_rank_{r}_{mp}_model_states.pt" for r in ranks]
        else:
            files += [f"{mp}_model_states.pt"]
        if zero_stage > 0:
            prefix = "bf16_" if precision == "bf16" else ""
            files += [f"{prefix}zero_pp_rank_{r}_{mp}_optim_states.pt" for r in ranks]
    return files


def required_files(meta: dict) -> list[str]:
    """Every file a checkpoint of this kind must hold: DeepSpeed's for its ZeRO stage, data-parallel world
    size and precision, and one RNG file per rank (a weights-only import holds the model states alone)."""
    if meta.get("init_only"):
        return ["mp_rank_00_model_states.pt"]
    world = int(meta.get("world_size") or 1)
    dp_world = int(meta.get("dp_world_size") or world)
    from llmtools.ckpt.tensor_shards import degree

    files = deepspeed_files(
        int(meta.get("zero_stage") or 0), dp_world, str(meta.get("precision") or "fp32"), degree(meta)
    )
    return files + [rng_name(r) for r in range(world)]


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def is_checkpoint(path: str | Path) -> bool:
    path = Path(path)
    return path.is_dir() and parse_step(path.name) is not None


def list_checkpoints(ckpt_dir: str | Path) -> list[tuple[int, Path]]:
    """Committed checkpoint folders (complete or not), oldest first."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    found = []
    for child in ckpt_dir.iterdir():
        step = parse_step(child.name)
        if step is not None and child.is_dir():
            found.append((step, child))
    return sorted(found)


def leftovers(ckpt_dir: str | Path) -> list[Path]:
    """Temporary folders of saves or deletions that were cut short."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    return sorted(p for p in ckpt_dir.iterdir() if p.name.startswith("step_") and TMP_MARK in p.name)


def read_latest(ckpt_dir: str | Path) -> str | None:
    path = Path(ckpt_dir) / LATEST
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return text or None


def stays_inside(ckpt_dir: str | Path, path: str | Path) -> bool:
    """A checkpoint folder found in ``ckpt_dir`` (by listing, or named by ``latest``) really lies there:
    not a symlink to a folder elsewhere."""
    import os

    root = os.path.realpath(ckpt_dir)
    return os.path.dirname(os.path.realpath(path)) == root


def ckpt_dir_of(path: str | Path) -> Path:
    """The ``checkpoints`` folder for a run folder, a checkpoints folder, or a checkpoint folder."""
    path = Path(path)
    if is_checkpoint(path) or (path / META).is_file():
        return path.parent
    if (path / CHECKPOINTS).is_dir():
        return path / CHECKPOINTS
    return path


def model_states_file(folder: str | Path, mp_rank: int = 0) -> Path:
    """DeepSpeed's model-states file of a checkpoint (ZeRO-3 names it after data-parallel rank 0), of
    tensor-parallel shard ``mp_rank``."""
    folder = Path(folder)
    own = f"mp_rank_{mp_rank:02d}_model_states.pt"
    for name in (own, f"zero_pp_rank_0_{own}"):
        if (folder / name).is_file():
            return folder / name
    return folder / own
