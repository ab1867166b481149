"""`llm-prep dedup`'s stages over a run folder, on one machine or as the tasks of Slurm arrays.

    signatures  one unit per input          (--shard I/N: the inputs json2bin's rule gives shard I)
    buckets     one unit per band, + exact  (--shard I/N: a contiguous range of bands)
    clusters    one task                    (union-find over every pair)
    apply       one unit per input          (--shard I/N as signatures)
    all         the four in order, here

A unit whose outputs exist is complete (they were renamed into place whole) and is skipped, so a killed
task, run again, does only what is missing; a stage refuses to start before the stage it reads from is
complete, naming what is missing. The results depend on the inputs and options only, never on how the
work was cut: a staged run's files are a one-machine run's, byte for byte."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from llmtools.errors import UsageError
from llmtools.fsutil import TMP_MARK
from llmtools.locks import lock_output, remove_dead_temporaries, remove_dead_temporaries_in
from llmtools.prep.curate.dedup.apply import apply_done, apply_file, kept_path
from llmtools.prep.curate.dedup.buckets import find_pairs
from llmtools.prep.curate.dedup.clusters import cluster
from llmtools.prep.curate.dedup.config import DedupConfig
from llmtools.prep.curate.dedup.layout import (
    PLAN_FORMAT,
    Plan,
    Source,
    make_plan,
    pair_units,
    pairs_path,
    read_plan,
    sig_dir,
    write_or_check_plan,
)
from llmtools.prep.curate.dedup.minhash import Signer
from llmtools.prep.curate.dedup.report import write_cluster_outputs
from llmtools.prep.curate.dedup.signatures import compute_signatures, signatures_done
from llmtools.prep.shards import ShardSpec, assign
from llmtools.progress import Progress

STAGES = ("signatures", "buckets", "clusters", "apply", "all")
OUR_NAMES = {"plan.json", "work", "kept", "clusters.jsonl", "stats.json"}


@dataclass
class DedupResult:
    out: Path
    stages: list[str]
    done: dict[str, list[int]] = field(default_factory=dict)  # units this call did, per stage
    skipped: dict[str, list[int]] = field(default_factory=dict)  # units found complete
    stats: dict | None = None
    outputs: list[Path] = field(default_factory=list)

    @property
    def paths(self) -> list[Path]:
        return self.outputs

    def summary(self) -> str:
        parts = [f"{stage}: {len(self.done.get(stage, []))} done, {len(self.skipped.get(stage, []))} already there"
                 for stage in self.stages]  # fmt: skip
        if self.stats is not None:
            removed = sum(s["removed"] for s in self.stats["sources"].values())
            documents = sum(s["documents"] for s in self.stats["sources"].values())
            exact = sum(s["exact_duplicates"] for s in self.stats["sources"].values())
            parts.append(
                f"{removed:,} of {documents:,} documents removed ({exact:,} exact, {removed - exact:,} near)"
            )
        return "; ".join(parts)

    def to_dict(self) -> dict:
        return {"output": str(self.out), "stages": self.stages, "done": self.done, "skipped": self.skipped,
                "outputs": [str(p) for p in self.outputs]}  # fmt: skip


def open_run(
    out: Path, config: DedupConfig | None, sources: list[Source], skip_bad: bool, force: bool
) -> Plan:
    """The run's plan: from the inputs and options when given (recorded, or checked against the record),
    else read from the run folder."""
    if not sources:
        plan = read_plan(out)
        if config is not None and config not in (plan.config, DedupConfig()):
            raise UsageError(f"{out}: the run was planned with other options (see {out / 'plan.json'}); "
                             "give the same ones, or none")  # fmt: skip
        return plan
    plan = make_plan(config or DedupConfig(), sources, skip_bad)
    marker = out / "plan.json"
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: exists and is not a folder")
    if out.is_dir():
        # another task of the same array may be writing the plan right now: only names we never write mean
        # the folder is someone else's
        foreign = sorted(
            p.name for p in out.iterdir() if p.name.split(TMP_MARK)[0].removesuffix(".lock") not in OUR_NAMES
        )
        if foreign:
            raise UsageError(f"{out}: a folder that is not a dedup run of llmtools (it holds {foreign[0]!r}); "
                             "pick another --output")  # fmt: skip
    if force and marker.exists():
        try:
            same = read_plan(out).record() == plan.record()
        except Exception:  # noqa: BLE001 - a damaged plan of ours is replaced too
            same = False
        if not same and marker.read_text(encoding="utf-8", errors="replace").find(PLAN_FORMAT) >= 0:
            shutil.rmtree(out)
    write_or_check_plan(out, plan)
    return plan


def _mine(count: int, shard: ShardSpec | None, sizes: list[int] | None = None) -> list[int]:
    if shard is None:
        return list(range(count))
    owners = assign(sizes if sizes is not None else [1] * count, shard.count) if count else []
    return [k for k, owner in enumerate(owners) if owner == shard.index]


def run_dedup(
    out: Path, plan: Plan, stage: str, shard: ShardSpec | None = None, progress: bool = True
) -> DedupResult:
    if stage not in STAGES:
        raise UsageError(f"unknown stage {stage!r}: one of {', '.join(STAGES)}")
    if stage == "all" and shard is not None:
        raise UsageError(
            "--shard: `all` runs every stage here; shard the stages (signatures, buckets, apply) instead"
        )
    if stage == "clusters" and shard is not None and shard.count > 1:
        raise UsageError(f"--shard {shard}: the clusters stage is one task (give no --shard, or 0/1)")
    stages = ["signatures", "buckets", "clusters", "apply"] if stage == "all" else [stage]
    result = DedupResult(out, stages)
    for name in stages:
        {"signatures": _signatures, "buckets": _buckets, "clusters": _clusters, "apply": _apply}[name](
            out, plan, shard, result, progress
        )
    if stage == "all":  # what a user reads, not the stages' files
        result.outputs = [out / "clusters.jsonl", out / "stats.json"] + [
            kept_path(out, plan, f) for f in range(len(plan.paths))
        ]
    return result


def _unit(path: Path):
    """The lock of one unit's output (`PATH.lock`, gone when released): two tasks never write the same unit,
    and the temporaries a killed task left beside it are removed when it is taken."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return lock_output(path, command="llm-prep dedup")


