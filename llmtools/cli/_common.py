"""What every command shares: the error model, stdout/stderr conventions, debug tracebacks.

Library code raises :class:`llmtools.errors.LlmtoolsError`; :func:`run` turns it into one line on
stderr and the error's exit code (2 bad input/usage, 1 runtime failure). ``LLMTOOLS_DEBUG=1``
shows the traceback instead. Results go to stdout; progress, logs and errors to stderr.
"""

from __future__ import annotations

import os
import sys
import traceback

import typer

from llmtools.errors import Interrupted, LlmtoolsError
from llmtools.formats import jsonfile

BROKEN_PIPE_EXIT = 141
"""Exit status when stdout's reader went away: 128 + SIGPIPE, as for a Unix tool."""

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def new_app(name: str, help: str, *, single_command: bool = False) -> typer.Typer:
    return typer.Typer(
        name=name,
        help=help,
        add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings=CONTEXT_SETTINGS,
    )


def debug_enabled() -> bool:
    return os.environ.get("LLMTOOLS_DEBUG", "") not in ("", "0", "false", "no")


_SKIP_NATIVE_TEARDOWN = False


def skip_native_teardown() -> None:
    """End this process without destroying the native libraries' static state (see :func:`_leave`): for
    a command that ran torch.distributed / DeepSpeed work, once that work is done and torn down."""
    global _SKIP_NATIVE_TEARDOWN
    _SKIP_NATIVE_TEARDOWN = True


def _leave_soon() -> None:
    """A stopped command is expected gone within seconds (a scheduler's kill -9 follows its SIGTERM):
    the interpreter's last garbage collection walks every object the libraries made (torch's alone:
    1-2 s, several on a loaded machine) to find cycles whose only loss is a finalizer at exit. Frozen
    objects are left out of it; atexit handlers, buffered output and module teardown still run."""
    import gc

    gc.freeze()


def _leave(code: int) -> None:
    """Exit with ``code``; after distributed work, without the native teardown
    (:func:`llmtools.train.distributed.exit_without_native_teardown`)."""
    if not _SKIP_NATIVE_TEARDOWN:
        sys.exit(code)
    from llmtools.train.distributed import exit_without_native_teardown

    exit_without_native_teardown(code)


_ENDING: list = []  # the ending hook of the command being run (see run)


def run(app: typer.Typer, prog: str, interrupted_note=None, ending=None) -> None:
    """Invoke a typer app under the one error model.

    SIGTERM, SIGHUP and SIGINT become :class:`Interrupted` in the main thread (see :mod:`llmtools.interrupt`),
    so every writer removes its temporaries as the exception unwinds; whatever is still registered is
    removed before the process exits, however it exits. click runs in non-standalone mode so that its own
    handling (an "Aborted!" for an EOFError, a blank line and exit 1 for Ctrl-C) never replaces ours.
    ``interrupted_note()``: what the line of an interrupted command adds (llm-train: why a launcher's rank
    may be stopped). ``ending(code, line)``: told how the command ends (its last line, or None) before it
    exits; when it returns True it has taken the line, which is then not printed (llm-train's workers
    hand theirs to the launcher that started them).
    """
    from llmtools import interrupt
    from llmtools.fsutil import remove_temporaries

    previous = interrupt.install(prog)
    code = 0
    _ENDING[:] = [ending] if ending is not None else []
    try:
        try:
            result = _with_version(app, prog)(prog_name=prog, standalone_mode=False)
        finally:
            # The command is over, whichever way: a signal from now on (a launcher stopping every rank
            # once one has ended) must not turn its ending into a traceback.
            interrupt.ending()
        code = result if isinstance(result, int) and not isinstance(result, bool) else 0
    except (Interrupted, KeyboardInterrupt) as stop:
        code = _interrupted(prog, stop, interrupted_note)
        _leave_soon()
    except StdoutGone:
        code = _other(prog, BrokenPipeError())
    except LlmtoolsError as error:
        if debug_enabled():
            traceback.print_exc()
        code = _fail(prog, str(error), error.exit_code)
    except Exception as error:
        # click's own errors (typer vendors click, so they are told apart by name): usage on one line.
        kinds = {cls.__name__ for cls in type(error).__mro__}
        if "NoArgsIsHelpError" in kinds:
            error.show()
            code = error.exit_code
        elif "ClickException" in kinds:
            context = getattr(error, "ctx", None)
            hint = f" (see '{context.command_path} --help')" if context is not None else ""
            code = _fail(prog, error.format_message() + hint, error.exit_code)
        elif "Abort" in kinds:
            cause = error.__cause__ or error.__context__
            if isinstance(cause, KeyboardInterrupt):  # a library's own Ctrl-C handling, through click
                code = _interrupted(prog, cause, interrupted_note)
            else:
                code = _fail(prog, _internal(cause) if cause is not None else "aborted", 1)
        else:
            code = _other(prog, error)
    finally:
        remove_temporaries()
        interrupt.restore(previous)
    if _ENDING and not _LAST_SAID:
        _ENDING[0](code, None)
    _ENDING.clear()
    _LAST_SAID.clear()
    _leave(code)


