"""Chat templates: render a conversation exactly as ``transformers``' ``apply_chat_template`` does.

A template is Jinja2 source, taken from one of

* a tokenizer's own ``chat_template`` (``tokenizer_config.json`` in its folder, or a standalone
  ``chat_template.jinja`` there, as transformers >= 4.43 saves it),
* a named built-in (:data:`BUILTIN_TEMPLATES`: ``chatml``, ``llama3``),
* a file: Jinja source (``.jinja``/``.j2``/anything) or a ``tokenizer_config.json``.

It is compiled the way transformers compiles it: an ``ImmutableSandboxedEnvironment`` with
``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, a ``{% generation %}`` block
(rendered through), the ``tojson`` filter that does not HTML-escape, and the globals
``raise_exception`` and ``strftime_now``. The template sees ``messages``, ``add_generation_prompt``
and the tokenizer's special-token strings (``bos_token``, ``eos_token``, ...), as in transformers.

Where the assistant turns are (:meth:`ChatTemplate.assistant_spans`): the conversation is rendered
prefix by prefix. For assistant message ``i``, its span starts at the end of
``render(messages[:i], add_generation_prompt=True)`` (the assistant header is then already written),
or later where its content begins (found by rendering a sentinel in its place, for templates without
a generation prompt), and ends at the end of ``render(messages[:i+1])``, so it holds the content *and* the template's
end-of-turn marker (``<|im_end|>``, ``<|eot_id|>``): the model learns to stop. Templates that are
not prefix-stable (that rewrite earlier turns once later ones exist) fall back to finding the
assistant content itself in the full rendering.

Templates are untrusted code: besides the sandbox, every conversation is rendered under limits
(:data:`MAX_RENDER_CHARS`, :data:`MAX_RENDER_SECONDS`). Operations that multiply sizes (``*``, ``**``,
``%`` and ``format`` widths, ``ljust``/``center``/``indent``/``join``/``replace`` ...) are checked before
they run; every string or list a template builds, and the rendering itself, are checked after; a
template loop that runs too long is stopped (SIGALRM in the main thread, checks at each call and
attribute access elsewhere); recursion and memory errors are caught. Exceeding a limit is a
:class:`TemplateLimitError`: a bad record like any other, named by file and line by the caller.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache, wraps
from pathlib import Path

from llmtools.errors import InputError, UsageError
from llmtools.formats.jsonfile import read_json_object

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Meta's Llama-3 instruct template (without the tool-calling and date preamble of 3.1+).
LLAMA3 = (
    "{% set loop_messages = messages %}"
    "{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

BUILTIN_TEMPLATES: dict[str, str] = {"chatml": CHATML, "llama3": LLAMA3}
# Special-token strings a built-in needs when the tokenizer does not name its own.
BUILTIN_DEFAULTS: dict[str, dict[str, str]] = {
    "chatml": {"eos_token": "<|im_end|>"},
    "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
}
SENTINEL = "\ue000llmtools-content\ue001"  # private-use characters: no template writes them
SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


MAX_RENDER_CHARS = 16 << 20
"""Longest rendering of one conversation, and largest string or list a template may build."""
MAX_RENDER_SECONDS = 10.0
"""Longest time rendering one conversation may take (all its prefixes together), by default."""
MAX_NUMBER_DIGITS = 4300
"""Largest power a template may compute, in decimal digits (Python's own limit for printing an int)."""


class TemplateRenderError(InputError):
    """The template failed on this conversation (raise_exception, an undefined variable, a type error)."""


class TemplateLimitError(TemplateRenderError):
    """The template exceeded a size, time or recursion limit on this conversation."""


class TemplateSyntaxError(InputError):
    """The template does not compile; the message names the template and the line."""


@dataclass
class ChatTemplate:
    """A compiled chat template plus the special-token strings it is rendered with."""

    source: str
    text: str
    special_tokens: dict[str, object] = field(default_factory=dict)
    time_limit: float = MAX_RENDER_SECONDS
    """Seconds one conversation may take to render (all its prefixes together)."""

    @property
    def hash(self) -> str:
        return "sha256:" + hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    def identity(self) -> dict:
        return {"source": self.source, "hash": self.hash}

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        """The conversation as text, exactly as ``apply_chat_template(..., tokenize=False)`` gives it."""
        import jinja2

        template = self._compiled()
        with _limits(self.source, self.time_limit):
            try:
                pieces, size = [], 0
                for piece in template.generate(
                    messages=messages, add_generation_prompt=add_generation_prompt, **self.special_tokens
                ):
                    size += len(piece)
                    if size > MAX_RENDER_CHARS:
                        raise TemplateLimitError(
                            f"chat template {self.source}: rendering exceeds {MAX_RENDER_CHARS:,} characters"
                        )
                    pieces.append(piece)
                return "".join(pieces)
            except TemplateRenderError:
                raise
            except jinja2.TemplateError as error:
                raise TemplateRenderError(f"chat template {self.source}: {error}") from None
            except RecursionError:
                raise TemplateLimitError(
                    f"chat template {self.source}: recursion too deep (a macro or loop calling itself without end?)"
                ) from None
            except MemoryError:
                raise TemplateLimitError(
                    f"chat template {self.source}: out of memory while rendering"
                ) from None
            except (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError) as error:
                raise TemplateRenderError(
                    f"chat template {self.source}: {type(error).__name__}: {error}"
                ) from None

    def _compiled(self):
        try:
            return _compile(self.text)
        except _SyntaxError as error:
            # A template file: FILE:LINE. A template inside a JSON file (tokenizer_config.json): its own line.
            if self.source.endswith(".json"):
                place = f"{self.source}[chat_template]{f' line {error.lineno}' if error.lineno else ''}"
            else:
                place = f"{self.source}{f':{error.lineno}' if error.lineno else ''}"
            raise TemplateSyntaxError(f"{place}: chat template syntax error: {error.message}") from None

    def assistant_spans(self, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
        """The rendering and the ``[start, end)`` character span of every assistant turn in it.

        All the renderings this takes (one per prefix) share one time budget."""
        with _limits(self.source, self.time_limit):
            return self._assistant_spans(messages)

    def _assistant_spans(self, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
        full = self.render(messages)
        spans: list[tuple[int, int]] = []
        stable = True
        for i, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            head = self.render(messages[:i], add_generation_prompt=True)
            upto = self.render(messages[: i + 1])
            if not (full.startswith(head) and full.startswith(upto) and len(head) <= len(upto)):
                stable = False
                break
            spans.append((max(len(head), self._content_start(messages, i, full)), len(upto)))
        if stable:
            return full, spans
        eos = self.special_tokens.get("eos_token")
        return full, _find_contents(full, messages, self.source, eos if isinstance(eos, str) else None)

    def _content_start(self, messages: list[dict], i: int, full: str) -> int:
        """Where assistant message ``i``'s content begins: rendered with a sentinel in its place.

        Covers templates without an ``add_generation_prompt`` branch, whose header would otherwise
        count as assistant text. -1 when the sentinel cannot be placed (the template rewrites it).
        """
        probe = [*messages[:i], {**messages[i], "content": SENTINEL}]
        try:
            text = self.render(probe)
        except TemplateRenderError:
            return -1
        at = text.find(SENTINEL)
        return at if at >= 0 and full.startswith(text[:at]) else -1


def _find_contents(
    full: str, messages: list[dict], source: str, eos: str | None = None
) -> list[tuple[int, int]]:
    """Fallback for templates that are not prefix-stable: each assistant content, searched in order
    (plus the EOS string when the template writes it right after the content, so stopping is learnt)."""
    spans, pos = [], 0
    for message in messages:
        content = message.get("content")
        if not isinstance(content, str):
            continue
        for candidate in (content, content.strip()):
            at = full.find(candidate, pos) if candidate else -1
            if at >= 0:
                break
        if at < 0:
            if message.get("role") == "assistant":
                raise TemplateRenderError(
                    f"chat template {source}: cannot locate an assistant turn in the rendering "
                    "(the template rewrites turns and is not prefix-stable)"
                )
            continue
        end = at + len(candidate)
        if message.get("role") == "assistant":
            if eos and full.startswith(eos, end):
                end += len(eos)
            spans.append((at, end))
        pos = end
    return spans


class _SyntaxError(Exception):
    def __init__(self, lineno: int | None, message: str) -> None:
        super().__init__(message)
        self.lineno, self.message = lineno, message


# -- limits ----------------------------------------------------------------------------------------
_state = threading.local()  # .deadline (monotonic seconds) and .source while a conversation renders


class _Timeout(BaseException):
    """Raised by SIGALRM inside a rendering; a BaseException so that no template code catches it."""


@contextlib.contextmanager
def _limits(source: str, seconds: float):
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
def _compile(text: str):
    """Compile as transformers' ``_compile_jinja_template`` does (same environment, filters, globals),
    in an environment that enforces the limits above (see the module docstring)."""
    from datetime import datetime

    import jinja2
    import jinja2.ext
    from jinja2.compiler import CodeGenerator
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        # transformers' {% generation %} marks assistant text; here it only has to render its body.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # Jinja's own tojson HTML-escapes; transformers replaces it with plain json.dumps.
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format):
        return datetime.now().strftime(format)

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
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    checks = _filter_checks()
    for name, function in list(env.filters.items()):
        env.filters[name] = _guarded_filter(name, function, checks.get(name))
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(text)
    except jinja2.TemplateSyntaxError as error:
        raise _SyntaxError(error.lineno, error.message or str(error)) from None
    except RecursionError:
        raise _SyntaxError(None, "nested too deeply to compile") from None


# ---------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------
def load_chat_template(
    spec: str | os.PathLike | None,
    tokenizer: str | os.PathLike | None = None,
    time_limit: float = MAX_RENDER_SECONDS,
) -> ChatTemplate:
    """The template named by ``spec`` (built-in name or file), else the tokenizer's own.

    Special-token strings (``bos_token`` ...) come from the tokenizer's folder when it has a
    ``tokenizer_config.json`` / ``special_tokens_map.json``, else from the built-in's defaults.
    """
    folder = _tokenizer_folder(tokenizer)
    specials = _special_tokens(folder) if folder else {}
    if spec is None or str(spec) == "":
        if folder is None:
            raise UsageError(
                f"--chat-template: tokenizer {tokenizer} has no folder with a tokenizer_config.json; "
                f"name a template ({', '.join(BUILTIN_TEMPLATES)}) or give a template file"
            )
        text = _template_in_folder(folder)
        if text is None:
            raise UsageError(
                f"--chat-template: {folder} has no chat_template (tokenizer_config.json or chat_template.jinja); "
                f"name one ({', '.join(BUILTIN_TEMPLATES)}) or give a template file"
            )
        source = f"{folder}/tokenizer_config.json"
    elif str(spec) in BUILTIN_TEMPLATES:
        name = str(spec)
        text = BUILTIN_TEMPLATES[name]
        specials = {**BUILTIN_DEFAULTS.get(name, {}), **specials}
        source = name
    else:
        path = Path(spec)
        if not path.is_file():
            raise UsageError(
                f"--chat-template: {path}: no such file and not a built-in name ({', '.join(BUILTIN_TEMPLATES)})"
            )
        text = _template_from_file(path)
        source = str(path)
    template = ChatTemplate(source=source, text=text, special_tokens=specials, time_limit=time_limit)
    template._compiled()  # syntax errors surface now, naming the template file and line
    return template


def _tokenizer_folder(tokenizer: str | os.PathLike | None) -> Path | None:
    if tokenizer is None or str(tokenizer) == "byte":
        return None
    path = Path(tokenizer)
    folder = path if path.is_dir() else path.parent
    return folder if folder.is_dir() else None


def _read_json(path: Path) -> dict:
    return read_json_object(path, "JSON file")


def _pick_template(value, where: str) -> str:
    """``chat_template`` is a string, or a list of ``{name, template}`` (the ``default`` one is used)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {item.get("name"): item.get("template") for item in value if isinstance(item, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
    raise InputError(f"{where}[chat_template]: expected a string or a list with a 'default' template")


def _template_in_folder(folder: Path) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text(encoding="utf-8")
    config = folder / "tokenizer_config.json"
    if config.exists():
        data = _read_json(config)
        if data.get("chat_template") is not None:
            return _pick_template(data["chat_template"], str(config))
    return None


def _template_from_file(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not UTF-8 text ({error})") from None
    if path.suffix == ".json":
        data = _read_json(path)
        if "chat_template" not in data:
            raise InputError(f"{path}: no chat_template key")
        return _pick_template(data["chat_template"], str(path))
    return text


def _token_string(value) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _special_tokens(folder: Path) -> dict[str, object]:
    """``bos_token`` etc. as transformers passes them to the template (strings)."""
    out: dict[str, object] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the config wins, as in transformers
        path = folder / name
        if not path.exists():
            continue
        data = _read_json(path)
        for key in SPECIAL_TOKEN_KEYS:
            token = _token_string(data.get(key))
            if token is not None:
                out[key] = token
        extra = data.get("additional_special_tokens") or data.get("extra_special_tokens")
        if isinstance(extra, list):
            out["additional_special_tokens"] = [t for t in map(_token_string, extra) if t is not None]
    return out
