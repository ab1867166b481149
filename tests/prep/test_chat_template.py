"""Chat templates render exactly as transformers' apply_chat_template, token for token."""

from __future__ import annotations

import json

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
