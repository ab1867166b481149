"""Run one of DeepSpeed's checkpoint tools as a program, with its ``torch.load`` routed through our gate.

``python -m llmtools.ckpt.dstool deepspeed.checkpoint.ds_to_universal ARGS`` runs that module as
``__main__`` while :func:`llmtools.ckpt.safeload.routed_torch_load` holds: each file the tool loads passes
the archive check, the pickle bounds and the allowlist (worker processes are forked, so they inherit the
routing). A refused file ends the program with :data:`INPUT_ERROR` and one line on stdout
(:func:`input_error` reads it back) for the parent to report.
"""

from __future__ import annotations

import runpy
import sys

INPUT_ERROR = 2
_TOOLS = ("deepspeed.checkpoint.ds_to_universal",)
_PREFIX = "llmtools-input-error: "


def input_error(output: str) -> str | None:
    """The refusal line a child printed, if any."""
    lines = [line for line in output.splitlines() if line.startswith(_PREFIX)]
    return lines[-1].removeprefix(_PREFIX) if lines else None


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in _TOOLS:
        print(f"usage: python -m llmtools.ckpt.dstool {{{','.join(_TOOLS)}}} ARGS", file=sys.stderr)
        return 64
    import multiprocessing

    from llmtools.ckpt.safeload import routed_torch_load
    from llmtools.errors import InputError

    multiprocessing.set_start_method("fork", force=True)  # workers must inherit the routing
    sys.argv = list(argv)
    try:
        with routed_torch_load():
            runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
    except InputError as error:
        print(_PREFIX + str(error), flush=True)
        return INPUT_ERROR
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
