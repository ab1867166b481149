"""Splitting a corpus across machines: which inputs shard I of N tokenizes, and how shards fit back.

``json2bin --shard I/N`` (or a Slurm job array: ``SLURM_ARRAY_TASK_ID`` / ``SLURM_ARRAY_TASK_COUNT``)
processes only its share of the inputs. The assignment depends on nothing but the list of input
paths and their sizes, so every task of an array computes the same one without talking to the
others:

* the inputs (files, globs, ``@list`` files) are expanded and sorted by path;
* they are cut into N contiguous runs balanced by size: input j goes to shard
  ``floor((before_j + size_j / 2) * N / total)``, ``before_j`` being the bytes of the inputs sorted
  before it (so each shard holds about total/N bytes, off by at most one file);
* shard I writes ``PREFIX-0000I-of-0000N_{key}_document``; its sidecar records the assignment
  (its index, the count, its inputs, and the *plan*: a hash of every path and size with N).

Because the runs are contiguous and in path order, ``llm-prep merge`` of shards 0..N-1 in order gives
the bytes of one json2bin run over all the inputs sorted by path. The plan lets merge refuse a
missing, repeated or foreign shard.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmtools.errors import InputError, UsageError
from llmtools.formats import jsonfile

MAX_SHARDS = 1_000_000
"""More shards than this is a typo (a corpus is cut into thousands at most); every shard's sidecar and
merge's bookkeeping grow with the count."""

ASSIGNMENT = "contiguous runs of the inputs sorted by path, balanced by size"
_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class ShardSpec:
    index: int
    count: int
    origin: str = "--shard"
    """Where it came from, for messages: '--shard' or the Slurm variables."""

    def __post_init__(self) -> None:
        if self.count > MAX_SHARDS:
            raise UsageError(f"{self.origin}: {self.count} shards; at most {MAX_SHARDS} are allowed")
        if self.count < 1:
            raise UsageError(f"{self.origin}: the shard count must be at least 1, got {self.count}")
        if not 0 <= self.index < self.count:
            raise UsageError(
                f"{self.origin}: shard index {self.index} is outside 0..{self.count - 1} (I/N counts from 0)"
            )

    @property
    def suffix(self) -> str:
        """``-00003-of-00010``: sorts in shard order, as Hugging Face names its shards."""
        width = max(5, len(str(self.count - 1)))
        return f"-{self.index:0{width}d}-of-{self.count:0{width}d}"

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> ShardSpec | None:
    """``"3/10"`` -> shard 3 of 10; ``"none"`` -> None (no sharding, even inside a Slurm array)."""
    if text.strip().lower() == "none":
        return None
    match = _SHARD.match(text)
    if not match:
        raise UsageError(f"--shard: expected I/N (e.g. 3/10, counting from 0) or 'none', got {text!r}")
    if max(len(match.group(1)), len(match.group(2))) > 18:
        raise UsageError(f"--shard: {text.strip()[:50]!r}: at most {MAX_SHARDS} shards are allowed")
    return ShardSpec(int(match.group(1)), int(match.group(2)))


def shard_from_environment(environ: Mapping[str, str]) -> ShardSpec | None:
    """The shard of a Slurm array task, or None outside an array.

    Arrays need not start at 0 (``--array=1-10``) nor step by 1 (``--array=0-18:2``): the index is
    ``(SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN) / SLURM_ARRAY_TASK_STEP``. An array given as a list
    (``--array=1,4,9``) has no such rule: pass ``--shard I/N`` then.
    """
    task = environ.get("SLURM_ARRAY_TASK_ID")
    count = environ.get("SLURM_ARRAY_TASK_COUNT")
    if task is None or count is None:
        return None
    names = {k: environ.get(k) for k in ("SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_STEP")}
    try:
        if any(len(str(v or "")) > 18 for v in (task, count, *names.values())):
            raise ValueError("too long")
        task_id, total = int(task), int(count)
        low = int(names["SLURM_ARRAY_TASK_MIN"] or 0)
        step = int(names["SLURM_ARRAY_TASK_STEP"] or 1)
    except ValueError:
        raise UsageError(
            f"cannot read the Slurm array variables (SLURM_ARRAY_TASK_ID={task!r}, "
            f"SLURM_ARRAY_TASK_COUNT={count!r}, {', '.join(f'{k}={v!r}' for k, v in names.items())}); "
            "pass --shard I/N"
        ) from None
    origin = f"SLURM_ARRAY_TASK_ID={task_id} (MIN={low}, STEP={step}, COUNT={total})"
    offset = task_id - low
    if step < 1 or offset < 0 or offset % step or offset // step >= total:
        raise UsageError(
            f"{origin}: the array is not a range from SLURM_ARRAY_TASK_MIN in steps of SLURM_ARRAY_TASK_STEP, "
            "so the shard index cannot be derived; pass --shard I/N (or --shard none)"
        )
    return ShardSpec(offset // step, total, origin)


def input_sizes(paths: Sequence[str]) -> list[int]:
    sizes = []
    for path in paths:
        try:
            sizes.append(os.path.getsize(path))
        except OSError as error:
            raise InputError(f"{path}: cannot read its size ({error.strerror})") from None
    return sizes


def assign(sizes: Sequence[int], count: int) -> list[int]:
    """Shard of each input (in the order given, which callers sort by path): contiguous, size-balanced."""
    total = sum(sizes)
    n = len(sizes)
    if total == 0:
        return [j * count // n for j in range(n)]
    out, before = [], 0
    for size in sizes:
        out.append(min(count - 1, (2 * before + size) * count // (2 * total)))
        before += size
    return out


def plan_id(paths: Sequence[str], sizes: Sequence[int], count: int) -> str:
    """Names one assignment: every task of an array computes the same plan from the same inputs."""
    text = jsonfile.dumps({"count": count, "inputs": [[p, s] for p, s in zip(paths, sizes, strict=True)]})
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@dataclass
class ShardAssignment:
    """Which shard each input belongs to (``plan`` names the assignment: the same for every task of an
    array); ``mine`` are the inputs of this task's shard."""

    spec: ShardSpec
    paths: list[str]  # every input, sorted
    sizes: list[int]
    shards: list[int]  # shard of each input
    plan: str

    @property
    def mine(self) -> list[str]:
        return [p for p, s in zip(self.paths, self.shards, strict=True) if s == self.spec.index]

    def record(self) -> dict:
        """What the sidecar says about this shard."""
        mine = [k for k, s in enumerate(self.shards) if s == self.spec.index]
        return {
            "index": self.spec.index,
            "count": self.spec.count,
            "plan": self.plan,
            "assignment": ASSIGNMENT,
            "inputs": len(mine),
            "bytes": sum(self.sizes[k] for k in mine),
            "inputs_total": len(self.paths),
            "bytes_total": sum(self.sizes),
        }


def plan_shards(paths: Sequence[str], spec: ShardSpec) -> ShardAssignment:
    """Sort the (expanded) inputs by path and assign them; stdin and repeated files are refused."""
    if "-" in paths:
        raise UsageError(f"--shard {spec}: stdin ('-') cannot be sharded; give files")
    ordered = sorted(paths)
    for a, b in zip(ordered, ordered[1:]):  # noqa: B905 - neighbours
        if a == b:
            raise InputError(f"{a}: named twice among the inputs (each input must belong to one shard)")
    sizes = input_sizes(ordered)
    return ShardAssignment(
        spec, ordered, sizes, assign(sizes, spec.count), plan_id(ordered, sizes, spec.count)
    )
