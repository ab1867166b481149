"""Chat templates render exactly as transformers' apply_chat_template, token for token."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmtools.errors import InputError, UsageError
from llmtools.prep.chat_spans import isolated_contents, wrapped_contents
from llmtools.prep.chat_template import (
    BUILTIN_TEMPLATES,
    ChatTemplate,
    TemplateRenderError,
    load_chat_template,
)
from llmtools.prep.sft import SampleEncoder
from tests.conftest import shared

# A template with a default system turn, trim, raise_exception, bos_token, multi-line blocks (so
# trim_blocks / lstrip_blocks matter) and a generation prompt.
TEMPLATE = """{{ bos_token }}
{% if messages[0]['role'] == 'system' %}
    {% set system = messages[0]['content'] %}
    {% set loop_messages = messages[1:] %}
{% else %}
    {% set system = 'You are a helpful assistant.' %}
    {% set loop_messages = messages %}
{% endif %}
<|im_start|>system
{{ system | trim }}<|im_end|>
{% for message in loop_messages %}
    {% if message['role'] not in ['user', 'assistant'] %}
        {{ raise_exception('Unknown role: ' + message['role']) }}
    {% endif %}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"""

CONVERSATIONS = [
    [
        {"role": "system", "content": "  You are terse. Answer in one line.  "},
        {"role": "user", "content": "Hi there, what's 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And times 3?\nShow the work."},
        {"role": "assistant", "content": "4 * 3 = 12 — café ☕"},
        {"role": "user", "content": "Thanks"},
        {"role": "assistant", "content": " You're welcome! "},
    ],
    [{"role": "user", "content": "No system turn here"}, {"role": "assistant", "content": "Fine by me."}],
]


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A GPT-2 tokenizer with ChatML special tokens and TEMPLATE, saved by transformers itself."""
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("tok")
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(shared("tokenizers/gpt2/tokenizer.json")),
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
    )
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = TEMPLATE
    tok.save_pretrained(folder)
    return folder, transformers.AutoTokenizer.from_pretrained(folder)


def _hf_ids(tok, messages, **kw) -> list[int]:
    out = tok.apply_chat_template(messages, tokenize=True, **kw)
    if hasattr(out, "keys"):  # transformers 5 returns a BatchEncoding
        out = out["input_ids"]
    return list(out)


@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
def test_tokenizer_template_matches_transformers_token_for_token(hf_folder, conversation):
    from llmtools.tokenize import load_tokenizer

    folder, hf_tok = hf_folder
    messages = CONVERSATIONS[conversation]
    template = load_chat_template(None, folder)
    assert template.render(messages) == hf_tok.apply_chat_template(messages, tokenize=False)
    assert template.render(messages, add_generation_prompt=True) == hf_tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    encoder = SampleEncoder(
        load_tokenizer(str(folder), backend="tokenizers", special_tokens="split"), template
    )
    ids, mask = encoder.encode(messages)
    assert ids.tolist() == _hf_ids(hf_tok, messages)
    # The mask covers exactly the assistant contents and their end-of-turn markers.
    assistant = [m["content"] + "<|im_end|>\n" for m in messages if m["role"] == "assistant"]
    assert hf_tok.decode(ids[mask == 1].tolist()) == "".join(assistant)


@pytest.mark.parametrize("name", sorted(BUILTIN_TEMPLATES))
def test_builtins_match_transformers(hf_folder, name):
    folder, hf_tok = hf_folder
    template = load_chat_template(name, folder)
    messages = CONVERSATIONS[0]
    for prompt in (False, True):
        want = hf_tok.apply_chat_template(
            messages, chat_template=BUILTIN_TEMPLATES[name], tokenize=False, add_generation_prompt=prompt
        )
        assert template.render(messages, add_generation_prompt=prompt) == want


def test_llama3_builtin_shape():
    template = load_chat_template("llama3", None)
    text = template.render([{"role": "user", "content": " hi "}, {"role": "assistant", "content": "yo"}])
    assert text == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nyo<|eot_id|>"
    )


