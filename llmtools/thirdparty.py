"""Third-party libraries imported so that they keep off stdout, which holds a command's results only.

DeepSpeed prints its accelerator banner ("Setting ds_accelerator to cpu") through a logger whose handler
it binds to ``sys.stdout`` when the package is first imported; every later message of that logger goes
the same way. Importing it once with ``sys.stdout`` pointing at stderr binds the handler there for good.

On a machine without a GPU it also warns "Setting accelerator to CPU. If you have GPU or other accelerator,
we were unable to detect it." at every start: llm-train chose the CPU itself (no CUDA device), so the line
says nothing the run does not, and it is dropped; its other warnings stay.
"""

from __future__ import annotations

import contextlib
import logging
import sys


def _not_the_cpu_banner(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Setting accelerator to CPU.")


def import_deepspeed():
    """``import deepspeed`` with its logger on stderr (call before any ``deepspeed`` import)."""
    ds_logger = logging.getLogger("DeepSpeed")  # the logger DeepSpeed makes (and configures) on import
    if _not_the_cpu_banner not in ds_logger.filters:
        ds_logger.addFilter(_not_the_cpu_banner)
    if "deepspeed" not in sys.modules:
        with contextlib.redirect_stdout(sys.stderr):
            import deepspeed  # noqa: F401
    return sys.modules["deepspeed"]
