"""llm-prep pref, the library: TRL's record shapes, the shared prompt, masks, truncation, bad pairs, sidecars,
and the reader training uses (data/pref_dataset.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llmtools.data.pref_dataset import PrefDataset
from llmtools.data.sft_dataset import SftDataset
from llmtools.errors import InputError, UsageError
from llmtools.formats.indexed import IndexedDatasetReader
from llmtools.formats.pref_layout import KEYS
from llmtools.prep.chat_template import load_chat_template
from llmtools.prep.pref import PrefConfig, build_pref
from llmtools.tokenize import load_tokenizer
from tests.conftest import REPO, shared

USER = {"role": "user", "content": "What colour is the sky?"}
PAIRS = [
    {"prompt": "Name a colour", "chosen": "Blue, café ☕.", "rejected": "Seven.", "system": "Be brief."},
    {  # explicit prompt, as message lists
        "prompt": [{"role": "system", "content": "You are terse."}, USER],
        "chosen": [{"role": "assistant", "content": "Blue."}],
        "rejected": [{"role": "assistant", "content": "Green, mostly, on Tuesdays."}],
    },
    {  # implicit prompt: the shared leading turns, an assistant turn among them
        "chosen": [
            USER,
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "And at night?"},
            {"role": "assistant", "content": "Black."},
        ],
        "rejected": [
            USER,
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "And at night?"},
            {"role": "assistant", "content": "Also blue."},
        ],
        "prompt": "ignored when the answers are conversations (as in TRL)",
    },
]
PROMPTS = [  # the conversation before the answers, per pair
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour"}],
    PAIRS[1]["prompt"],
    PAIRS[2]["chosen"][:3],
]
ANSWERS = [("Blue, café ☕.", "Seven."), ("Blue.", "Green, mostly, on Tuesdays."), ("Black.", "Also blue.")]


def _write_jsonl(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in records),
        encoding="utf-8",
    )
    return path


@pytest.fixture
def gpt2():
    return str(shared("tokenizers/gpt2/tokenizer.json"))


def _build(tmp_path, records, tokenizer, **kw):
    src = _write_jsonl(tmp_path / "in.jsonl", records)
    kw.setdefault("chat_template", "chatml")
    config = PrefConfig(
        inputs=[str(src)], tokenizer=tokenizer, output_prefix=str(tmp_path / "out" / "p"), **kw
    )
    return config, build_pref(config)


def _side(prefix, side):
    return (
        IndexedDatasetReader(f"{prefix}_{side}_input_ids_document"),
        IndexedDatasetReader(f"{prefix}_{side}_loss_mask_document"),
    )


def test_trl_record_shapes_become_aligned_pairs_with_one_shared_prompt(tmp_path, gpt2):
    config, result = _build(tmp_path, PAIRS, gpt2)
    tok = load_tokenizer(gpt2)
    template = load_chat_template("chatml")
    assert result.pairs == 3 and len(result.paths) == 12 and result.skipped == {}
    (c_ids, c_mask), (r_ids, r_mask) = (
        _side(config.output_prefix, "chosen"),
        _side(config.output_prefix, "rejected"),
    )
    assert c_mask.dtype == np.uint8 and c_ids.dtype == np.uint16
    assert (c_ids.document_lengths() == c_mask.document_lengths()).all()
    assert (r_ids.document_lengths() == r_mask.document_lengths()).all()
    for j in range(3):
        chosen, rejected = c_ids.document(j), r_ids.document(j)
        p = int(np.argmax(c_mask.document(j)))
        assert p == int(np.argmax(r_mask.document(j)))
        assert (chosen[:p] == rejected[:p]).all()  # the shared prompt, token for token
        # ... which is the prompt as the template renders it before an answer
        assert tok.decode(chosen[:p]) == template.render(PROMPTS[j], add_generation_prompt=True)
        for ids, mask, answer in (
            (chosen, c_mask.document(j), ANSWERS[j][0]),
            (rejected, r_mask.document(j), ANSWERS[j][1]),
        ):
            assert (
                not mask[:p].any() and mask[p:].all()
            )  # the answer only: a prompt's own assistant turn is context
            assert tok.decode(ids[mask == 1]) == answer + "<|im_end|>\n"
    assert result.prompt_tokens == sum(int(np.argmax(c_mask.document(j))) for j in range(3))
    assert result.chosen_target_tokens == int(c_mask.tokens().sum())
    assert result.tokens == int(c_ids.document_lengths().sum() + r_ids.document_lengths().sum())


def test_sidecars_follow_the_schema(tmp_path, gpt2):
    jsonschema = pytest.importorskip("jsonschema")
    referencing = pytest.importorskip("referencing")
    config, result = _build(tmp_path, PAIRS, gpt2, max_length=64, max_prompt_length=32)
    base = json.loads((REPO / "schemas" / "sidecar.schema.json").read_text())
    pref = json.loads((REPO / "schemas" / "pref-sidecar.schema.json").read_text())
    registry = referencing.Registry().with_resources(
        [(s["$id"], referencing.Resource.from_contents(s)) for s in (base, pref)]
    )
    validator = jsonschema.Draft202012Validator(pref, registry=registry)
    for key in KEYS:
        sidecar = json.loads((tmp_path / "out" / f"p_{key}_document.json").read_text())
        validator.validate(sidecar)
        assert sidecar["pref"]["role"] == key == sidecar["json_key"]
        assert sidecar["pref"]["counts"] == result.counts()
        side = key.split("_")[0]
        assert sidecar["counts"]["tokens"] == getattr(result, f"{side}_tokens")
        assert sidecar["inputs"][0]["path"].endswith("in.jsonl")
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({**sidecar, "pref": {**sidecar["pref"], "overflow": "wrap"}})


def _lengths(prefix):
    (c_ids, c_mask), (r_ids, _) = _side(prefix, "chosen"), _side(prefix, "rejected")
    return [
        (int(np.argmax(c_mask.document(j))), int(c_ids.document(j).size), int(r_ids.document(j).size))
        for j in range(c_ids.num_documents)
    ]


def test_truncation_shortens_the_prompt_first_then_the_response(tmp_path):
    long_prompt = {"prompt": "p" * 60, "chosen": "c" * 50, "rejected": "r" * 10}
    full_config, _ = _build(tmp_path / "full", [long_prompt], "byte")
    ((p0, c0, r0),) = _lengths(full_config.output_prefix)
    full_chosen = IndexedDatasetReader(f"{full_config.output_prefix}_chosen_input_ids_document").document(0)

    # --max-prompt-length: the prompt keeps its LAST tokens (nearest the answer); the answers are whole
    config, result = _build(tmp_path / "a", [long_prompt], "byte", max_prompt_length=40)
    ((p, c, r),) = _lengths(config.output_prefix)
    assert (p, c, r) == (40, c0 - (p0 - 40), r0 - (p0 - 40)) and result.prompt_truncated == 1
    ids = IndexedDatasetReader(f"{config.output_prefix}_chosen_input_ids_document").document(0)
    assert (ids == full_chosen[p0 - 40 :]).all()

    # then --max-length: each longer sequence keeps its FIRST tokens (the response loses its end)
    config, result = _build(tmp_path / "b", [long_prompt], "byte", max_prompt_length=40, max_length=70)
    ((p, c, r),) = _lengths(config.output_prefix)
    assert (p, c, r) == (40, 70, r0 - (p0 - 40)) and result.truncated == 1
    ids = IndexedDatasetReader(f"{config.output_prefix}_chosen_input_ids_document").document(0)
    assert (ids == full_chosen[p0 - 40 : p0 - 40 + 70]).all()

    # a prompt that alone fills --max-length leaves no answer: the pair is dropped (as TRL drops it)
    short = {"prompt": "q", "chosen": "yes", "rejected": "no"}
    config, result = _build(tmp_path / "c", [long_prompt, short], "byte", max_length=p0)
    assert result.pairs == 1 and result.dropped_too_long == 1 and result.truncated == 0
    # --overflow drop drops a pair over --max-length instead of cutting it
    config, result = _build(tmp_path / "d", [long_prompt, short], "byte", max_length=p0 + 20, overflow="drop")
    assert result.pairs == 1 and result.dropped_too_long == 1 and result.truncated == 0
    with pytest.raises(InputError, match="no usable pairs.*dropped as too long 1"):
        _build(tmp_path / "e", [long_prompt], "byte", max_length=p0)


# (kind, bad record or line, what the message must say)
MISMATCH_TEMPLATE = "{{ messages[-1]['content'] | length }}|{% for m in messages %}{{ m['role'] }}:{{ m['content'] }};{% endfor %}"
BAD = [
    ("malformed_json", '{"prompt": "x",', "malformed JSON"),
    ("not_an_object", [1, 2], "expected a JSON object, got list"),
    ("missing_key", {"prompt": "q", "chosen": "a"}, "missing key 'rejected'"),
    ("missing_key", {"chosen": "a", "rejected": "b"}, "missing key 'prompt' (string answers need a prompt)"),
    (
        "not_a_string",
        {"prompt": "q", "chosen": 3, "rejected": "b"},
        "[chosen]: expected a string or a list of messages, got int",
    ),
    ("not_a_string", {"prompt": 7, "chosen": "a", "rejected": "b"}, "[prompt]: expected a string, got int"),
    (
        "mixed_types",
        {"prompt": "q", "chosen": "a", "rejected": [USER]},
        "one is a string, the other a list of messages",
    ),
    (
        "bad_messages",
        {"chosen": ["hi"], "rejected": [USER]},
        "chosen[0]: expected an object with role and content",
    ),
    (
        "unknown_role",
        {"chosen": [{"role": "robot", "content": "x"}], "rejected": [USER]},
        "chosen[0]: unknown role 'robot'",
    ),
    (
        "empty_completion",
        {
            "chosen": [USER, {"role": "assistant", "content": "x"}],
            "rejected": [USER, {"role": "assistant", "content": "x"}],
        },
        "[chosen]: no assistant turn with content",
    ),
    (
        "empty_completion",
        {"prompt": "q", "chosen": "a", "rejected": "   "},
        "[rejected]: no assistant turn with content",
    ),
]
GOOD = {"prompt": "q", "chosen": "yes", "rejected": "no"}


@pytest.mark.parametrize("kind,record,words", BAD, ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(BAD)])
def test_a_bad_pair_stops_with_its_place_or_is_counted(tmp_path, kind, record, words):
    with pytest.raises(InputError) as error:
        _build(tmp_path, [GOOD, record], "byte")
    assert "in.jsonl:2: " in str(error.value) and words in str(error.value)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())  # nothing written
    _, result = _build(tmp_path, [GOOD, record, GOOD], "byte", skip_bad=True)
    assert result.pairs == 2 and result.skipped == {kind: 1}


def test_a_prompt_rendered_differently_before_the_two_answers_is_a_bad_pair(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text(MISMATCH_TEMPLATE, encoding="utf-8")  # writes the last message's length first
    same = {"prompt": "q", "chosen": "ab", "rejected": "cd"}
    differ = {"prompt": "q", "chosen": "ab", "rejected": "cde"}
    _, result = _build(tmp_path / "ok", [same], "byte", chat_template=str(template))
    assert result.pairs == 1
    with pytest.raises(
        InputError, match=r"in\.jsonl:2: the chosen and rejected renderings do not share the prompt"
    ):
        _build(tmp_path / "bad", [same, differ], "byte", chat_template=str(template))
    _, result = _build(tmp_path / "skip", [same, differ], "byte", chat_template=str(template), skip_bad=True)
    assert result.pairs == 1 and result.skipped == {"prompt_mismatch": 1}
    # a template that drops the answers leaves nothing to compare
    silent = tmp_path / "silent.jinja"
    silent.write_text(
        "{% for m in messages %}{% if m['role'] != 'assistant' %}{{ m['content'] }}{% endif %}{% endfor %}"
    )
    with pytest.raises(InputError, match=r"in\.jsonl:1: the template renders no token of the chosen answer"):
        _build(tmp_path / "silent", [same], "byte", chat_template=str(silent))


def test_hf_dataset_input_equals_jsonl(tmp_path, gpt2):
    datasets = pytest.importorskip("datasets")
    records = [{k: v for k, v in r.items() if k != "prompt"} for r in PAIRS[1:]]  # message lists only
    config, _ = _build(tmp_path, records, gpt2)
    folder = tmp_path / "hf"
    datasets.Dataset.from_list(records).save_to_disk(str(folder))
    out = tmp_path / "hfout" / "p"
    result = build_pref(
        PrefConfig(inputs=[str(folder)], tokenizer=gpt2, output_prefix=str(out), chat_template="chatml")
    )
    assert result.pairs == 2
    for key in KEYS:
        want = IndexedDatasetReader(f"{config.output_prefix}_{key}_document")
        got = IndexedDatasetReader(f"{out}_{key}_document")
        assert (got.tokens() == want.tokens()).all() and (
            got.document_lengths() == want.document_lengths()
        ).all()


def test_the_training_reader_gives_chosen_rows_then_rejected_rows(tmp_path):
    config, _ = _build(tmp_path, PAIRS, "byte")
    prefix = config.output_prefix
    data = PrefDataset(prefix)
    assert len(data) == 3 and len(data.files()) == 8
    assert len(SftDataset(f"{prefix}_chosen")) == 3  # each side is an llm-prep sft prefix too
    seq = 512
    batch = data.batch([2, 0], seq)
    (c_ids, c_mask), (r_ids, r_mask) = _side(prefix, "chosen"), _side(prefix, "rejected")
    rows = [(c_ids, c_mask, 2), (c_ids, c_mask, 0), (r_ids, r_mask, 2), (r_ids, r_mask, 0)]
    width = max(ids.document(j).size for ids, _, j in rows) - 1
    assert batch["tokens"].shape == batch["labels"].shape == batch["loss_mask"].shape == (4, width)
    for row, (ids, mask, j) in enumerate(rows):
        n = ids.document(j).size
        assert (batch["tokens"][row, : n - 1] == ids.document(j)[:-1]).all()
        assert (batch["labels"][row, : n - 1] == ids.document(j)[1:]).all()
        assert (batch["loss_mask"][row, : n - 1] == mask.document(j)[1:]).all()
        assert not batch["loss_mask"][row, n - 1 :].any()  # padding is never a target
    # a window shorter than a prompt leaves that pair nothing to compare
    shortest_prompt = min(int(np.argmax(c_mask.document(j))) for j in range(3))
    assert data.unreachable_answers(seq).size == 0
    assert data.unreachable_answers(shortest_prompt - 1).tolist() == [0, 1, 2]
    with pytest.raises(InputError, match="not found .*llm-prep pref"):
        PrefDataset(tmp_path / "nothing")


def test_config_validates_flags():
    with pytest.raises(UsageError, match="--max-prompt-length: 64 leaves no room"):
        PrefConfig(inputs=["x"], tokenizer="byte", output_prefix="o", max_length=64, max_prompt_length=64)
    with pytest.raises(UsageError, match="--overflow"):
        PrefConfig(inputs=["x"], tokenizer="byte", output_prefix="o", overflow="wrap")
    with pytest.raises(UsageError, match="--max-length"):
        PrefConfig(inputs=["x"], tokenizer="byte", output_prefix="o", max_length=0)
    with pytest.raises(UsageError, match="three different keys"):
        PrefConfig(inputs=["x"], tokenizer="byte", output_prefix="o", chosen_key="prompt")


# ChatML whose {% generation %} block marks only the conversation's last assistant turn: the prompt's own
# assistant turn has no block, so blocks are not one per assistant message.
LAST_TURN_TRAINED = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' and loop.last %}{% generation %}{{ message['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_a_generation_template_trains_the_completions_blocks_whatever_their_count(tmp_path, gpt2):
    """The completion's spans are the blocks past the prompt's rendering, not the n-th span onwards: here
    the prompt's assistant turn has no block, and counting turns would mask the whole answer away."""
    template = tmp_path / "last.jinja"
    template.write_text(LAST_TURN_TRAINED)
    config, result = _build(tmp_path, [PAIRS[2]], gpt2, chat_template=str(template))
    assert result.pairs == 1 and result.skipped == {}
    tok = load_tokenizer(gpt2)
    for side, answer in zip(("chosen", "rejected"), ANSWERS[2], strict=True):
        ids, mask = (reader.document(0) for reader in _side(config.output_prefix, side))
        assert tok.decode(ids[mask == 1]) == answer + "<|im_end|>"