def test_template_file_and_tokenizer_config_file(tmp_path, hf_folder):
    folder, _ = hf_folder
    jinja = tmp_path / "t.jinja"
    jinja.write_text(TEMPLATE)
    messages = CONVERSATIONS[1]
    from_file = load_chat_template(str(jinja), folder)
    config = tmp_path / "tokenizer_config.json"  # the older layout: the template inside the config
    config.write_text(json.dumps({"chat_template": [{"name": "default", "template": TEMPLATE}]}))
    from_config = load_chat_template(str(config), folder)
    from_folder = load_chat_template(None, folder)
    assert from_file.render(messages) == from_folder.render(messages)
    assert from_config.text == from_folder.text


def test_assistant_spans_cover_content_and_end_of_turn():
    template = load_chat_template("chatml", None)
    text, spans = template.assistant_spans(CONVERSATIONS[0])
    got = [text[a:b] for a, b in spans]
    assert got == [m["content"] + "<|im_end|>\n" for m in CONVERSATIONS[0] if m["role"] == "assistant"]


def test_not_prefix_stable_template_falls_back_to_content_search():
    # Renders the assistant turns only when the conversation is complete: prefixes do not match.
    text = "{% for m in messages %}[{{ m['role'] }}:{{ m['content'] }}]{% endfor %}{{ messages | length }}"
    template = ChatTemplate("odd", text)
    full, spans = template.assistant_spans(CONVERSATIONS[1])
    assert [full[a:b] for a, b in spans] == ["Fine by me."]


def test_tojson_does_not_html_escape_and_strftime_exists():
    template = ChatTemplate("t", "{{ messages | tojson }}|{{ strftime_now('%Y') | length }}")
    assert template.render([{"role": "user", "content": "<b>&"}]) == '[{"role": "user", "content": "<b>&"}]|4'


def test_raise_exception_is_a_render_error():
    template = ChatTemplate("t", "{{ raise_exception('no tools allowed') }}")
    with pytest.raises(TemplateRenderError, match="no tools allowed"):
        template.render([])


def test_sandbox_blocks_attribute_escape():
    template = ChatTemplate("t", "{{ messages.__class__.__mro__ }}")
    with pytest.raises(TemplateRenderError):
        template.render([])


