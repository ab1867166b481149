"""Crash-safe checkpoints of a DeepSpeed engine: save, find the one to resume from, load, prune.

A save is a sequence whose every prefix is harmless (a kill -9 anywhere leaves either the previous state or
the new complete checkpoint):

1. rank 0 removes leftovers of earlier killed saves (``step_*.tmp-*``);
2. every rank: DeepSpeed's ``save_checkpoint`` into ``checkpoints/step_N.tmp-save-ID`` (a name unique to this save, drawn
   by rank 0) and its own RNG file,
   each file written through sha256 and fsynced by the rank that wrote it (:mod:`llmtools.ckpt.writer`) —
   at once, or, with ``async_save``, staged to host memory and written by a background thread while
   training continues (at most one save in flight);
3. when every rank has written its files, rank 0 gathers their sizes and checksums, writes ``meta.json``
   (``complete: true``) last, flushes it, renames the folder to ``step_N`` and then rewrites ``latest``
   atomically;
4. rank 0 prunes (renaming a doomed folder to ``*.tmp-delete`` before removing it, so a half-removed
   folder never looks like a checkpoint).

``resolve("auto")`` picks the newest folder that verifies (meta complete, sizes and checksums, shapes),
warning about each newer one it skips, so a requeued job resumes from the last good state.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmtools.ckpt import dist, layout, safeload, tensor_shards
from llmtools.ckpt import rng as rng_state
from llmtools.ckpt.engine_weights import load_weights_only
from llmtools.ckpt.request import ResumeRequest
from llmtools.ckpt.state import RunState, saved_state
from llmtools.ckpt.verify import check, check_compatible, list_files, read_meta, sha256_file, verify
from llmtools.ckpt.writer import RankWriter
from llmtools.dirfd import refuse_link
from llmtools.errors import InputError, RuntimeFailure, UsageError
from llmtools.formats import jsonfile
from llmtools.fsutil import (
    TMP_MARK,
    atomic_file,
    disk_full_error,
    disk_full_guard,
    fsync_dir,
    fsync_file,
    write_text_atomic,
)

# DeepSpeed's recovery scripts, copied beside the checkpoints on every save (shutil.copyfile follows links)
RECOVERY_SCRIPTS = ("zero_to_fp32.py", "zero_to_torch.py")


def _stderr_warning(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _precision(engine) -> str:
    if getattr(engine, "bfloat16_enabled", lambda: False)():
        return "bf16"
    if getattr(engine, "fp16_enabled", lambda: False)():
        return "fp16"
    return "fp32"


def _param_shapes(module) -> dict[str, list[int]]:
    # ZeRO-3 replaces each parameter with an empty placeholder; ds_shape keeps the real shape.
    return {name: list(getattr(param, "ds_shape", param.shape)) for name, param in module.named_parameters()}


def _same_folder(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


@dataclass
class _Pending:
    """A save whose files are written (or being written) but not yet committed."""

    step: int
    tmp: Path
    final: Path
    writer: RankWriter
    meta: dict[str, Any]
    started: float


def _meta_fields(engine, step: int, final: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """meta.json as known when the save starts (the files and the duration are added at commit)."""
    from llmtools.thirdparty import import_deepspeed

    deepspeed = import_deepspeed()
    import torch

    world = dist.world_size()
    shapes = _param_shapes(engine.module)  # tensor parallelism: shard 0's (what mp_rank_00 holds)
    return {
        **layout.meta_header(step, final.name),
        **summary,
        "world_size": world,
        "dp_world_size": zero_partitions(engine, world),
        "zero_stage": int(engine.zero_optimization_stage()),
        "precision": _precision(engine),
        "rng": {"kinds": ["python", "numpy", "torch"], "files": [layout.rng_name(r) for r in range(world)]},
        "param_shapes": shapes,
        "num_parameters": tensor_shards.whole_parameters(shapes, summary),
        "versions": {"deepspeed": deepspeed.__version__, "torch": torch.__version__.split("+")[0]},
    }


def zero_partitions(engine, world: int) -> int:
    """Ranks ZeRO partitions the state over: the data-parallel ranks, and under sequence parallelism
    (where DeepSpeed has no plain data-parallel group) every rank of the sequence x data grid."""
    for name in ("seq_dp_world_size", "dp_world_size"):
        value = getattr(engine, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return world


class CheckpointManager:
    """Checkpoints of one run folder (``RUN/checkpoints``).

    ``keep_last``: keep only the newest K complete checkpoints (None: keep all); ``keep_every``: also keep
    every checkpoint whose step is a multiple of N (milestones). The newest verified checkpoint is never
    removed. ``warn`` receives one-line warnings (default: stderr). ``async_save``: :meth:`save` stages
    the state and writes it in the background (see :mod:`llmtools.ckpt.writer`).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        keep_last: int | None = None,
        keep_every: int | None = None,
        warn: Callable[[str], None] | None = None,
        async_save: bool = False,
    ) -> None:
        if keep_last is not None and (not isinstance(keep_last, int) or keep_last < 1):
            raise UsageError(f"keep_last: must be an integer >= 1, got {keep_last!r}")
        if keep_every is not None and (not isinstance(keep_every, int) or keep_every < 1):
            raise UsageError(f"keep_every: must be an integer >= 1, got {keep_every!r}")
        self.run_dir = Path(run_dir)
        self.ckpt_dir = layout.checkpoints_dir(self.run_dir)
        self.keep_last = keep_last
        self.keep_every = keep_every
        # The newest checkpoint the caller has seen to be good (training: its weights then passed a
        # health-checked step); pruning keeps it, so the state a stop advises resuming from still exists.
        self.known_good: Path | None = None
        self.warn = warn or _stderr_warning
        self.async_save = async_save
        self._pending: _Pending | None = None
        self._staging: dict[str, Any] = {}  # host buffers of the last background save, reused by the next

    # ------------------------------------------------------------------ save
    def save(
        self, engine, step: int, state: RunState | Mapping[str, Any], blocking: bool | None = None
    ) -> Path:
        """Save ``engine`` at ``step`` with ``state`` (a run's parts, or a bare client state: see
        :mod:`llmtools.ckpt.state`); call on ALL ranks. Returns the checkpoint's folder.

        Synchronous (the default, or ``blocking=True``): the folder is committed when this returns.
        With ``async_save`` (and ``blocking`` not True): the state is staged to host memory and written in
        the background; the folder is committed by a later :meth:`poll` or :meth:`wait` once every rank's
        write is done. A save still in flight is finished and committed before a new one starts.
        """
        if not isinstance(step, int) or step < 0:
            raise UsageError(f"step: must be an integer >= 0, got {step!r}")
        self.wait()
        background = self.async_save if blocking is None else not blocking
        client_state, summary = saved_state(state)
        rank = dist.rank()
        tmp = self.ckpt_dir / dist.broadcast(layout.tmp_name(step) if rank == 0 else None)
        final = self.ckpt_dir / layout.step_name(step)
        started = time.perf_counter()
        if rank == 0:
            refuse_link(self.ckpt_dir)  # a linked checkpoints/ would write into another run
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
            for script in RECOVERY_SCRIPTS:
                refuse_link(self.ckpt_dir / script)
            for leftover in layout.leftovers(self.ckpt_dir):
                shutil.rmtree(leftover, ignore_errors=True)
        dist.barrier()

        writer = RankWriter(tmp, background=background, reuse=self._staging)
        deepspeed_engine, engine.checkpoint_engine = engine.checkpoint_engine, writer
        try:
            with disk_full_guard(tmp):  # torch words a full disk "unexpected pos ..."
                try:
                    engine.save_checkpoint(
                        str(self.ckpt_dir), tag=tmp.name, client_state=client_state, save_latest=False
                    )
                finally:
                    engine.checkpoint_engine = deepspeed_engine
                writer.add(layout.rng_name(rank), rng_state.capture())
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # a failed save leaves no half-written folder
            raise
        pending = _Pending(step, tmp, final, writer, _meta_fields(engine, step, final, summary), started)
        if not background:
            return self._commit(pending)
        self._staging = writer.staged()
        writer.start()
        self._pending = pending
        return final

    @property
    def in_flight(self) -> Path | None:
        """The folder of the save being written in the background, if any."""
        return self._pending.final if self._pending is not None else None

    def poll(self) -> Path | None:
        """Commit the background save if every rank has finished writing it (ALL ranks; one tiny
        all-reduce while a save is in flight, nothing otherwise). Returns the committed folder, or None."""
        if self._pending is None:
            return None
        if not dist.all_ranks(self._pending.writer.done()):
            return None
        return self.wait()

    def wait(self) -> Path | None:
        """Wait for the background save (if any) on every rank and commit it (ALL ranks)."""
        pending, self._pending = self._pending, None
        return self._commit(pending) if pending is not None else None

    def abandon(self) -> Path | None:
        """Leave the background save uncommitted (this rank only, no collective): its write waited for,
        its folder removed by rank 0. Returns the folder it would have been committed as, or None."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        pending.writer.join()
        if dist.rank() == 0:
            shutil.rmtree(pending.tmp, ignore_errors=True)
        return pending.final

    def _commit(self, pending: _Pending) -> Path:
        """Every rank reports what it wrote; rank 0 writes meta.json last, renames, updates ``latest``."""
        pending.writer.join()
        error = pending.writer.error
        if error is not None:
            full = disk_full_error(error, pending.tmp)
            error_text = str(full) if full is not None else f"{type(error).__name__}: {error}"
        report = (dist.rank(), pending.writer.files, None if error is None else error_text)
        reports = dist.gather(report)
        problem = None
        if dist.rank() == 0:
            failed = [(r, message) for r, _, message in reports if message]
            if failed:
                problem = f"rank {failed[0][0]} could not write its files: {failed[0][1]}"
            else:
                try:
                    self._publish(
                        pending, {name: entry for _, files, _ in reports for name, entry in files.items()}
                    )
                except OSError as os_error:
                    full = disk_full_error(os_error, pending.tmp)
                    problem = (
                        str(full)
                        if full is not None
                        else (f"{os_error.filename or pending.tmp}: {os_error.strerror or os_error}")
                    )
        problem = dist.broadcast(problem)
        if problem:
            if dist.rank() == 0:
                shutil.rmtree(pending.tmp, ignore_errors=True)  # no half-written folder stays behind
            raise RuntimeFailure(f"checkpoint of step {pending.step} not saved: {problem}")
        return pending.final

    def _publish(self, pending: _Pending, files: dict[str, dict[str, Any]]) -> None:
        """Rank 0: meta.json (complete: true) last, then the rename, then ``latest``, then pruning."""

        unlisted = [name for name in list_files(pending.tmp) if name not in files]
        for name in unlisted:  # anything DeepSpeed wrote around its checkpoint engine
            fsync_file(pending.tmp / name)
            files[name] = {
                "size": (pending.tmp / name).stat().st_size,
                "sha256": sha256_file(pending.tmp / name),
            }
        meta = {
            **pending.meta,
            "save_seconds": round(time.perf_counter() - pending.started, 3),
            "files": dict(sorted(files.items())),
            "complete": True,
        }
        with atomic_file(pending.tmp / layout.META, "w", encoding="utf-8") as handle:
            jsonfile.dump(meta, handle, indent=1)
            handle.write("\n")
        fsync_dir(pending.tmp)
        final = pending.final
        if final.exists():  # the same step saved again (e.g. after --reset-data): replace it
            doomed = self.ckpt_dir / f"{final.name}{TMP_MARK}replaced"
            os.replace(final, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
        os.replace(pending.tmp, final)
        fsync_dir(self.ckpt_dir)
        write_text_atomic(self.ckpt_dir / layout.LATEST, final.name + "\n")
        self.prune(protect=final)

    # ------------------------------------------------------------------ find
    def checkpoints(self) -> list[tuple[int, Path]]:
        return layout.list_checkpoints(self.ckpt_dir)

    def latest_verified(self, warn: bool = True, exclude: Collection[Path] = ()) -> Path | None:
        """The newest checkpoint that verifies fully (not in ``exclude``); warn about every newer one skipped.

        A checkpoint holding a pickle outside the allowlist is not skipped: it stops the search
        (:class:`~llmtools.ckpt.safeload.UnsafeFileError`), since someone put it there on purpose.
        """
        for _step, path in reversed(self.checkpoints()):
            if path in exclude:
                continue
            report = verify(path, found_in=self.ckpt_dir)
            if report.unsafe is not None:
                raise report.unsafe
            if report.ok:
                return path
            if warn:
                self.warn(f"skipping checkpoint {path}: {report.first_problem()}")
        return None

    def resolve(
        self,
        spec: ResumeRequest | str | os.PathLike,
        exclude: Collection[Path] = (),
        rollback: bool = False,
    ) -> Path | None:
        """A :class:`~llmtools.ckpt.request.ResumeRequest` (or the ``auto`` | ``latest`` | ``STEP`` |
        ``PATH`` it parses, with ``rollback``) -> a verified checkpoint folder.

        ``auto`` returns None when there is none (start fresh; ``exclude``: ones that failed to load); the
        others raise InputError when the checkpoint is missing or broken. A checkpoint of this run older
        than its newest complete one is refused unless ``rollback``; resolving moves nothing: the caller
        moves the newer ones aside (:meth:`abandon_after`) once the chosen state has loaded, so a resume
        that fails changes nothing. Under torch.distributed rank 0 decides and tells the others.
        """
        request = spec if isinstance(spec, ResumeRequest) else ResumeRequest.parse(spec, rollback=rollback)
        if dist.rank() == 0:
            try:
                result: Any = self._resolve_here(request, exclude)
            except InputError as error:
                result = error
        else:
            result = None
        result = dist.broadcast(result)
        if isinstance(result, InputError):
            raise result
        return result

    def _resolve_here(self, request: ResumeRequest, exclude: Collection[Path] = ()) -> Path | None:
        if request.auto:
            return self.latest_verified(exclude=exclude)
        path = self.target(request)
        check(path)
        later = self.later_than(path)
        if later and not request.rollback:
            raise self._rollback_refusal(path, later)
        return path  # the newer ones stay until the state has loaded (abandon_after)

    def target(self, request: ResumeRequest) -> Path:
        """The folder a ``latest`` | ``STEP`` | ``PATH`` request names (not verified yet); InputError when
        there is none.

        ``latest`` is read from a file: it must name a checkpoint folder of this run (``step_N``), not
        ``../other`` nor an absolute path, and not a symlink out of the checkpoints folder.
        """
        if request.kind == "latest":
            where = self.ckpt_dir / layout.LATEST
            tag = layout.read_latest(self.ckpt_dir)
            if tag is None:
                raise InputError(f"{where}: missing (no checkpoint was saved in this run)")
            if layout.parse_step(tag) is None:
                raise InputError(
                    f"{where}: names {tag!r}, not a checkpoint folder of this run (step_NNNNNNNN); refused"
                )
            path = self.ckpt_dir / tag
            if not path.is_dir():
                raise InputError(f"{where}: points to {tag}, which does not exist")
        elif request.step is not None:
            path = self.ckpt_dir / layout.step_name(request.step)
            if not path.is_dir():
                have = ", ".join(str(step) for step, _ in self.checkpoints()) or "none"
                raise InputError(f"{path}: no checkpoint for step {request.step} (steps saved: {have})")
        else:
            path = Path(request.path)  # typed by the user: it may lie anywhere
            if not path.exists():
                raise InputError(f"{path}: no such checkpoint (use auto, latest, a step number or a folder)")
            if not (path / layout.META).exists() and not layout.is_checkpoint(path):
                raise InputError(f"{path}: not a checkpoint folder (it has no {layout.META})")
            return path
        if not layout.stays_inside(self.ckpt_dir, path):
            raise InputError(f"{path}: a symlink out of {self.ckpt_dir}; refused")
        return path

    # ------------------------------------------------------------------ rollback
    def later_than(self, path: str | os.PathLike) -> list[tuple[int, Path]]:
        """The complete checkpoints of this run newer than ``path`` (none when ``path`` is not one of this
        run's checkpoint folders). Complete means meta.json says so; nothing is hashed."""
        path = Path(path)
        step = layout.parse_step(path.name)
        if step is None or not self.ckpt_dir.is_dir() or not _same_folder(path.parent, self.ckpt_dir):
            return []
        later = []
        for other, folder in self.checkpoints():
            if other > step:
                try:
                    if read_meta(folder).get("complete") is True:
                        later.append((other, folder))
                except InputError:
                    continue
        return later

    def check_rollback(self, request: ResumeRequest | None) -> None:
        """Before any compute: refuse a ``--resume`` that names no checkpoint (a ``latest`` pointing out of
        the run, a missing step), or an older checkpoint without ``rollback`` (UsageError)."""
        if request is None or request.auto:
            return
        path = self.target(request)
        later = self.later_than(path)
        if later and not request.rollback:
            raise self._rollback_refusal(path, later)

    def _rollback_refusal(self, path: Path, later: list[tuple[int, Path]]) -> UsageError:
        steps = ", ".join(str(step) for step, _ in later)
        return UsageError(
            f"{path}: step {layout.parse_step(path.name)} is older than this run's newest checkpoint "
            f"(later steps: {steps}); resuming from it would overwrite them. Add --rollback to move them "
            f"into {self.ckpt_dir}/abandoned-<time>/ (nothing is deleted), or resume with --resume auto"
        )

    def abandon_after(self, path: str | os.PathLike) -> Path | None:
        """Move every checkpoint folder newer than ``path`` (complete or not) into
        ``checkpoints/abandoned-<UTC time>/`` and point ``latest`` at ``path``; returns that folder.

        Nothing is deleted; ``auto``, ``latest`` and pruning look only at ``step_*`` folders directly in
        the checkpoints folder, so an abandoned timeline can never be resumed by accident.
        """
        path = Path(path)
        step = layout.parse_step(path.name)
        doomed = [folder for other, folder in self.checkpoints() if step is not None and other > step]
        if not doomed:
            return None
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target = self.ckpt_dir / f"{layout.ABANDONED}{stamp}"
        n = 1
        while target.exists():
            n += 1
            target = self.ckpt_dir / f"{layout.ABANDONED}{stamp}-{n}"
        target.mkdir()
        for folder in doomed:
            os.replace(folder, target / folder.name)
        fsync_dir(target)
        write_text_atomic(self.ckpt_dir / layout.LATEST, path.name + "\n")
        fsync_dir(self.ckpt_dir)
        self.warn(
            f"rolled back to {path.name}: moved {', '.join(f.name for f in doomed)} into {target} "
            "(nothing deleted)"
        )
        return target

    # ------------------------------------------------------------------ load
    def load(
        self, engine, path: str | os.PathLike, load_optimizer_states: bool = True, reshard: bool = False
    ) -> dict[str, Any]:
        """Load a checkpoint into ``engine`` (ALL ranks) and restore this rank's RNG states.

        Returns the trainer's client_state. A checkpoint saved with a different world size is resharded
        through DeepSpeed's universal format (model and optimizer state kept; see :mod:`reshard`); so is
        one saved with another ZeRO stage when ``reshard`` is given (ZeRO-1 <-> ZeRO-2).
        """
        path = Path(path)
        meta = read_meta(path)
        rank, world = dist.rank(), dist.world_size()
        saved_world = int(meta.get("dp_world_size") or meta["world_size"])
        current_dp = zero_partitions(engine, world)
        if meta.get("init_only"):
            # Weights only (llm-ckpt import-hf): the optimizer, schedule and RNG start fresh.
            load_weights_only(engine, layout.model_states_file(path))
            return {
                k: meta.get(k) for k in ("step", "consumed_samples", "consumed_tokens", "model", "tokenizer")
            }
        tensor_shards.check_same_replicas(meta, path / layout.META, saved_world, current_dp)
        saved_stage, stage = int(meta["zero_stage"]), int(engine.zero_optimization_stage())
        if saved_stage != stage and not reshard:
            raise InputError(
                f"{path / layout.META}[zero_stage]: the checkpoint was saved with ZeRO-{saved_stage}, this run "
                f"uses ZeRO-{stage}; resume with the same stage, reshard ZeRO-1 <-> ZeRO-2 (--reshard), or start "
                "a new run from its weights (llm-ckpt import-hf / convert --to hf)"
            )
        safeload.guard_engine(engine)  # DeepSpeed's own reads of its files: weights only, our allowlist
        from llmtools.ckpt.reshard import load_resharded, needs_universal

        if needs_universal(saved_world, current_dp, saved_stage, stage):

            client_state = load_resharded(engine, path, meta, load_optimizer_states=load_optimizer_states)
        else:
            with safeload.routed_torch_load():  # whatever else DeepSpeed reads with torch.load
                load_path, client_state = engine.load_checkpoint(
                    str(path.parent),
                    tag=path.name,
                    load_optimizer_states=load_optimizer_states,
                    load_lr_scheduler_states=load_optimizer_states,
                )
            if load_path is None:
                raise RuntimeFailure(f"{path}: DeepSpeed could not load this checkpoint")
        rng_file = path / layout.rng_name(rank)
        if saved_world == world and rng_file.is_file():
            rng_state.restore(safeload.load(rng_file), rng_file)
        elif rank == 0:
            self.warn(
                f"{path}: saved with world size {meta['world_size']}, now {world}: RNG states not restored "
                "(the data position is kept: consumed samples are global)"
            )
        return dict(client_state or {})

    @staticmethod
    def check_compatible(
        path: str | os.PathLike, model: dict[str, Any] | None, tokenizer: dict[str, Any] | None
    ) -> dict[str, Any]:
        """Refuse (InputError naming both values) a checkpoint whose model shape or tokenizer differ."""
        meta = read_meta(path)
        check_compatible(meta, path, model, tokenizer)
        return meta

    # ------------------------------------------------------------------ prune
    def prune_plan(self, protect: Path | None = None, keep_last: int | None = None) -> list[Path]:
        """The complete checkpoints :meth:`prune` would remove (oldest first)."""
        keep_last = keep_last if keep_last is not None else self.keep_last
        if keep_last is None:
            return []
        complete = []
        for step, path in self.checkpoints():
            try:
                if read_meta(path).get("complete") is True:
                    complete.append((step, path))
            except InputError:
                continue
        newest_ok = protect if protect is not None else self.latest_verified(warn=False)
        keep = {path for _, path in complete[-keep_last:]}
        if self.known_good is not None:
            keep.add(Path(self.known_good))
        if self.keep_every:
            keep |= {path for step, path in complete if step % self.keep_every == 0}
        if newest_ok is not None:
            keep.add(Path(newest_ok))
        return [path for _, path in complete if path not in keep]

    def prune(self, protect: Path | None = None, keep_last: int | None = None) -> list[Path]:
        """Remove complete checkpoints beyond ``keep_last`` (not milestones, never the newest verified).

        Folders that are not complete are left alone for a human to look at. Returns the removed paths.
        """
        removed, failed = [], []
        refuse_link(self.ckpt_dir)  # a linked checkpoints/ leads into another run, without its lock
        for path in self.prune_plan(protect, keep_last):
            if path.is_symlink():  # a link to a folder elsewhere: not ours to delete through
                self.warn(f"not pruning {path}: a symbolic link (remove it, or its target, yourself)")
                continue
            # Renamed first, so a kill in the middle of rmtree leaves a .tmp- folder, not half a checkpoint.
            doomed = path.with_name(f"{path.name}{TMP_MARK}delete")
            os.replace(path, doomed)
            errors: list[str] = []

            def note(_function, failed_path, exc_info, errors=errors) -> None:
                errors.append(f"{failed_path}: {getattr(exc_info[1], 'strerror', None) or exc_info[1]}")

            shutil.rmtree(doomed, onerror=note)  # onerror: Python 3.10 and 3.11 have no onexc
            if doomed.exists():
                failed.append(f"{path} (left as {doomed.name}: {errors[0] if errors else 'not removed'})")
            removed.append(path)  # it is no checkpoint any more either way
        if removed:
            fsync_dir(self.ckpt_dir)
        if failed:
            raise RuntimeFailure(
                f"pruned {len(removed)} checkpoint(s) but could not free the space of {len(failed)}: {failed[0]}"
            )
        return removed
