"""The seam between the loop and checkpoints: save every N steps, resume from a spec.

Everything goes through :class:`llmtools.ckpt.manager.CheckpointManager` (crash-safe folders, meta.json
written last, verification, pruning, RNG states). Resuming is two calls: :func:`choose` before the engine
exists (the checkpoint, and the resume policy's verdict on the new config: a refusal costs no compute and
writes nothing), then :func:`resume` (load it; with ``auto``, fall back to the previous complete checkpoint
when loading fails). Background saves are finished by the manager's ``poll``/``wait``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmtools.ckpt import dist, layout
from llmtools.ckpt.manager import CheckpointManager
from llmtools.ckpt.request import ResumeRequest
from llmtools.ckpt.safeload import UnsafeFileError
from llmtools.ckpt.state import RunState
from llmtools.ckpt.verify import read_meta
from llmtools.errors import InputError, LlmtoolsError, RuntimeFailure
from llmtools.train import resume as policy


def make_manager(
    run_dir, keep_last: int | None = None, keep_every: int | None = None, async_save: bool = False
) -> CheckpointManager:
    return CheckpointManager(run_dir, keep_last=keep_last, keep_every=keep_every, async_save=async_save)


def save(manager, engine, step: int, state: RunState, blocking: bool | None = None) -> Path:
    """Save the run's parts on ALL ranks; returns the checkpoint folder (committed now, or by a later
    ``poll``/``wait`` when the manager writes in the background and ``blocking`` is not True)."""
    return manager.save(engine, step, state, blocking=blocking)


@dataclass
class Accepted:
    """A checkpoint to resume from, and the config changes the resume policy accepted."""

    path: Path
    step: int
    changes: list = field(default_factory=list)  # llmtools.train.resume.Change


@dataclass(frozen=True)
class ReviewOptions:
    """What the resume policy needs to know besides the two configs and the request
    (:func:`llmtools.train.resume.review`)."""

    reset_data: bool = False
    own_scheduler: bool = False
    data_ledger: bool = False
    """The task's data keeps a ledger, which continues a change of ``data.*``."""


def _review(meta: dict, path: Path, current: dict, request: ResumeRequest, options: ReviewOptions) -> list:
    return policy.review(
        meta,
        path,
        current,
        reset_data=options.reset_data,
        reshard=request.reshard,
        own_scheduler=options.own_scheduler,
        data_ledger=options.data_ledger,
    )


def choose(
    manager: CheckpointManager,
    request: ResumeRequest | None,
    current: dict,
    options: ReviewOptions,
    exclude: tuple[Path, ...] = (),
) -> Accepted | None:
    """The checkpoint ``request`` names, reviewed against ``current`` (the resolved config); None when
    there is nothing to resume. Call on ALL ranks: rank 0 decides, the others follow; a refusal raises
    InputError on every rank. One older than the run's newest complete checkpoint needs the request's
    ``rollback`` (the newer ones are moved aside by :func:`resume`, once it has loaded)."""
    if request is None:
        return None
    path = manager.resolve(request, exclude=exclude)
    if path is None:
        have = [p.name for _, p in layout.list_checkpoints(manager.ckpt_dir)]
        if request.auto and have and not exclude:
            # Checkpoints exist and none can be used: starting over here would silently drop the run.
            raise InputError(
                f"{manager.ckpt_dir}: none of its checkpoints can be resumed ({', '.join(have)}; the warnings "
                "above say why); --resume STEP names one, --force starts the run over"
            )
        if request.auto:
            return None
        raise InputError(f"--resume {request.given}: no such checkpoint in {manager.ckpt_dir}")
    verdict: Any = None
    if dist.rank() == 0:
        try:
            meta = read_meta(path)
            changes = _review(meta, path, current, request, options)
            verdict = Accepted(Path(path), int(meta.get("step") or 0), changes)
        except InputError as refusal:
            verdict = str(refusal)
    verdict = dist.broadcast(verdict)
    if isinstance(verdict, str):
        raise InputError(verdict)
    return verdict


def precheck(run_dir: Path, request: ResumeRequest | None, current: dict, options: ReviewOptions) -> None:
    """The resume policy's verdict on the checkpoint ``request`` most likely names, on every rank, without
    torch or checksums: a refused change then exits in about a second. :func:`choose` decides for good
    (checksums verified, the verdict given again) once the process group and the run's lock exist."""
    if request is None:
        return
    path = request.likely_checkpoint(layout.checkpoints_dir(run_dir))
    try:
        meta = read_meta(path) if path is not None else None
    except InputError:
        meta = None  # choose() names what is wrong with it
    if meta is not None:
        _review(meta, path, current, request, options)


def resume(
    manager: CheckpointManager,
    engine,
    first: Accepted | None,
    request: ResumeRequest | None,
    current: dict,
    options: ReviewOptions,
):
    """Load ``first`` (from :func:`choose`) into ``engine``; returns ``(accepted, client_state)``, or
    ``(None, None)`` when there is nothing to resume.

    With ``auto``, a checkpoint that verified but fails to load (DeepSpeed refuses its contents) is skipped
    with a warning naming it, and the previous complete one is tried; when every one fails, RuntimeFailure.
    An InputError (a layout this run cannot load) is raised at once. With ``rollback``, the checkpoints
    newer than the loaded one are moved aside only after it loaded: a resume that fails changes nothing.
    """
    accepted, failed = first, []
    while accepted is not None:
        error: BaseException | None = None
        try:
            client_state = manager.load(engine, accepted.path, reshard=request.reshard)
        except Exception as caught:  # noqa: BLE001 - whatever DeepSpeed raises, the next candidate may load
            error, client_state = caught, None
        if not dist.any_rank(error is not None):
            if request.rollback and dist.rank() == 0:  # only now that the chosen state has loaded
                manager.abandon_after(accepted.path)
            dist.barrier()
            return accepted, client_state
        if isinstance(error, UnsafeFileError | InputError):
            # put there on purpose, or a layout this run cannot take: never skipped for an older one
            raise error
        why = f"{type(error).__name__}: {error}" if error is not None else "it failed on another rank"
        if not request.auto:
            if isinstance(error, LlmtoolsError):
                raise error  # it names the file and what is wrong already
            raise RuntimeFailure(f"{accepted.path}: could not be loaded ({why})") from error
        failed.append(accepted.path)
        if dist.rank() == 0:
            manager.warn(f"could not load {accepted.path} ({why}); trying the previous complete checkpoint")
        accepted = choose(manager, request, current, options, exclude=tuple(failed))
    if failed:
        # Each one verified (sizes, checksums, shapes) before it was tried: the files are whole, so what
        # failed is loading them here; --force, which deletes them, is no advice for that.
        raise RuntimeFailure(
            f"{manager.ckpt_dir}: no checkpoint could be loaded by this run (tried "
            f"{', '.join(p.name for p in failed)}; each verified, the warnings above say what failed); nothing "
            "was changed: resume with the ranks, ZeRO stage and parallel degrees that saved them (llm-ckpt "
            "inspect shows them)"
        )
    return None, None
