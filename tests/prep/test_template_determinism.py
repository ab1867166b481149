"""Chat templates render deterministically: ``strftime_now`` gives a pinned date (``--template-date``,
default 2024-07-26, recorded in the sidecar), never the clock; a template that uses a source of randomness
(the ``random`` filter, ``lipsum``) is refused in one line; so ``llm-prep sft``/``pref`` give the same
bytes for the same inputs, and the assistant spans keep their end-of-turn text."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import date, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmtools.errors import InputError
from llmtools.prep.chat_template import load_chat_template

LLM_PREP = Path(sys.executable).parent / "llm-prep"
DEFAULT_DATE = "2024-07-26"

# Meta's Llama 3.1 template, its date preamble as shipped (tools left out): today's date from strftime_now.
LLAMA31 = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("FORMAT") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""
FORMATS = ["%d %b %Y", "%Y-%m-%d %H:%M:%S.%f", "%s%f"]  # Llama's own; with the clock's microseconds
CHATS = [
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                  {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]},
    {"messages": [{"role": "user", "content": "name a colour"}, {"role": "assistant", "content": "blue"}]},
]  # fmt: skip
PAIRS = [{"prompt": "p", "chosen": "good", "rejected": "bad"}, {"prompt": "q", "chosen": "yes", "rejected": "no"}]


def _template(folder: Path, fmt: str) -> Path:
    path = folder / "llama31.jinja"
    path.write_text(LLAMA31.replace("FORMAT", fmt))
    return path


def _inputs(folder: Path, records) -> Path:
    path = folder / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _prep(command: str, folder: Path, template: Path, out: str, *extra: str):
    records = CHATS if command == "sft" else PAIRS
    args = [str(LLM_PREP), command, str(_inputs(folder, records)), "-t", "byte", "--chat-template", str(template),
            "-o", str(folder / out / "x"), *extra]  # fmt: skip
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def _outputs(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix in (".bin", ".idx")}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("command", ["sft", "pref"])
def test_the_same_inputs_give_the_same_bytes_and_the_date_is_recorded(tmp_path, command, fmt):
    template = _template(tmp_path, fmt)
    first = _prep(command, tmp_path, template, "a")
    second = _prep(command, tmp_path, template, "b")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    a, b = _outputs(tmp_path / "a"), _outputs(tmp_path / "b")
    assert a and a == b
    for sidecar in (tmp_path / "a").glob("*.json"):
        assert json.loads(sidecar.read_text())[command]["chat_template"]["date"] == DEFAULT_DATE
    # the date the template printed is the pinned one, not today's
    shown = datetime.fromisoformat(DEFAULT_DATE).strftime(fmt).encode()
    assert shown in _byte_text(tmp_path / "a")
    # a date of the user's: recorded, and printed
    other = _prep(command, tmp_path, template, "c", "--template-date", "2031-02-03")
    assert other.returncode == 0, other.stderr
    for sidecar in (tmp_path / "c").glob("*.json"):
        assert json.loads(sidecar.read_text())[command]["chat_template"]["date"] == "2031-02-03"
    assert datetime(2031, 2, 3).strftime(fmt).encode() in _byte_text(tmp_path / "c")


def _byte_text(folder: Path) -> bytes:
    """The bytes of every input_ids document (byte tokenizer: ids are bytes + an offset)."""
    from llmtools.formats.indexed import IndexedDatasetReader
    from llmtools.tokenize import load_tokenizer

    tok = load_tokenizer("byte")
    out = b""
    for idx in sorted(folder.glob("*input_ids_document.idx")):
        reader = IndexedDatasetReader(str(idx)[: -len(".idx")])
        for i in range(reader.num_sequences):
            out += tok.decode(list(reader.get(i))).encode("utf-8", "surrogateescape")
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_assistant_spans_keep_the_end_of_turn_text(fmt, tmp_path):
    template = load_chat_template(_template(tmp_path, fmt), None)
    for chat in CHATS:
        text, spans = template.assistant_spans(chat["messages"])
        answers = [m["content"] for m in chat["messages"] if m["role"] == "assistant"]
        assert [text[a:b] for a, b in spans] == [f"{answer}<|eot_id|>" for answer in answers]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(day=st.dates(date(1900, 1, 1), date(2999, 12, 31)), fmt=st.sampled_from(FORMATS))
def test_strftime_now_gives_the_pinned_date_in_every_rendering(tmp_path, day, fmt):
    template = load_chat_template(_template(tmp_path, fmt), None, date=day.isoformat())
    renderings = {template.render(CHATS[0]["messages"]) for _ in range(3)}
    (only,) = renderings
    assert f"Today Date: {datetime(day.year, day.month, day.day).strftime(fmt)}\n" in only


RANDOM = [
    ("{{ messages | random }}", "'random' filter"),
    ("{% set pick = [1, 2, 3] | random %}{{ pick }}", "'random' filter"),
    ("{% if false %}{{ range(9) | random }}{% endif %}ok", "'random' filter"),  # refused unrun, too
    ("{{ lipsum(1) }}", "lipsum()"),
    ("{% for m in messages %}\n{{ m.content }}\n{% endfor %}\n{{ lipsum(n=1, html=false) }}", "lipsum()"),
]


@pytest.mark.parametrize(("source", "what"), RANDOM)
@pytest.mark.parametrize("command", ["sft", "pref"])
def test_a_template_using_randomness_is_refused_in_one_line(tmp_path, command, source, what):
    template = tmp_path / "random.jinja"
    template.write_text(source)
    proc = _prep(command, tmp_path, template, "out")
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"{template}:" in line and what in line and "randomness" in line, line
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("source", ["{{ joiner() }}", "{{ cycler(1, 2) }}", "{{ raise_exception }}"])
def test_printing_a_memory_address_is_refused(tmp_path, source):
    template = tmp_path / "address.jinja"
    template.write_text(source)
    with pytest.raises(InputError, match="memory address"):
        load_chat_template(template, None).render(CHATS[0]["messages"])


@pytest.mark.parametrize("bad", ["today", "2024-13-01", "2024-7-26", "26 Jul 2024", ""])
def test_a_bad_template_date_is_refused_in_one_line(tmp_path, bad):
    proc = _prep("sft", tmp_path, _template(tmp_path, FORMATS[0]), "out", "--template-date", bad)
    if bad == "":  # an empty option is the default
        assert proc.returncode == 0, proc.stderr
        return
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "--template-date" in line and "YYYY-MM-DD" in line
