"""Chat templates: render a conversation exactly as ``transformers``' ``apply_chat_template`` does.

A template is Jinja2 source, taken from one of

* a tokenizer's own ``chat_template`` (``tokenizer_config.json`` in its folder, or a standalone
  ``chat_template.jinja`` there, as transformers >= 4.43 saves it),
* a named built-in (:data:`BUILTIN_TEMPLATES`: ``chatml``, ``llama3``),
* a file: Jinja source (``.jinja``/``.j2``/anything) or a ``tokenizer_config.json``.

It is compiled the way transformers compiles it: an ``ImmutableSandboxedEnvironment`` with
``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, a ``{% generation %}`` block, the
``tojson`` filter that does not HTML-escape, and the globals ``raise_exception`` and ``strftime_now``. The
template sees ``messages``, ``add_generation_prompt`` and the tokenizer's special-token strings
(``bos_token``, ``eos_token``, ...), as in transformers.

Where the assistant turns are (:meth:`ChatTemplate.assistant_spans`), one of five ways:

* **Generation blocks.** A template with ``{% generation %}...{% endgeneration %}`` says itself what is
  trained: the spans are its blocks' output, recorded during one streaming rendering exactly as
  transformers' ``apply_chat_template(..., return_assistant_tokens_mask=True)`` records them
  (:meth:`ChatTemplate._generation_spans`). One rendering; an assistant message with no block trains nothing.
* **Prefix by prefix**, the reference for every other template (:meth:`ChatTemplate._incremental_spans`). For
  assistant message ``i``, its span starts at the end of ``render(messages[:i], add_generation_prompt=True)``
  (the assistant header is then already written), or later where its content begins (found by rendering a
  sentinel in its place, for templates without a generation prompt), and ends at the end of
  ``render(messages[:i+1])``, so it holds the content *and* the template's end-of-turn marker
  (``<|im_end|>``, ``<|eot_id|>``): the model learns to stop. Templates that are not prefix-stable (that
  rewrite earlier turns once later ones exist) fall back to finding the assistant content itself in the
  full rendering. Three renderings per assistant turn, each as long as the conversation so far: quadratic.
* **Bounded, contents replaced** (:func:`llmtools.prep.chat_spans.replaced_contents`): the same spans from the
  assistant contents replaced by numbered sentinels, rendered once; for templates that write a content
  verbatim or trimmed.
* **Bounded, contents wrapped** (:func:`llmtools.prep.chat_spans.wrapped_contents`): each content between a numbered
  pair of sentinel characters, rendered once; deleting the sentinels must give the real rendering, so it
  serves templates that escape or transform a content (``| e``, ``| replace``, ``| tojson``, ``| upper``)
  without inspecting it.
* **Bounded, contents isolated** (:func:`llmtools.prep.chat_spans.isolated_contents`): half the contents real and
  their neighbours marks, twice; what the template wrote for each content is cut out between the marks,
  and with the template's own text must give the real rendering. It serves templates that rewrite a
  content however they like (reasoning models' ``split('</think>')``), as long as their own text does not
  depend on it.

The bounded ways then measure the header and end-of-turn text by the prefix-by-prefix method at three
sample turns (:func:`llmtools.prep.chat_spans.checked_spans`): at most 15 renderings, whatever the number of turns.
The prefix-by-prefix way runs only where that cannot be verified, and stays quadratic there: templates
whose own text depends on a content (a header that prints its length), that trim *and* escape it, end
turns differently, count turns in a header, or contents holding a private-use sentinel character. The
check is sampled: a template that treats an unsampled turn differently by its index alone is not noticed.

Templates are untrusted code: besides the sandbox (:mod:`llmtools.prep.template_sandbox`), every conversation is rendered under limits
(:data:`MAX_RENDER_CHARS`, :data:`MAX_RENDER_SECONDS`). Operations that multiply sizes (``*``, ``**``,
``%`` and ``format`` widths, ``ljust``/``center``/``indent``/``join``/``replace`` ...) are checked before
they run; every string or list a template builds, and the rendering itself, are checked after; a
template loop that runs too long is stopped (SIGALRM in the main thread, checks at each call and
attribute access elsewhere); recursion and memory errors are caught. Exceeding a limit is a
:class:`TemplateLimitError`: a bad record like any other, named by file and line by the caller.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from llmtools.errors import InputError, UsageError
from llmtools.formats.jsonfile import read_json_object
from llmtools.prep.chat_spans import bounded_spans
from llmtools.prep.template_sandbox import (
    DEFAULT_TEMPLATE_DATE,
    MAX_RENDER_CHARS,
    MAX_RENDER_SECONDS,
    CompileError,
    GenerationBlocks,
    TemplateLimitError,
    TemplateRenderError,
    check_date,
    compile_template,
    has_generation_blocks,
    pinned_date,
    recording_generation_blocks,
    render_limits,
)
from llmtools.resources import announce_shadow

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
    date: str = DEFAULT_TEMPLATE_DATE
    """The day ``strftime_now`` gives the template (YYYY-MM-DD): renderings never read the clock."""
    linear: bool = True
    """Find assistant spans from a bounded number of renderings where that is verified to give the
    prefix-by-prefix result (False: always prefix by prefix). Templates with ``{% generation %}`` blocks
    give theirs from one rendering either way."""

    @property
    def hash(self) -> str:
        return "sha256:" + hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    def identity(self) -> dict:
        return {"source": self.source, "hash": self.hash, "date": self.date}

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        """The conversation as text, exactly as ``apply_chat_template(..., tokenize=False)`` gives it."""
        return self._stream(messages, add_generation_prompt)

    def _stream(
        self,
        messages: list[dict],
        add_generation_prompt: bool = False,
        blocks: GenerationBlocks | None = None,
    ) -> str:
        """:meth:`render`, piece by piece as Jinja yields them; ``blocks`` (recording) is kept told how many
        characters have been yielded, which is where a ``{% generation %}`` block rendered next starts."""
        import jinja2

        template = self._compiled()
        with render_limits(self.source, self.time_limit), pinned_date(self.date):
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
                    if blocks is not None:
                        blocks.yielded = size
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
            return compile_template(self.text)
        except CompileError as error:
            # A template file: FILE:LINE. A template inside a JSON file (tokenizer_config.json): its own line.
            if self.source.endswith(".json"):
                place = f"{self.source}[chat_template]{f' line {error.lineno}' if error.lineno else ''}"
            else:
                place = f"{self.source}{f':{error.lineno}' if error.lineno else ''}"
            raise TemplateSyntaxError(f"{place}: chat template {error.what}: {error.message}") from None

    def assistant_spans(self, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
        """The rendering and the ``[start, end)`` character span of every assistant turn in it (of every
        ``{% generation %}`` block, for a template that has them).

        All the renderings this takes share one time budget."""
        with render_limits(self.source, self.time_limit):
            return self._assistant_spans(messages)

    def _assistant_spans(self, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
        self._compiled()  # a syntax error names the template before anything else is looked at
        if has_generation_blocks(self.text):
            return self._generation_spans(messages)
        full = self.render(messages)
        if self.linear:
            spans = self._linear_spans(messages, full)
            if spans is not None:
                return full, spans
        return self._incremental_spans(messages, full)

    def _generation_spans(self, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
        """One streaming rendering, the spans of its ``{% generation %}`` blocks as transformers'
        ``return_assistant_tokens_mask`` records them (:class:`GenerationBlocks`).

        The template alone says what is trained: an assistant message whose rendering holds no block trains
        nothing, as in transformers' mask. Empty blocks are left out and overlapping ones merged (the mask is
        the same). A block rendered inside a macro or a ``{% set %}`` block is recorded at an offset where its
        text is not (transformers' offsets are then wrong too): a :class:`TemplateRenderError`."""
        with recording_generation_blocks() as blocks:
            full = self._stream(messages, blocks=blocks)
        spans = blocks.spans(full)
        if spans is None:
            raise TemplateRenderError(
                f"chat template {self.source}: a {{% generation %}} block's text is not where the rendering "
                "had got to when it was written (inside a macro, a call or a {% set %} block?): "
                "cannot tell which text is the assistant's"
            )
        return full, spans

    def _linear_spans(self, messages: list[dict], full: str) -> list[tuple[int, int]] | None:
        """The spans :meth:`_incremental_spans` finds, from a bounded number of renderings
        (:func:`llmtools.prep.chat_spans.bounded_spans`); ``None`` where that cannot be verified."""
        return bounded_spans(self, messages, full)

    def _turn_span(self, messages: list[dict], i: int, full: str) -> tuple[int, int] | None:
        """Assistant message ``i``'s span by the prefix-by-prefix method; ``None`` where the template is
        not prefix-stable there."""
        head = self.render(messages[:i], add_generation_prompt=True)
        upto = self.render(messages[: i + 1])
        if not (full.startswith(head) and full.startswith(upto) and len(head) <= len(upto)):
            return None
        return max(len(head), self._content_start(messages, i, full)), len(upto)

    def _incremental_spans(self, messages: list[dict], full: str) -> tuple[str, list[tuple[int, int]]]:
        """Three renderings per assistant turn, each as long as the conversation so far: quadratic."""
        spans: list[tuple[int, int]] = []
        stable = True
        for i, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            span = self._turn_span(messages, i, full)
            if span is None:
                stable = False
                break
            spans.append(span)
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


# ---------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------
MARKER = re.compile(r"<\|[A-Za-z0-9_]+\|>")  # ChatML's <|im_start|>, Llama 3's <|eot_id|>, ...


def split_markers(template: ChatTemplate, tokenizer) -> list[str]:
    """The template's ``<|...|>`` markers that the tokenizer does not hold as one token: each is then
    tokenized as ordinary text, several BPE pieces a model cannot tell from the same characters in a
    message."""
    markers = sorted(set(MARKER.findall(template.text)))
    specials = getattr(tokenizer, "special_tokens", None) or {}
    return [m for m in markers if m not in specials and len(tokenizer.encode(m)) != 1]


def split_note(split: list[str]) -> str:
    """The summary's words for :func:`split_markers`' finding (empty when there is none)."""
    if not split:
        return ""
    return (
        f"; warning: {', '.join(split)} not special tokens of this tokenizer: each became several ordinary "
        f"tokens (add them to the tokenizer as special tokens, or use a template made for it)"
    )


def load_chat_template(
    spec: str | os.PathLike | None,
    tokenizer: str | os.PathLike | None = None,
    time_limit: float = MAX_RENDER_SECONDS,
    date: str = DEFAULT_TEMPLATE_DATE,
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
        if Path(name).exists():  # the name is the built-in one; a path to the file has a '/'
            announce_shadow("chat-template", name, Path(name).is_dir(), what="built-in chat template")
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
    template = ChatTemplate(
        source=source, text=text, special_tokens=specials, time_limit=time_limit, date=check_date(date)
    )
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
