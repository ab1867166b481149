"""The sandbox a chat template renders in: what it may compute, for how long, and how large.

Templates are untrusted code. Compiled as ``transformers`` compiles them (an ``ImmutableSandboxedEnvironment``
with ``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, ``{% generation %}``, a non-escaping ``tojson``,
``raise_exception`` and ``strftime_now``), and on top of that deterministic and bounded. Deterministic: the same
conversation gives the same text in every run. ``strftime_now`` reads a pinned date (:func:`pinned_date`, by
default :data:`DEFAULT_TEMPLATE_DATE`), never the clock; the sources of randomness Jinja offers (the ``random``
filter, the ``lipsum`` global) are refused when the template compiles, and printing an object whose text holds its
memory address (a function, a ``joiner``) is refused when it renders. Bounded: operations that multiply sizes (``*``,
``**``, ``%`` and ``format`` widths, ``ljust``/``center``/``indent``/``join``/``replace`` ...) are checked
before they run; every string or list a template builds is checked after; a rendering that runs too long is
stopped (SIGALRM in the main thread, checks at each call and attribute access elsewhere). Exceeding a limit is
a :class:`TemplateLimitError`.

``{% generation %}`` blocks are recorded as transformers' ``AssistantTracker`` records them for
``return_assistant_tokens_mask``, while :func:`recording_generation_blocks` is active around one rendering
(:class:`GenerationBlocks`); otherwise they render their body through.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import re
import signal
import threading
import time
from functools import lru_cache, wraps

from llmtools.errors import InputError

MAX_RENDER_CHARS = 16 << 20
"""Longest rendering of one conversation, and largest string or list a template may build."""
MAX_RENDER_SECONDS = 10.0
"""Longest time rendering one conversation may take (all its prefixes together), by default."""
MAX_NUMBER_DIGITS = 4300
"""Largest power a template may compute, in decimal digits (Python's own limit for printing an int)."""


DEFAULT_TEMPLATE_DATE = "2024-07-26"
"""The date ``strftime_now`` gives a template unless the user pins another (``--template-date``): the one
Llama 3.1's template falls back to when it has no clock, so a rendering never depends on the day it ran."""
RANDOM_FILTERS = ("random",)
RANDOM_GLOBALS = ("lipsum",)
"""Jinja's sources of randomness: a template that names one is refused when it compiles."""


class TemplateRenderError(InputError):
    """The template failed on this conversation (raise_exception, an undefined variable, a type error)."""


class TemplateLimitError(TemplateRenderError):
    """The template exceeded a size, time or recursion limit on this conversation."""


class CompileError(Exception):
    """The template does not compile: Jinja's line and message (the caller names the template)."""

    def __init__(self, lineno: int | None, message: str, what: str = "syntax error") -> None:
        super().__init__(message)
        self.lineno, self.message, self.what = lineno, message, what


# -- generation blocks -----------------------------------------------------------------------------
class GenerationBlocks:
    """Where each ``{% generation %}`` block's output lands in one streaming rendering.

    As transformers records it: a block starts at the number of characters the rendering has yielded when
    the block has rendered (``yielded``, kept up to date by whoever consumes the stream) and ends its
    output's length later. The output itself is kept too, so that a block whose output was buffered
    (inside a macro or a ``{% set %}`` block: the offsets then point elsewhere) can be told apart."""

    def __init__(self) -> None:
        self.yielded = 0
        self.blocks: list[tuple[int, str]] = []

    def spans(self, rendering: str) -> list[tuple[int, int]] | None:
        """The blocks' ``[start, end)`` spans in order, empty ones left out, overlapping ones merged;
        ``None`` when a block's output is not at its recorded offset in ``rendering``."""
        spans: list[tuple[int, int]] = []
        for start, text in sorted(self.blocks):
            if not rendering.startswith(text, start):
                return None
            end = start + len(text)
            if spans and start < spans[-1][1]:
                spans[-1] = (spans[-1][0], max(end, spans[-1][1]))
            elif end > start:
                spans.append((start, end))
        return spans


# Per rendering, never per template: one compiled template is shared by every thread and rendering.
_recording: contextvars.ContextVar[GenerationBlocks | None] = contextvars.ContextVar(
    "generation_blocks", default=None
)


@contextlib.contextmanager
def recording_generation_blocks():
    """Record the ``{% generation %}`` blocks of the rendering done inside (yields :class:`GenerationBlocks`)."""
    blocks = GenerationBlocks()
    token = _recording.set(blocks)
    try:
        yield blocks
    finally:
        _recording.reset(token)


@lru_cache(maxsize=16)
def has_generation_blocks(text: str) -> bool:
    """Whether the template marks assistant text with ``{% generation %}`` blocks (a tag in a comment or a
    string does not count)."""
    import jinja2.nodes

    tree = compile_template(text).environment.parse(text)
    return any(
        isinstance(node.call.node, jinja2.nodes.ExtensionAttribute) and node.call.node.name == "_recorded"
        for node in tree.find_all(jinja2.nodes.CallBlock)
    )


# -- the pinned date -------------------------------------------------------------------------------
_date: contextvars.ContextVar[str | None] = contextvars.ContextVar("template_date", default=None)


def check_date(text: str, flag: str = "--template-date") -> str:
    """``text`` if it is a date ``YYYY-MM-DD``; an InputError naming ``flag`` otherwise."""
    from datetime import date

    try:
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
            raise ValueError
        date.fromisoformat(text)
    except (TypeError, ValueError):
        raise InputError(
            f"{flag}: {text!r} is not a date YYYY-MM-DD (e.g. {DEFAULT_TEMPLATE_DATE})"
        ) from None
    return text


@contextlib.contextmanager
def pinned_date(text: str):
    """The date ``strftime_now`` gives the renderings done inside (midnight of ``text``, YYYY-MM-DD)."""
    token = _date.set(check_date(text))
    try:
        yield
    finally:
        _date.reset(token)


def _strftime_now(format):
    from datetime import datetime

    return datetime.fromisoformat(_date.get() or DEFAULT_TEMPLATE_DATE).strftime(format)


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _finalize(value):
    """What ``{{ ... }}`` prints: never an object's memory address, which differs run to run."""
    if value is None or isinstance(value, (str, int, float)):
        return value
    from jinja2 import Undefined

    if not isinstance(value, Undefined) and _ADDRESS.search(str(value)):
        raise TemplateRenderError(
            f"chat template {getattr(_state, 'source', '?')}: prints {type(value).__name__} object "
            "(its text holds a memory address, which differs run to run)"
        )
    return value


def _randomness(tree) -> tuple[int | None, str] | None:
    """The first use of a source of randomness in a parsed template: (line, what)."""
    import jinja2.nodes

    for node in tree.find_all((jinja2.nodes.Filter, jinja2.nodes.Name)):
        if isinstance(node, jinja2.nodes.Filter) and node.name in RANDOM_FILTERS:
            return node.lineno, f"the {node.name!r} filter"
        if isinstance(node, jinja2.nodes.Name) and node.name in RANDOM_GLOBALS and node.ctx == "load":
            return node.lineno, f"{node.name}()"
    return None


# -- limits ----------------------------------------------------------------------------------------
_state = threading.local()  # .deadline (monotonic seconds) and .source while a conversation renders


class _Timeout(BaseException):
    """Raised by SIGALRM inside a rendering; a BaseException so that no template code catches it."""


@contextlib.contextmanager
def render_limits(source: str, seconds: float):
    """The time budget of one conversation (nested calls share the outermost one's)."""
    if getattr(_state, "deadline", None) is not None:
        yield
        return
    _state.deadline, _state.source, _state.seconds = time.monotonic() + seconds, source, seconds
    alarm = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
    if alarm:
        previous = signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _Timeout:
        raise _too_slow() from None
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        _state.deadline = None


def _on_alarm(signum, frame) -> None:
    if getattr(_state, "deadline", None) is not None:
        raise _Timeout


def _too_slow() -> TemplateLimitError:
    return TemplateLimitError(
        f"chat template {getattr(_state, 'source', '?')}: rendering took more than {_state.seconds:g} s"
    )


def _tick() -> None:
    deadline = getattr(_state, "deadline", None)
    if deadline is not None and time.monotonic() > deadline:
        raise _too_slow()


def _limit(what: str, size) -> None:
    if size > MAX_RENDER_CHARS:
        raise TemplateLimitError(
            f"chat template {getattr(_state, 'source', '?')}: {what} would be {size:,} long "
            f"(limit {MAX_RENDER_CHARS:,})"
        )


def _sized(value):
    """A value a template built: strings, lists, tuples and mappings stay under the limit."""
    if isinstance(value, (str, bytes, list, tuple, dict)):
        _limit("a value", len(value))
    return value


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-+ #0]*(\d+|\*)?(?:\.(\d+|\*))?")
_BRACE_SPEC = re.compile(r"\{[^{}]*?:([^{}]*)\}")


def _check_format(text: str, args=()) -> None:
    """Widths and precisions in a %- or {}-format string (what makes a short format produce a huge text)."""
    if not isinstance(text, str):
        return
    widths = [int(n) for m in _PERCENT_SPEC.finditer(text) for n in m.groups() if n and n != "*"]
    widths += [int(n) for m in _BRACE_SPEC.finditer(text) for n in re.findall(r"\d+", m.group(1))]
    if "*" in text:
        widths += [a for a in (args if isinstance(args, tuple) else (args,)) if isinstance(a, int)]
    for width in widths:
        _limit("a formatted field", width)


def _check_binop(operator: str, left, right) -> None:
    if operator == "*":
        for seq, count in ((left, right), (right, left)):
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(count, int):
                _limit("a repeated sequence", len(seq) * max(count, 0))
    elif operator == "**":
        if isinstance(left, (int, float)) and isinstance(right, (int, float)) and abs(left) > 1 and right > 0:
            import math

            digits = right * math.log10(abs(left))
            if digits > MAX_NUMBER_DIGITS:  # slow to compute, and Python will not even print it
                raise TemplateLimitError(
                    f"chat template {getattr(_state, 'source', '?')}: a power with ~{min(digits, 1e18):,.0f} "
                    f"digits (limit {MAX_NUMBER_DIGITS:,})"
                )
    elif operator == "%":
        _check_format(left, right)
    elif operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
        _limit("a concatenation", len(left) + len(right))


def _estimate_replace(text, old, new, count=-1) -> int:
    if not (isinstance(text, str) and isinstance(old, str) and isinstance(new, str)):
        return 0
    hits = len(text) + 1 if old == "" else text.count(old)
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(text) + hits * (len(new) - len(old))


def _estimate_join(sep, items) -> int:
    if not isinstance(sep, str) or not isinstance(items, (list, tuple)):
        return 0
    return len(sep) * max(len(items) - 1, 0) + sum(len(i) for i in items if isinstance(i, str))


def _check_str_method(method, args, kwargs) -> None:
    """Methods of str whose arguments set the size of the result."""
    owner, name = getattr(method, "__self__", None), getattr(method, "__name__", "")
    if not isinstance(owner, str):
        return
    if name in ("ljust", "rjust", "center", "zfill") and args and isinstance(args[0], int):
        _limit(f"str.{name}'s result", args[0])
    elif name == "expandtabs":
        tab = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(tab, int):
            _limit("str.expandtabs's result", len(owner) + owner.count("\t") * max(tab, 0))
    elif name == "replace":
        _limit("str.replace's result", _estimate_replace(owner, *args[:3]))
    elif name == "join" and args:
        _limit(
            "str.join's result",
            _estimate_join(owner, list(args[0]) if isinstance(args[0], (list, tuple)) else []),
        )


# Filters whose arguments set the size of their result: a check run before the filter.
def _filter_checks() -> dict:
    def center(value, width=80, *_, **__):
        if isinstance(width, int):
            _limit("the centered text", width)

    def indent(value, width=4, *_, **__):
        if isinstance(value, str) and isinstance(width, int):
            _limit("the indented text", len(value) + (value.count("\n") + 1) * max(width, 0))
        elif isinstance(value, str) and isinstance(width, str):
            _limit("the indented text", len(value) + (value.count("\n") + 1) * len(width))

    def replace(value, old, new, count=None, *_, **__):
        _limit("the replaced text", _estimate_replace(str(value), old, new, -1 if count is None else count))

    def join(value, d="", attribute=None, *_, **__):
        if attribute is None and isinstance(value, (list, tuple)):
            _limit("the joined text", _estimate_join(d, [str(v) for v in value]))

    def format(value, *args, **kwargs):
        _check_format(value, args)

    def tojson(value, ensure_ascii=False, indent=None, *_, **__):
        if isinstance(indent, int):
            _limit("the JSON indentation", indent)

    def wordwrap(value, width=79, *_, **__):
        if isinstance(width, int):
            _limit("the wrap width", width)

    return {
        "center": center,
        "indent": indent,
        "replace": replace,
        "join": join,
        "format": format,
        "tojson": tojson,
        "wordwrap": wordwrap,
    }


def _guarded_filter(name: str, function, check):
    """A filter that checks the clock and its arguments first, and the size of what it made after."""
    from jinja2.utils import _PassArg

    passes = _PassArg.from_obj(function)

    @wraps(function)
    def guarded(*args, **kwargs):
        _tick()
        if check is not None:
            value_args = args[1:] if passes is not None else args  # the context comes first
            check(*value_args, **kwargs)
        return _sized(function(*args, **kwargs))

    return guarded


@lru_cache(maxsize=16)
def compile_template(text: str):
    """Compile as transformers' ``_compile_jinja_template`` does (same environment, filters, globals),
    in an environment that enforces the limits above (see the module docstring)."""
    import jinja2
    import jinja2.ext
    from jinja2.compiler import CodeGenerator
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        # transformers' {% generation %} marks assistant text: rendered through, and recorded where asked.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_recorded"), [], [], body).set_lineno(lineno)

        def _recorded(self, caller):
            text = caller()
            blocks = _recording.get()
            if blocks is not None:
                blocks.blocks.append((blocks.yielded, text))
            return text

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # Jinja's own tojson HTML-escapes; transformers replaces it with plain json.dumps.
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    class BoundedCodeGenerator(CodeGenerator):
        # `a ~ b` compiles to a plain str_join call the environment never sees: route its result
        # through the size check (its inputs are bounded already, so it grows at most 2x per step).
        def visit_Concat(self, node, frame):
            self.write("environment.bounded(")
            super().visit_Concat(node, frame)
            self.write(")")

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        # Intercepted operators are not folded at compile time either: `{{ 'A' * 10**10 }}` used to
        # allocate its 10 GB while the template compiled.
        intercepted_binops = frozenset({"*", "**", "%", "+"})
        code_generator_class = BoundedCodeGenerator

        def call_binop(self, context, operator, left, right):
            _tick()
            _check_binop(operator, left, right)
            return _sized(super().call_binop(context, operator, left, right))

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja's own signature
            _tick()
            _check_str_method(__obj, args, kwargs)
            return _sized(super().call(__context, __obj, *args, **kwargs))

        def getattr(self, obj, attribute):
            _tick()
            return super().getattr(obj, attribute)

        def getitem(self, obj, argument):
            _tick()
            return super().getitem(obj, argument)

        def wrap_str_format(self, value):
            wrapped = super().wrap_str_format(value)
            if wrapped is None:
                return None
            template = getattr(value, "__self__", None)

            def checked(*args, **kwargs):
                _check_format(template)
                return _sized(wrapped(*args, **kwargs))

            return checked

        @staticmethod
        def bounded(value):
            return _sized(value)

    env = BoundedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols],
        finalize=_finalize,
    )  # fmt: skip
    for name in RANDOM_FILTERS:
        env.filters.pop(name, None)
    for name in RANDOM_GLOBALS:
        env.globals.pop(name, None)
    env.filters["tojson"] = tojson
    checks = _filter_checks()
    for name, function in list(env.filters.items()):
        env.filters[name] = _guarded_filter(name, function, checks.get(name))
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        found = _randomness(env.parse(text))
        if found is not None:
            raise CompileError(
                found[0], f"uses {found[1]}, a source of randomness: the same conversation would render "
                "differently run to run", "refused",
            )  # fmt: skip
        return env.from_string(text)
    except jinja2.TemplateSyntaxError as error:
        raise CompileError(error.lineno, error.message or str(error)) from None
    except RecursionError:
        raise CompileError(None, "nested too deeply to compile") from None