def _note(result: DedupResult, stage: str, unit: int, done: bool) -> None:
    (result.done if done else result.skipped).setdefault(stage, []).append(unit)


def _signatures(out: Path, plan: Plan, shard, result: DedupResult, progress: bool) -> None:
    units = _mine(len(plan.paths), shard, plan.sizes)
    signer = Signer(plan.config) if plan.config.near else None
    with Progress(sum(plan.sizes[f] for f in units), "dedup signatures", unit="B", enabled=progress) as bar:
        for file in units:
            with _unit(sig_dir(out, file)):
                if signatures_done(out, file):
                    _note(result, "signatures", file, False)
                else:
                    compute_signatures(out, plan, file, signer, bar)
                    _note(result, "signatures", file, True)
            bar.update(plan.sizes[file])
            result.outputs.append(sig_dir(out, file))


def _require(missing: list[str], stage: str, before: str) -> None:
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise UsageError(f"{stage}: {missing[0]}{more} is missing: run the {before} stage for it first")


def _buckets(out: Path, plan: Plan, shard, result: DedupResult, progress: bool) -> None:
    _require([str(sig_dir(out, f)) for f in range(len(plan.paths)) if not signatures_done(out, f)], "buckets",
             "signatures")  # fmt: skip
    units = pair_units(plan.config)
    mine = [units[k] for k in _mine(len(units), shard)]
    with Progress(len(mine), "dedup buckets", unit="band", enabled=progress) as bar:
        for unit in mine:
            path = pairs_path(out, unit, plan.config)
            with _unit(path):
                if path.exists():
                    _note(result, "buckets", unit, False)
                else:
                    find_pairs(out, plan, unit)
                    _note(result, "buckets", unit, True)
            bar.update(1)
            result.outputs.append(path)


def _clusters(out: Path, plan: Plan, shard, result: DedupResult, progress: bool) -> None:
    paths = [pairs_path(out, u, plan.config) for u in pair_units(plan.config)]
    _require([str(p) for p in paths if not p.exists()], "clusters", "buckets")
    stats_path = out / "stats.json"
    with _unit(stats_path):
        if stats_path.exists():
            _note(result, "clusters", 0, False)
        else:
            # what a killed clusters task left: its outputs are written together, under this one lock
            remove_dead_temporaries(out / "clusters.jsonl")
            remove_dead_temporaries_in(out / "work" / "remove")
            result.stats = write_cluster_outputs(out, plan, cluster(out, plan))
            _note(result, "clusters", 0, True)
    if result.stats is None:
        from llmtools.formats import jsonfile

        result.stats = jsonfile.read_json_object(stats_path, "dedup stats")
    result.outputs += [out / "clusters.jsonl", stats_path]


def _apply(out: Path, plan: Plan, shard, result: DedupResult, progress: bool) -> None:
    _require([] if (out / "stats.json").exists() else [str(out / "stats.json")], "apply", "clusters")
    units = _mine(len(plan.paths), shard, plan.sizes)
    with Progress(sum(plan.sizes[f] for f in units), "dedup apply", unit="B", enabled=progress) as bar:
        for file in units:
            with _unit(kept_path(out, plan, file)):
                if apply_done(out, plan, file):
                    _note(result, "apply", file, False)
                else:
                    apply_file(out, plan, file)
                    _note(result, "apply", file, True)
            bar.update(plan.sizes[file])
            result.outputs.append(kept_path(out, plan, file))
