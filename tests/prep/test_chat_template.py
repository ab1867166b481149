"""Chat templates render exactly as transformers' apply_chat_template, token for token."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from llmtools.errors import InputError, UsageError
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


def _conversation(turns: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    pieces = ["It is", " 4.", "\n", "", "<|im_end|>", '"q"', "café", "x" * 5]
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


def test_span_finding_renders_a_bounded_amount(monkeypatch):
    """Renderings are counted, not timed: a constant number of them, total characters linear in turns."""
    counted = {"renders": 0, "chars": 0}
    render = ChatTemplate.render

    def counting(self, messages, add_generation_prompt=False):
        text = render(self, messages, add_generation_prompt)
        counted["renders"] += 1
        counted["chars"] += len(text)
        return text

    monkeypatch.setattr(ChatTemplate, "render", counting)
    cost = {}
    for turns in (8, 64):
        counted.update(renders=0, chars=0)
        template = load_chat_template("chatml", None)
        messages = [{"role": r, "content": f"{r} {i}"} for i in range(turns) for r in ("user", "assistant")]
        full, spans = template.assistant_spans(messages)
        assert len(spans) == turns
        cost[turns] = (counted["renders"], counted["chars"] / len(full))
    # the same number of renderings, each at most about the conversation's length (prefix by prefix:
    # 3 per turn, 1.5 * turns conversation lengths in all)
    assert cost[64][0] == cost[8][0] <= 11
    assert cost[64][1] <= 11


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

    template = ChatTemplate("bomb.jinja", text, time_limit=0.3)
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