def test_errors_name_the_template(tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}")
    with pytest.raises(InputError, match="syntax error"):
        load_chat_template(str(bad), None)
    with pytest.raises(UsageError, match="no such file and not a built-in"):
        load_chat_template(str(tmp_path / "missing.jinja"), None)
    with pytest.raises(UsageError, match="has no chat_template"):
        (tmp_path / "tok").mkdir()
        (tmp_path / "tok" / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
        load_chat_template(None, tmp_path / "tok")


def test_byte_tokenizer_pieces_equal_whole_text():
    from llmtools.tokenize import load_tokenizer

    tok = load_tokenizer("byte")
    template = load_chat_template("chatml", None)
    ids, mask = SampleEncoder(tok, template).encode(CONVERSATIONS[0])
    text, _ = template.assistant_spans(CONVERSATIONS[0])
    assert ids.tolist() == tok.encode(text)
    assert bytes(np.asarray(ids[mask == 1], dtype=np.uint8)).decode() == "".join(
        m["content"] + "<|im_end|>\n" for m in CONVERSATIONS[0] if m["role"] == "assistant"
    )


# Whitespace control, namespace, loop.last, loopcontrols, tojson with options, slicing, filters: the
# constructs real templates (Llama-3.1, Qwen2.5, Mistral) lean on.
RICH_TEMPLATE = """{%- set ns = namespace(system='', turns=0) -%}
{%- for m in messages -%}
    {%- if m.role == 'system' -%}{%- set ns.system = m.content | trim -%}{%- continue -%}{%- endif -%}
    {%- set ns.turns = ns.turns + 1 -%}
{%- endfor -%}
{{- bos_token -}}
{%- if ns.system %}[SYS {{ ns.system | tojson(indent=None, separators=(',', ':')) }} turns={{ ns.turns }}]
{% endif -%}
{%- for m in messages if m.role != 'system' -%}
    {%- if loop.index0 > 8 -%}{%- break -%}{%- endif -%}
    {%- if m.role == 'user' -%}
[INST] {{ m.content | replace('\\n', ' ') | upper }} [/INST]
    {%- elif m.role == 'assistant' -%}
 {{ m.content }}{{ eos_token }}{% if not loop.last %}{{ '\\n' }}{% endif %}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt %} {% endif -%}"""


def test_rich_template_matches_transformers(hf_folder):
    _, hf_tok = hf_folder
    template = ChatTemplate("rich", RICH_TEMPLATE, {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"})
    for messages in CONVERSATIONS:
        for prompt in (False, True):
            want = hf_tok.apply_chat_template(
                messages, chat_template=RICH_TEMPLATE, tokenize=False, add_generation_prompt=prompt
            )
            assert template.render(messages, add_generation_prompt=prompt) == want
    text, spans = template.assistant_spans(CONVERSATIONS[0])
    # the header counts turns, so prefixes differ: content search, with the EOS that follows it
    assert [text[a:b] for a, b in spans] == [
        "4.<|im_end|>",
        "4 * 3 = 12 — café ☕<|im_end|>",
        " You're welcome! <|im_end|>",
    ]


# Templates whose spans the bounded way must reproduce, or decline (and leave to prefix by prefix).
SPAN_TEMPLATES = {
    "chatml": BUILTIN_TEMPLATES["chatml"],
    "llama3": BUILTIN_TEMPLATES["llama3"],  # trims contents
    "system": TEMPLATE,
    "rich": RICH_TEMPLATE,  # counts turns in its header: not prefix-stable
    "tojson": "{% for m in messages %}{{ m.role }}={{ m.content | tojson }};{% endfor %}",
    "no-prompt": "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}",
    "last-differs": "{% for m in messages %}{{ m.role }}: {{ m.content }}{% if not loop.last %}\n{% endif %}{% endfor %}",
    "inspects": "{% for m in messages %}{{ m.role }}({{ m.content | length }}): {{ m.content }}|{% endfor %}",
    "gen-longer": "{% for m in messages %}{{ m.role }}>{{ m.content }}.{% endfor %}"
    "{% if add_generation_prompt %}assistant>It is{% endif %}",
}


def chatml_writing(content: str) -> str:
    """ChatML with each content written as ``content`` (a Jinja expression of ``message``)."""
    return (
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}{{ "
        + content
        + " }}{{ '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )


# Templates that transform a content without inspecting it: found from wrapped contents.
TRANSFORMING_TEMPLATES = {
    "escape": chatml_writing("message['content'] | e"),
    "replace": chatml_writing("message['content'] | replace('a', 'b')"),
    "tojson-chatml": chatml_writing("message['content'] | tojson"),
    "upper": chatml_writing("message['content'] | upper"),
    "escape-no-prompt": "{% for m in messages %}<{{ m.role }}>{{ m.content | e }}</{{ m.role }}>{% endfor %}",
}
SPAN_TEMPLATES.update(TRANSFORMING_TEMPLATES)
SPAN_TEMPLATES["splits"] = chatml_writing("message['content'].split('</think>')[-1]")


def _conversation(turns: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    pieces = ["It is", " 4.", "\n", "", "<|im_end|>", '"q"', "café", "x" * 5, "<b>&'a'", "A</think>a"]
    if seed % 4 == 3:  # what the sentinels look like, and a content the template trims
        pieces += ["\ue0000\ue001", " "]
    messages = [{"role": "system", "content": " be brief "}] if seed % 2 else []
    for i in range(turns):
        messages.append({"role": "user", "content": f"q{i}" + str(rng.choice(pieces))})
        messages.append({"role": "assistant", "content": "".join(rng.choice(pieces, size=3))})
    return messages


@pytest.mark.parametrize("name", SPAN_TEMPLATES)
def test_bounded_span_finding_equals_prefix_by_prefix(name):
    fast = ChatTemplate(name, SPAN_TEMPLATES[name], {"bos_token": "<s>", "eos_token": "<|im_end|>"})
    slow = ChatTemplate(name, fast.text, fast.special_tokens, linear=False)
    for seed in range(12):
        messages = _conversation(1 + seed % 5, seed) + (
            [{"role": "user", "content": "and?"}] if seed % 3 else []
        )
        assert _outcome(fast, messages) == _outcome(slow, messages), seed


def _outcome(template: ChatTemplate, messages: list[dict]):
    try:
        return template.assistant_spans(messages)
    except TemplateRenderError as error:  # the same error either way
        return str(error)


@pytest.fixture
def renderings(monkeypatch):
    """Every rendering of any template, counted where Jinja runs it (``n``) with its length (``chars``)."""
    import jinja2

    counted = {"n": 0, "chars": 0}
    generate = jinja2.Template.generate

    def counting(self, *args, **kwargs):
        counted["n"] += 1
        for piece in generate(self, *args, **kwargs):
            counted["chars"] += len(piece)
            yield piece

    monkeypatch.setattr(jinja2.Template, "generate", counting)
    return counted


@pytest.mark.parametrize("name", ["chatml", *TRANSFORMING_TEMPLATES])
def test_span_finding_renders_a_bounded_amount(renderings, name):
    """Renderings are counted, not timed: a constant number of them, total characters linear in turns."""
    text = SPAN_TEMPLATES.get(name, BUILTIN_TEMPLATES["chatml"])
    cost = {}
    for turns in (8, 64):
        messages = [
            {"role": r, "content": f"{r} <{i}> & 'a' \\ \"b\""}
            for i in range(turns)
            for r in ("user", "assistant")
        ]
        renderings.update(n=0, chars=0)
        full, spans = ChatTemplate(name, text).assistant_spans(messages)
        cost[turns] = (renderings["n"], renderings["chars"] / len(full))
        assert len(spans) == turns
        assert (full, spans) == ChatTemplate(name, text, linear=False).assistant_spans(messages)
    # the same number of renderings, each at most about the conversation's length (prefix by prefix:
    # 3 per turn, 1.5 * turns conversation lengths in all). Verbatim contents: the full rendering, the
    # replaced contents, 3 sample turns x 3; transformed ones: their wrapped contents on top.
    assert cost[64][0] == cost[8][0] <= (11 if name == "chatml" else 12)
    assert cost[64][1] <= 12


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(TRANSFORMING_TEMPLATES) + ["splits", "inspects", "llama3"]),
    contents=st.lists(st.text(alphabet="aAb<>&'\"\\ \n\ue000\U000f0000</think>", max_size=12), max_size=6),
)
def test_bounded_span_finding_equals_prefix_by_prefix_on_any_content(name, contents):
    fast = ChatTemplate(name, SPAN_TEMPLATES[name], {"bos_token": "<s>", "eos_token": "<|im_end|>"})
    slow = ChatTemplate(name, fast.text, fast.special_tokens, linear=False)
    messages = [
        m
        for c in contents
        for m in ({"role": "user", "content": c[::-1]}, {"role": "assistant", "content": c})
    ]
    assert _outcome(fast, messages) == _outcome(slow, messages)


def test_wrapped_contents_are_the_transformed_contents():
    from markupsafe import escape

    template = ChatTemplate("escape", TRANSFORMING_TEMPLATES["escape"])
    messages = _conversation(5, 2)
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    contents = [messages[i]["content"] for i in turns]
    full = template.render(messages)
    starts, ends = wrapped_contents(template, messages, turns, contents, full)
    assert [full[a:b] for a, b in zip(starts, ends, strict=True)] == [str(escape(c)) for c in contents]


def test_rewritten_contents_are_cut_out_between_marked_neighbours(renderings):
    """Reasoning models' templates drop a content's ``<think>`` part, which takes a wrapped content's
    opening sentinel with it: the contents are then cut out of renderings where their neighbours are
    marks, in a number of renderings that does not grow with the turns."""
    text = SPAN_TEMPLATES["splits"]
    cost = {}
    for turns in (8, 64):
        messages = [
            {"role": "user", "content": f"q{i}"} if r == "user" else
            {"role": "assistant", "content": f"<think>{i} & {i}</think>It is <b>{2 * i}</b>."}
            for i in range(turns) for r in ("user", "assistant")
        ]  # fmt: skip
        template = ChatTemplate("splits", text)
        full = template.render(messages)
        turn_ids = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        contents = [messages[i]["content"] for i in turn_ids]
        assert wrapped_contents(template, messages, turn_ids, contents, full) is None
        starts, ends = isolated_contents(template, messages, turn_ids, contents, full)
        assert [full[a:b] for a, b in zip(starts, ends, strict=True)] == [
            c.split("</think>")[-1] for c in contents
        ]
        renderings.update(n=0)
        got = template.assistant_spans(messages)
        cost[turns] = renderings["n"]
        assert got == ChatTemplate("splits", text, linear=False).assistant_spans(messages)
    assert cost[64] == cost[8] <= 15


@pytest.mark.parametrize(
    "content",
    [
        "message['content'] | length",  # the sentinels vanish
        "'(short) ' if message['content'] | length < 4 else message['content']",  # a test on the content
        # a test whose outcome moves nothing: the spans would come out right, but the check is the rendering
        "('A' if message['content'] | length == 3 else 'B') ~ message['content']",
        "message['content'] | center(12)",  # a size taken from it
    ],
)
def test_content_inspecting_templates_go_prefix_by_prefix(renderings, content):
    text = chatml_writing(content)
    messages = [{"role": r, "content": f"{i}"} for i in range(32) for r in ("user", "assistant")]
    got = ChatTemplate("inspects", text).assistant_spans(messages)
    assert renderings["n"] > 3 * 32
    assert got == ChatTemplate("inspects", text, linear=False).assistant_spans(messages)


# -- {% generation %} blocks: spans as transformers' return_assistant_tokens_mask records them ------------
GENERATION_TEMPLATES = {
    # the block holds the content and the end-of-turn marker; the header stays outside
    "chatml": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] | e }}<|im_end|>{% endgeneration %}\n"
    "{% else %}{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    # several blocks per turn, whitespace control, a loop variable, a turn with no block
    "split": """{%- for m in messages -%}
{%- if m.role == 'assistant' and loop.index0 > 2 -%}
[A]{%- generation -%} {{ m.content | upper }}{%- endgeneration -%}{% generation %}{{ eos_token }}{% endgeneration %}
{% elif m.role == 'assistant' %}[A, untrained]{{ m.content }}
{% else %}[{{ m.role | upper }}] {{ m.content | trim }}
{% endif -%}
{%- endfor -%}""",
}


def _hf_generation(text: str, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    render = pytest.importorskip("transformers.utils.chat_template_utils").render_jinja_template
    rendered, indices = render(
        conversations=[messages],
        chat_template=text,
        return_assistant_tokens_mask=True,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
    )
    return rendered[0], [tuple(span) for span in indices[0]]


@pytest.mark.parametrize("name", GENERATION_TEMPLATES)
@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
def test_generation_blocks_give_transformers_spans_from_one_rendering(renderings, name, conversation):
    text, messages = GENERATION_TEMPLATES[name], CONVERSATIONS[conversation]
    template = ChatTemplate(
        name, text, {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}, linear=False
    )
    got = template.assistant_spans(messages)
    assert renderings["n"] == 1  # no prefix by prefix, whatever ``linear`` says
    assert got == _hf_generation(text, messages)


@pytest.mark.parametrize("name", GENERATION_TEMPLATES)
def test_generation_mask_matches_transformers_token_for_token(hf_folder, name):
    from llmtools.tokenize import load_tokenizer

    folder, hf_tok = hf_folder
    template = load_chat_template(None, folder)
    template = ChatTemplate(name, GENERATION_TEMPLATES[name], template.special_tokens)
    encoder = SampleEncoder(
        load_tokenizer(str(folder), backend="tokenizers", special_tokens="split"), template
    )
    for messages in CONVERSATIONS:
        ids, mask = encoder.encode(messages)
        want = hf_tok.apply_chat_template(
            messages,
            chat_template=GENERATION_TEMPLATES[name],
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        assert ids.tolist() == list(want["input_ids"])
        assert mask.tolist() == list(want["assistant_masks"])


def test_assistant_turn_without_a_generation_block_trains_nothing():
    template = ChatTemplate("split", GENERATION_TEMPLATES["split"], {"eos_token": "<|im_end|>"})
    full, spans = template.assistant_spans(CONVERSATIONS[0])
    assert [full[a:b] for a, b in spans] == [
        "4 * 3 = 12 — CAFÉ ☕",
        "<|im_end|>",
        " YOU'RE WELCOME! ",
        "<|im_end|>",
    ]
    assert template.assistant_spans(CONVERSATIONS[1])[1] == []


def test_generation_block_that_is_not_where_it_was_recorded_is_an_error():
    # A block rendered inside a macro is recorded before the macro's output is yielded: transformers'
    # offsets point at the wrong text, so no spans are made of them.
    text = (
        "{% macro turn(m) %}<{{ m.role }}>{% generation %}{{ m.content }}{% endgeneration %}{% endmacro %}"
        "{% for m in messages %}{{ turn(m) }}{% endfor %}"
    )
    with pytest.raises(TemplateRenderError, match="generation"):
        ChatTemplate("macro.jinja", text).assistant_spans(CONVERSATIONS[1])


def test_generation_block_in_a_comment_or_string_does_not_count(renderings):
    text = "{# {% generation %} #}{{ '{% generation %}' }}" + BUILTIN_TEMPLATES["chatml"]
    full, spans = ChatTemplate("t", text).assistant_spans(CONVERSATIONS[1])
    assert [full[a:b] for a, b in spans] == ["Fine by me.<|im_end|>\n"]


def test_generation_blocks_are_recorded_per_rendering_across_threads():
    import sys
    from concurrent.futures import ThreadPoolExecutor

    template = ChatTemplate("gen", GENERATION_TEMPLATES["chatml"])
    conversations = [_conversation(20 + k % 7, k) for k in range(32)]
    alone = [template.assistant_spans(messages) for messages in conversations]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns mid-rendering
    try:
        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(template.assistant_spans, conversations)) == alone
    finally:
        sys.setswitchinterval(interval)
    # a rendering outside span finding records nothing and leaves nothing behind
    assert template.render(conversations[0]) == alone[0][0]


def test_generation_rendering_keeps_the_limits():
    from llmtools.prep.chat_template import TemplateLimitError

    text = "{% for i in range(100000) %}{% generation %}{{ 'x' * 1000 }}{% endgeneration %}{% endfor %}"
    with pytest.raises(TemplateLimitError, match="rendering exceeds"):
        ChatTemplate("big.jinja", text).assistant_spans(CONVERSATIONS[1])


# -- bounded rendering: templates are untrusted code ---------------------------------------------------
BOMBS = {
    "{{ 'A' * 10000000000 }}": "a repeated sequence would be 10,000,000,000 long",
    "{{ messages * 10000000000 }}": "a repeated sequence",
    "{{ 9 ** 99999999 }}": "a power with",
    "{{ '%10000000000d' % 1 }}": "a formatted field",
    "{{ '{:>10000000000}'.format(1) }}": "a formatted field",
    "{{ 'a'.ljust(10000000000) }}": "str.ljust's result",
    "{{ 'a'|center(10000000000) }}": "the centered text",
    "{{ ('a' * 1000000).replace('', 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb') }}": "str.replace's result",
    "{{ messages|tojson(indent=10000000000) }}": "the JSON indentation",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}": "a value",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}": "a concatenation",
    "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}": "rendering exceeds",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}": "recursion too deep",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}": "rendering took more than",
}


