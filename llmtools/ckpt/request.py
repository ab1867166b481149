"""What ``--resume`` asks for, parsed once: :class:`ResumeRequest`.

``auto`` (the newest checkpoint that verifies, or a fresh start when there is none), ``latest`` (the one
``checkpoints/latest`` names), ``STEP`` (``checkpoints/step_NNNNNNNN``) or ``PATH`` (any checkpoint
folder); no ``--resume`` is no request (None). ``rollback`` and ``reshard`` travel with it. The checkpoint
manager resolves a request for good (:meth:`llmtools.ckpt.manager.CheckpointManager.resolve`: checksums
verified, rank 0 deciding); :meth:`ResumeRequest.likely_checkpoint` finds the same folder cheaply, before
torch, for the checks that run before any compute.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from llmtools.ckpt import layout
from llmtools.ckpt.verify import verify


@dataclass(frozen=True)
class ResumeRequest:
    """One ``--resume``: its kind (``auto`` | ``latest`` | ``step`` | ``path``), the step or path it
    names, and the flags that change how it is taken up."""

    given: str
    """The value as given (messages quote it)."""
    kind: Literal["auto", "latest", "step", "path"]
    step: int | None = None
    path: Path | None = None
    rollback: bool = False
    """Resume from a checkpoint older than the run's newest: move the newer ones aside first."""
    reshard: bool = False
    """Allow another ZeRO stage (1 <-> 2) through a DeepSpeed universal checkpoint."""

    @classmethod
    def parse(
        cls, spec: str | os.PathLike | None, *, rollback: bool = False, reshard: bool = False
    ) -> ResumeRequest | None:
        """The request ``spec`` makes (None: no ``--resume``). Any value parses: a step or path that names
        no checkpoint is refused when the request is resolved, naming what is missing."""
        if spec is None:
            return None
        given = str(spec)
        text = given.strip()
        if text in ("auto", "latest"):
            return cls(given, text, rollback=rollback, reshard=reshard)  # type: ignore[arg-type]
        if text.isdigit():
            return cls(given, "step", step=int(text), rollback=rollback, reshard=reshard)
        return cls(given, "path", path=Path(text), rollback=rollback, reshard=reshard)

    @property
    def auto(self) -> bool:
        return self.kind == "auto"

    def likely_checkpoint(self, ckpt_dir: Path) -> Path | None:
        """The checkpoint folder this request will most likely load, found without torch or checksums
        (the manager decides for good, with checksums, once the process group exists)."""
        if self.kind == "auto":
            found = [p for _, p in reversed(layout.list_checkpoints(ckpt_dir)) if verify(p, False, False).ok]
            return found[0] if found else None
        if self.kind == "latest":
            tag = layout.read_latest(ckpt_dir)
            return ckpt_dir / tag if tag else None
        path = ckpt_dir / layout.step_name(self.step) if self.step is not None else self.path
        return path if path is not None and path.is_dir() else None
