"""The one error model of llmtools.

The library raises these; the CLI maps them to a one-line message and an exit code
(2 for bad input or usage, 1 for a runtime failure). Messages name the file and the
place (line, byte offset, key, flag) so the user can go straight to the problem.
"""

from __future__ import annotations


class LlmtoolsError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with."""

    exit_code = 1


class InputError(LlmtoolsError):
    """Bad input: a malformed file, a missing key, a value out of range. Exit code 2."""

    exit_code = 2


class UsageError(LlmtoolsError):
    """Bad command-line usage or an impossible combination of options. Exit code 2."""

    exit_code = 2


class OutputExistsError(UsageError):
    """An output exists and ``--force`` was not given."""

    def __init__(self, path) -> None:
        super().__init__(f"{path}: already exists (use --force to overwrite)")


class RuntimeFailure(LlmtoolsError):
    """Something failed while doing valid work (a worker crashed, the disk filled). Exit code 1."""

    exit_code = 1


def where(path, line: int | None = None, offset: int | None = None, key: str | None = None) -> str:
    """Format a location as ``file:line`` / ``file@byte`` / ``file[key]`` for error messages."""
    text = str(path)
    if line is not None:
        text += f":{line}"
    if offset is not None:
        text += f"@byte {offset}"
    if key is not None:
        text += f"[{key}]"
    return text


class DiskFullError(RuntimeFailure):
    """The filesystem filled up while writing an output (ENOSPC, a quota, or a library's short write)."""

    def __init__(self, path, detail: str = "") -> None:
        self.path = path
        super().__init__(
            f"{path}: no space left on device{f' ({detail})' if detail else ''}; nothing was written"
        )


class Interrupted(BaseException):  # noqa: N818 - like KeyboardInterrupt, not an error of the input
    """SIGTERM or SIGHUP, raised in the main thread so that every context manager cleans up.

    A BaseException, as KeyboardInterrupt is: ``except Exception`` clauses must not swallow it.
    """

    def __init__(self, signum: int) -> None:
        import signal

        self.signum = signum
        super().__init__(signal.Signals(signum).name)
