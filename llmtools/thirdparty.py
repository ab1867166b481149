"""Third-party libraries imported so that they keep off stdout, which holds a command's results only.

DeepSpeed prints its accelerator banner ("Setting ds_accelerator to cpu") through a logger whose handler
it binds to ``sys.stdout`` when the package is first imported; every later message of that logger goes
the same way. Importing it once with ``sys.stdout`` pointing at stderr binds the handler there for good.
"""

from __future__ import annotations

import contextlib
import sys


def import_deepspeed():
    """``import deepspeed`` with its logger on stderr (call before any ``deepspeed`` import)."""
    if "deepspeed" not in sys.modules:
        with contextlib.redirect_stdout(sys.stderr):
            import deepspeed  # noqa: F401
    return sys.modules["deepspeed"]
