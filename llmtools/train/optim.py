"""Optimizers beyond AdamW, built from the same ``optimizer:`` config section.

``adafactor``: ``torch.optim.Adafactor`` (Shazeer & Stern 2018 as torch implements it): no first moment
and, for matrices, a factored second moment (one row and one column vector), so its state is a few
percent of AdamW's two full-size moments. It reads ``lr`` and ``weight_decay`` (decoupled, per
parameter group as ``param_groups`` sets it); Adam's ``betas``/``eps`` do not apply. It runs on CPU.

Under ZeRO stages 1-2 DeepSpeed hands the optimizer flat 1-D partitions, so Adafactor cannot factor
them and keeps a full second moment (still no first moment): half of AdamW's state instead of ~0.
DeepSpeed refuses client optimizers it has not tested unless ``zero_allow_untested_optimizer`` is set;
:func:`allow_in_deepspeed` sets it for ours.
"""

from __future__ import annotations


def build_optimizer(section, groups: list[dict], device: str = "cpu"):
    """A torch optimizer for ``section.name`` over ``groups`` (weight decay already per group)."""
    import torch

    if section.name == "adafactor":
        return torch.optim.Adafactor(groups, lr=section.lr, weight_decay=section.weight_decay, foreach=False)
    kwargs = {"fused": True} if device.startswith("cuda") else {"foreach": False}
    return torch.optim.AdamW(
        groups, lr=section.lr, betas=tuple(section.betas), eps=section.eps, weight_decay=section.weight_decay,
        **kwargs,
    )  # fmt: skip


def allow_in_deepspeed(ds_config: dict, name: str) -> None:
    """Let DeepSpeed's ZeRO accept an optimizer outside its tested list (AdamW is on it)."""
    if name != "adamw":
        ds_config.setdefault("zero_allow_untested_optimizer", True)
