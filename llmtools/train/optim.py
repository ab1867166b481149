"""Optimizers beyond AdamW, built from the same ``optimizer:`` config section, and their checks.

``adafactor``: ``torch.optim.Adafactor`` (Shazeer & Stern 2018 as torch implements it): no first moment
and, for matrices, a factored second moment (one row and one column vector), so its state is a few
percent of AdamW's two full-size moments. It reads ``lr`` and ``weight_decay`` (decoupled, per
parameter group as ``param_groups`` sets it); Adam's ``betas``/``eps`` do not apply. It runs on CPU.
Under ZeRO stages 1-2 DeepSpeed hands the optimizer flat 1-D partitions, so Adafactor cannot factor
them and keeps a full second moment (still no first moment): half of AdamW's state instead of ~0.

``lion`` (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): :class:`Lion`, ours.
Torch ships none; DeepSpeed's (``FusedLion``, ``DeepSpeedCPULion``) are CUDA kernels or a C++ op that
fails on DeepSpeed's CPU accelerator. Lion is elementwise, so it works unchanged on ZeRO's flat
partitions, stage 3 included.

``muon`` (Keller Jordan 2024; Moonshot's "Muon is Scalable for LLM Training" 2025): :class:`MuonWithAdamW`,
``torch.optim.Muon``'s update (its Newton-Schulz iteration and learning-rate adjustment, called from
torch) on every hidden matrix, ``torch.optim.AdamW`` itself on the embeddings, the output head, norms
and biases, as Muon's authors prescribe. Muon orthogonalizes whole matrices, but ZeRO stages 1-2 (and
DeepSpeed's bf16 optimizer) give the optimizer flat 1-D partitions that cut matrices anywhere: the
momentum is elementwise and stays partitioned; only the Newton-Schulz step gathers each matrix's
update from the ranks that hold its pieces (one all-gather per chunk of matrices, the volume of
ZeRO's own parameter all-gather), and every rank applies the orthogonalized update to its own
slice. The layout comes from DeepSpeed's own map of which slice of which parameter a partition holds
(``param._hp_mapping``, the one universal checkpoints read). ZeRO-3 partitions each parameter on its
own and steps sub-groups of them: not supported, refused before compute.

DeepSpeed's own Muon (``"optimizer": {"type": "Muon"}``) was not used: under ZeRO 1-2 it orthogonalizes
the gradient while reducing it, so its global gradient norm, and the clipping by it, cover the
orthogonalized updates rather than the gradients (the same config then trains differently at ZeRO-0
and ZeRO-1, and the grad norm we record and gate on would not be a gradient norm); its Newton-Schulz
runs through ``torch.compile``, which on CPU means a C++ build per shape.

DeepSpeed refuses client optimizers it has not tested unless ``zero_allow_untested_optimizer`` is set;
:func:`allow_in_deepspeed` sets it for ours.

Which optimizers there are, and what is checked before compute, is the torch-free table of
:mod:`llmtools.train.optimizers`; this module, which imports torch, is imported only once a model is built.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

# torch.optim.Muon's own pieces: its Newton-Schulz iteration, learning-rate adjustment and constants.
from torch.optim._muon import (
    DEFAULT_A,
    DEFAULT_B,
    DEFAULT_C,
    EPS,
    _adjust_lr,
    _zeropower_via_newtonschulz,
)

from llmtools.train.optimizers import OPTIMIZERS

# Chunks of whole matrices gathered at once under ZeRO (elements): bounds the transient buffer.
GATHER_CHUNK = 1 << 26


# -- parameter groups ----------------------------------------------------------------------------------
def outer_parameters(model) -> set[int]:
    """ids of the embeddings and the output head: never Muon's (its authors use AdamW for them)."""
    outer = set()
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            outer.update(id(p) for p in module.parameters())
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head = head if head is not None else getattr(model, "lm_head", None)
    if head is not None:
        outer.update(id(p) for p in head.parameters())
    return outer