def _with_version(app: typer.Typer, prog: str):
    """The app's click command with ``--version`` (the installed distribution's version) added."""

    def show(context, _param, value: bool) -> None:
        if value and not context.resilient_parsing:
            from llmtools import __version__

            emit(f"{prog} {__version__}")
            context.exit(0)

    command = typer.main.get_command(app)
    command.params.append(
        typer.core.TyperOption(
            param_decls=["--version"], type=bool, default=False, is_flag=True, expose_value=False, is_eager=True, callback=show,
            help="Show the version and exit.",
        )
    )  # fmt: skip
    return command


def _interrupted(prog: str, stop: BaseException, note=None) -> int:
    from llmtools import interrupt
    from llmtools.fsutil import remove_temporaries

    remove_temporaries()
    name = str(stop) if isinstance(stop, Interrupted) else "SIGINT"
    extra = note() if note is not None else ""
    code = interrupt.exit_code(stop)
    _last_line(f"{prog}: interrupted by {name}; temporaries removed, nothing half-written left{extra}", code)
    return code


def _other(prog: str, error: Exception) -> int:
    if isinstance(error, BrokenPipeError):
        # The reader of our stdout went away (`| head`): end quietly with the status a Unix tool killed
        # by SIGPIPE has (128 + 13, what the shell shows for `cat big | head`; `set -o pipefail` sees
        # it), after pointing stdout at /dev/null so the interpreter's final flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return BROKEN_PIPE_EXIT
    if debug_enabled():
        traceback.print_exception(error)
    if isinstance(error, OSError):
        where = f"{error.filename}: " if getattr(error, "filename", None) else ""
        return _fail(prog, f"{where}{error.strerror or error}", 1)
    return _fail(prog, _internal(error), 1)  # the last line of defence: one line, exit 1


def _internal(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"internal error: {type(error).__name__}: {text} (set LLMTOOLS_DEBUG=1 for a traceback)"


def _fail(prog: str, message: str, code: int) -> int:
    _last_line(f"{prog}: error: {' '.join(message.splitlines())}", code)
    return code


_LAST_SAID: list = []  # the ending hook was told the last line already


def _last_line(line: str, code: int) -> None:
    """The command's last line: to the ending hook of :func:`run` if it takes it, else to stderr."""
    if _ENDING:
        _LAST_SAID.append(line)
        if _ENDING[0](code, line):
            return
    log(line)


class StdoutGone(Exception):
    """Our stdout's reader went away. Not an OSError: click turns an EPIPE into a silent exit 1."""


def emit(line: str) -> None:
    """A result line on stdout (paths of written files, one per line)."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        raise StdoutGone() from None


def report(prog: str, result, as_json: bool, quiet: bool) -> None:
    """The usual ending of a command that writes files: a summary on stderr, then the written paths on
    stdout one per line (or ``result.to_dict()`` as JSON with ``--json``)."""
    if not quiet:
        summary = result.summary
        log(f"{prog}: {summary() if callable(summary) else summary}")
    if as_json:
        emit(jsonfile.output(result.to_dict()))
    else:
        for path in result.paths:
            emit(str(path))


def log(message: str) -> None:
    """A human-facing message on stderr, in one write: with several ranks on one stream (torchrun, srun)
    and Python unbuffered (PYTHONUNBUFFERED, common under Slurm), print's separate newline lets lines
    of two ranks run together."""
    sys.stderr.write(f"{message}\n")
    sys.stderr.flush()


def expand_multi_value_flags(
    argv: list[str], flags: tuple[str, ...], stop_at_files: bool = False, grouped: tuple[str, ...] = ()
) -> list[str]:
    """Megatron's ``nargs='+'`` spelling for click: ``--flag a b`` -> ``--flag a --flag b``.

    Values run to the next option (a negative number is still a value); with ``stop_at_files`` also to
    the first existing file, so ``--json-keys text corpus.jsonl`` leaves the input alone. A ``grouped``
    flag keeps its values together as one: ``--stage end 0.5 0.5`` -> ``--stage "end 0.5 0.5"``."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in grouped:
            j = i + 1
            while j < len(argv) and (not argv[j].startswith("-") or _looks_numeric(argv[j])):
                j += 1
            out += [arg, " ".join(argv[i + 1 : j])] if j > i + 1 else [arg]
            i = j
            continue
        if arg in flags:
            j = i + 1
            while j < len(argv) and (not argv[j].startswith("-") or _looks_numeric(argv[j])):
                if stop_at_files and j > i + 1 and os.path.isfile(argv[j]):
                    break
                out += [arg, argv[j]]
                j += 1
            if j == i + 1:
                out.append(arg)  # let the parser report the missing value
            i = j
            continue
        out.append(arg)
        i += 1
    return out


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False
