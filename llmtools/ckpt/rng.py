"""Capture and restore the random number generators a training process draws from (per rank)."""

from __future__ import annotations

import os
import random
from typing import Any

from llmtools.errors import InputError


def capture() -> dict[str, Any]:
    import numpy as np
    import torch

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict[str, Any], source: str | os.PathLike = "RNG file") -> None:
    """Set every generator from ``state`` (as :func:`capture` made it); InputError naming ``source`` when
    the state is malformed (the generators then keep their values)."""
    import numpy as np
    import torch

    if not isinstance(state, dict) or not all(k in state for k in ("python", "numpy", "torch")):
        raise InputError(f"{source}: not an RNG state (expected python, numpy and torch entries)")
    saved = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
        if state.get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
    except (TypeError, ValueError, RuntimeError) as error:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.set_rng_state(saved[2])
        raise InputError(f"{source}: malformed RNG state ({error})") from None


def seed_all(seed: int) -> None:
    """Start every stream afresh from ``seed`` (a resumed run given a new seed with --reset-data)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # CUDA generators included