def muon_param_groups(model, weight_decay: float) -> list[dict]:
    """Hidden matrices (2-D, or stacks of them such as MoE experts) for Muon; embeddings and head
    (decayed) and every 1-D parameter (norms, biases: never decayed) for AdamW."""
    outer = outer_parameters(model)
    hidden, matrices, vectors = [], [], []
    for _name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if param.ndim < 2:
            vectors.append(param)
        elif id(param) in outer:
            matrices.append(param)
        else:
            hidden.append(param)
    groups = [{"params": hidden, "weight_decay": weight_decay, "muon": True}]
    if matrices:
        groups.append({"params": matrices, "weight_decay": weight_decay, "muon": False})
    if vectors:
        groups.append({"params": vectors, "weight_decay": 0.0, "muon": False})
    return groups


# -- building -----------------------------------------------------------------------------------------
def build_optimizer(section, groups: list[dict], device: str = "cpu"):
    """A torch optimizer for ``section.name`` over ``groups`` (weight decay already per group)."""
    kwargs = {"fused": True} if device.startswith("cuda") else {"foreach": False}
    build = getattr(sys.modules[__name__], OPTIMIZERS[section.name].build)
    return build(section, groups, kwargs)


def build_adamw(section, groups: list[dict], device_kwargs: dict):
    return torch.optim.AdamW(
        groups, lr=section.lr, betas=tuple(section.betas), eps=section.eps, weight_decay=section.weight_decay,
        **device_kwargs,
    )  # fmt: skip


def build_adafactor(section, groups: list[dict], device_kwargs: dict):
    return torch.optim.Adafactor(groups, lr=section.lr, weight_decay=section.weight_decay, foreach=False)


def build_lion(section, groups: list[dict], device_kwargs: dict):
    return Lion(groups, lr=section.lr, betas=tuple(section.betas), weight_decay=section.weight_decay)


def build_muon(section, groups: list[dict], device_kwargs: dict):
    return MuonWithAdamW(
        groups,
        lr=section.lr,
        betas=tuple(section.betas),
        eps=section.eps,
        weight_decay=section.weight_decay,
        muon_lr=section.muon_lr or section.lr,
        momentum=section.momentum,
        nesterov=section.nesterov,
        ns_steps=section.ns_steps,
        adjust_lr_fn=section.muon_adjust_lr,
        adamw_kwargs=device_kwargs,
    )


def allow_in_deepspeed(ds_config: dict, name: str) -> None:
    """Let DeepSpeed's ZeRO accept an optimizer outside its tested list (AdamW is on it)."""
    if not OPTIMIZERS[name].deepspeed_tested:
        ds_config.setdefault("zero_allow_untested_optimizer", True)


# -- the optimizer classes ---------------------------------------------------------------------------
class Lion(torch.optim.Optimizer):
    """Lion: ``p -= lr * (sign(beta1 m + (1 - beta1) g) + wd p)``, then ``m = beta2 m + (1 - beta2) g``.

    Weight decay is decoupled (applied as ``p *= 1 - lr wd`` before the signed step, as in the paper's
    Algorithm 2); the state is one momentum per parameter, elementwise."""

    def __init__(self, params, lr: float = 1e-4, betas=(0.9, 0.99), weight_decay: float = 0.0) -> None:
        if not lr > 0:
            raise ValueError(f"Lion: lr must be > 0, got {lr}")
        if not all(0 <= b < 1 for b in betas):
            raise ValueError(f"Lion: betas must be in [0, 1), got {betas}")
        if weight_decay < 0:
            raise ValueError(f"Lion: weight_decay must be >= 0, got {weight_decay}")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                exp_avg = state["exp_avg"]
                update = exp_avg.lerp(grad, 1 - beta1).sign_()
                if wd:
                    p.mul_(1 - lr * wd)
                p.add_(update, alpha=-lr)
                exp_avg.lerp_(grad, 1 - beta2)
        return loss


