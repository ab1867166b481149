"""The parameter norm and the size of each update, measured where the optimizer steps.

``params_norm`` is the global L2 norm of the trained parameters after the step, ``update_norm`` the norm
of what the step changed (new - old, weight decay included), ``update_ratio`` their quotient: the
"update-to-data" ratio the training guides watch (around 1e-3 per step is the usual healthy range for
AdamW; a jump of orders of magnitude marks a run going wrong).

They are computed on the optimizer's own copy of the parameters: under ZeRO (and DeepSpeed's bf16
optimizer) that is the fp32 master partition of this rank, so the cost is one copy of the partition
(the old values) and two norms over it, on the steps that are measured only, then one all-reduce of
two numbers; with ZeRO-0 in fp32 the optimizer holds the model's own parameters, the same on every
rank, and no reduction is needed. A skipped step (health gate, fp16 overflow) changes nothing and
is not measured.
"""

from __future__ import annotations

import math


class NormMonitor:
    """Wraps nothing itself: the optimizer's step wrapper (:func:`~llmtools.train.health.wrap_step`)
    calls :meth:`before` and :meth:`after` around each inner step while :attr:`active`."""

    def __init__(self, optimizer, model) -> None:
        # Partitions (ZeRO, DeepSpeed's bf16 optimizer) hold a share of the parameters each: the sums add
        # over ranks. Whole tensors (the model's own, or fp32 copies of them) are the same on every rank.
        trained = sorted(tuple(p.shape) for p in model.parameters() if p.requires_grad)
        held = sorted(tuple(p.shape) for g in optimizer.param_groups for p in g["params"])
        self.partitioned = held != trained
        self.active = False
        self._params_sq = 0.0
        self._update_sq = 0.0
        self._measured = False

    def begin(self) -> None:
        """Measure the next step."""
        self.active, self._measured = True, False
        self._params_sq = self._update_sq = 0.0

    def before(self, optimizer) -> list | None:
        """The old values of the parameters this inner step will update (None when not measuring)."""
        if not self.active:
            return None
        return [p.detach().clone() for g in optimizer.param_groups for p in g["params"] if p.grad is not None]

    def after(self, optimizer, old: list | None) -> None:
        if old is None:
            return
        import torch

        new = [p.detach() for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        for after, before in zip(new, old, strict=True):
            self._params_sq += float(torch.linalg.vector_norm(after, dtype=torch.float32)) ** 2
            delta = torch.sub(after, before, out=before)  # in place: no second copy
            self._update_sq += float(torch.linalg.vector_norm(delta, dtype=torch.float32)) ** 2
        self._measured = True

    def finish(self, device) -> dict[str, float] | None:
        """params_norm, update_norm, update_ratio of the step (all ranks call it: one all-reduce), or None
        when the step was not measured (skipped, or not active)."""
        if not self.active:
            return None
        self.active = False
        local = [self._params_sq, self._update_sq, 1.0 if self._measured else 0.0]
        if self.partitioned:
            import torch
            import torch.distributed as dist

            tensor = torch.tensor(local, dtype=torch.float64, device=device)
            if dist.is_initialized() and dist.get_world_size() > 1:
                dist.all_reduce(tensor)
            local = tensor.tolist()
        if not local[2]:
            return None
        params, update = math.sqrt(local[0]), math.sqrt(local[1])
        return {
            "params_norm": params,
            "update_norm": update,
            "update_ratio": update / params if params > 0 else float("nan"),
        }