@pytest.mark.parametrize("text", list(BOMBS))
def test_template_bombs_are_bounded(text):
    from llmtools.prep.chat_template import TemplateLimitError

    # Only the endless loop is meant to be stopped by the clock; the others have their own bound, and a
    # clock that fired first on a busy machine would name the wrong limit.
    timed = BOMBS[text].startswith("rendering took")
    template = ChatTemplate("bomb.jinja", text, time_limit=0.3 if timed else 60.0)
    with pytest.raises(TemplateLimitError, match=re.escape(BOMBS[text])) as caught:
        template.render(CONVERSATIONS[1])
    assert str(caught.value).startswith("chat template bomb.jinja: ")


def test_time_limit_holds_outside_the_main_thread():
    """No SIGALRM there: the checks at every call stop an endless loop all the same."""
    import threading

    from llmtools.prep.chat_template import TemplateLimitError

    template = ChatTemplate("loop.jinja", BOMBS_LOOP, time_limit=0.3)
    caught = []

    def render():
        try:
            template.render(CONVERSATIONS[1])
        except TemplateLimitError as error:
            caught.append(error)

    thread = threading.Thread(target=render)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive() and caught


BOMBS_LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


def test_syntax_error_names_the_template_file(tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{{ messages }}\n{% for %}")
    with pytest.raises(InputError, match=r"bad\.jinja:2: chat template syntax error"):
        load_chat_template(str(bad))