class MuonWithAdamW(torch.optim.Optimizer):
    """torch.optim.Muon on the groups marked ``muon``, torch.optim.AdamW on the others, as one
    optimizer (DeepSpeed wraps one). The Muon groups may hold whole matrices (and stacks of them) or,
    once :meth:`bind_partitions` has run, DeepSpeed's flat partitions of them."""

    def __init__(
        self,
        groups: list[dict],
        *,
        lr: float,
        betas,
        eps: float,
        weight_decay: float,
        muon_lr: float,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        adjust_lr_fn: str = "match_rms_adamw",
        adamw_kwargs: dict | None = None,
    ) -> None:
        muon_groups = [g for g in groups if g.get("muon")]
        adam_groups = [g for g in groups if not g.get("muon")]
        for group in muon_groups:
            for p in group["params"]:
                if p.ndim < 2:
                    raise ValueError(f"Muon: a {p.ndim}-D parameter in a Muon group (matrices only)")
            group.setdefault("lr", muon_lr)
            group.setdefault("weight_decay", weight_decay)
            group.update(
                momentum=momentum,
                nesterov=nesterov,
                ns_coefficients=(DEFAULT_A, DEFAULT_B, DEFAULT_C),
                eps=EPS,
                ns_steps=ns_steps,
                adjust_lr_fn=adjust_lr_fn,
            )
        # AdamW checks its arguments and fills its defaults into the (shared) group dicts.
        self._adamw = (
            torch.optim.AdamW(
                adam_groups,
                lr=lr,
                betas=betas,
                eps=eps,
                weight_decay=weight_decay,
                **(adamw_kwargs or {}),
            )
            if adam_groups
            else None
        )
        super().__init__(muon_groups + adam_groups, {"lr": lr})
        self._layouts: dict[int, _MuonLayout] = {}

    def bind_partitions(self, model, process_group=None) -> int:
        """After ``deepspeed.initialize``: learn which slices of which matrices each flat partition in
        a Muon group holds (DeepSpeed's ``_hp_mapping``); every rank learns every matrix's place.
        Returns the number of flat partitions bound (0 when the optimizer holds whole matrices)."""
        # Muon groups hold matrices; a 1-D tensor there is a flat partition (DeepSpeed's fp32 copies of
        # whole matrices, as its fp16/bf16 wrapper at ZeRO-0 keeps them, stay matrices).
        flats = [p for g in self.param_groups if g["muon"] for p in g["params"] if p.ndim == 1]
        if not flats:
            return 0
        world = dist.get_world_size(process_group) if dist.is_initialized() else 1
        rank = dist.get_rank(process_group) if dist.is_initialized() else 0
        by_storage = {p.untyped_storage().data_ptr(): p for p in flats}
        local: dict[int, list] = {id(p): [] for p in flats}
        for index, param in enumerate(model.parameters()):
            mapping = getattr(param, "_hp_mapping", None)
            if mapping is None:
                continue
            flat = by_storage.get(mapping.hp_fragment.untyped_storage().data_ptr())
            if flat is None:
                continue
            start = (
                rank * flat.numel() + mapping.hp_fragment_address.start - mapping.lp_fragment_address.start
            )
            local[id(flat)].append((index, start, tuple(param.shape)))
        for flat_index, flat in enumerate(flats):
            pieces = [local[id(flat)]]
            if world > 1:
                gathered = [None] * world
                dist.all_gather_object(gathered, local[id(flat)], group=process_group)
                pieces = gathered
            matrices = sorted({entry for part in pieces for entry in part}, key=lambda e: e[1])
            if not matrices:
                raise RuntimeError(
                    f"Muon: DeepSpeed's partition {flat_index} maps to no parameter (no _hp_mapping): this "
                    "DeepSpeed optimizer wrapper is not supported with Muon"
                )
            self._layouts[id(flat)] = _MuonLayout(
                [(start, shape) for _i, start, shape in matrices],
                flat.numel(),
                rank,
                world,
                process_group,
            )
        return len(flats)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # DeepSpeed steps one group at a time (param_groups swapped to that group) and a loaded
        # checkpoint replaces the group dicts: hand AdamW whatever its groups are now.
        adam_groups = [g for g in self.param_groups if not g["muon"]]
        if adam_groups:
            self._adamw.param_groups = adam_groups
            self._adamw.state = self.state
            self._adamw.step()
        for group in self.param_groups:
            if group["muon"]:
                self._muon_step(group)
        return loss

    def _muon_step(self, group: dict) -> None:
        lr, wd, momentum = group["lr"], group["weight_decay"], group["momentum"]
        for p in group["params"]:
            if p.grad is None:
                continue
            grad = p.grad
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
            buf = state["momentum_buffer"]
            # torch.optim.Muon's elementwise part, here on a whole matrix or on a flat partition
            buf.lerp_(grad, 1 - momentum)
            update = grad.lerp(buf, momentum) if group["nesterov"] else buf
            layout = self._layouts.get(id(p))
            p.mul_(1 - lr * wd)
            if layout is None:  # whole matrices (or stacks of them, e.g. one per expert)
                flat_p, flat_u = p.view(-1), update.reshape(-1)
                rows, cols = p.shape[-2:]
                for k in range(p.numel() // (rows * cols)):
                    span = slice(k * rows * cols, (k + 1) * rows * cols)
                    ortho = self._orthogonalize(flat_u[span].view(rows, cols), group)
                    adjusted = _adjust_lr(lr, group["adjust_lr_fn"], (rows, cols))
                    flat_p[span].add_(ortho.reshape(-1), alpha=-adjusted)
            else:
                for start, matrix, pieces in layout.gathered(update):
                    rows, cols = matrix
                    ortho = self._orthogonalize(pieces.view(rows, cols), group).reshape(-1)
                    adjusted = _adjust_lr(lr, group["adjust_lr_fn"], (rows, cols))
                    lo, hi = layout.local_span(start, rows * cols)
                    if lo < hi:
                        p[lo - layout.offset : hi - layout.offset].add_(
                            ortho[lo - start : hi - start], alpha=-adjusted
                        )

    @staticmethod
    def _orthogonalize(matrix, group):
        return _zeropower_via_newtonschulz(matrix, group["ns_coefficients"], group["ns_steps"], group["eps"])


@dataclass
class _MuonLayout:
    """Where the matrices of one flat Muon group lie: ``entries`` (global start, shape) over the flat
    buffer whose ``rank``-th partition of ``size`` elements this rank holds."""

    entries: list
    size: int
    rank: int
    world: int
    group: object

    @property
    def offset(self) -> int:
        return self.rank * self.size

    def local_span(self, start: int, numel: int) -> tuple[int, int]:
        return max(start, self.offset), min(start + numel, self.offset + self.size)

    def matrices(self):
        """(global start, (rows, cols)) of every matrix, stacks split into their matrices."""
        for start, shape in self.entries:
            rows, cols = shape[-2:]
            for k in range(math.prod(shape[:-2])):
                yield start + k * rows * cols, (rows, cols)

    def gathered(self, local_update):
        """Yield (start, (rows, cols), the matrix's whole update) for every matrix with a piece on this
        rank; all ranks take part in the same all-gathers (chunks of whole matrices)."""
        chunk: list = []
        numel = 0
        for entry in self.matrices():
            chunk.append(entry)
            numel += entry[1][0] * entry[1][1]
            if numel >= GATHER_CHUNK:
                yield from self._chunk(chunk, local_update)
                chunk, numel = [], 0
        if chunk:
            yield from self._chunk(chunk, local_update)

    def _chunk(self, chunk: list, local_update):
        begin = chunk[0][0]
        end = chunk[-1][0] + chunk[-1][1][0] * chunk[-1][1][1]
        if self.world == 1:
            full, base = local_update, 0
        else:
            spans = [(max(begin, q * self.size), min(end, (q + 1) * self.size)) for q in range(self.world)]
            width = max(hi - lo for lo, hi in spans)
            lo, hi = spans[self.rank]
            mine = torch.zeros(width, dtype=local_update.dtype, device=local_update.device)
            if lo < hi:
                mine[: hi - lo] = local_update[lo - self.offset : hi - self.offset]
            parts = [torch.empty_like(mine) for _ in range(self.world)]
            dist.all_gather(parts, mine, group=self.group)
            full = torch.cat([part[: max(b - a, 0)] for part, (a, b) in zip(parts, spans, strict=True)])
            base = begin
        for start, (rows, cols) in chunk:
            lo, hi = self.local_span(start, rows * cols)
            if lo < hi:
                yield start, (rows, cols), full[start - base : start - base + rows * cols]
