"""Inputs trusted only as far as verified, the library side: the one checked number parser, the one JSON
writer (and that nothing else writes JSON), the bounds on a model config, the tokenizer check on load, a
foreign ``save_to_disk`` folder, stored reference log-probabilities. The same cases through the console
scripts: tests/contract/test_hostile_inputs.py."""

from __future__ import annotations

import ast
import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

from llmtools.errors import InputError, RuntimeFailure
from llmtools.formats import jsonfile
from llmtools.numeric import MAX_COUNT, finite, finite_sum, parse_float, parse_int
from tests.conftest import REPO

# -- numbers -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("nan", "finite"),
        ("-inf", "finite"),
        ("Infinity", "finite"),
        ("1e999", "finite"),  # float() gives inf
        ("1" * 500, "not a number"),  # longer than any number we take
        ("0x10", "not a number"),
        ("", "not a number"),
        ("-1", "negative"),
        ("2", "largest"),
    ],
)
def test_parse_float_refuses(text, match):
    with pytest.raises(InputError, match=match):
        parse_float(text, "--x", lo=0, hi=1)


def test_parse_float_and_int_accept():
    assert parse_float("1_000.5", "--x") == 1000.5
    assert parse_float(" 1e-3 ", "--x") == 1e-3
    assert parse_int("42", "--n") == 42
    assert parse_int(7.0, "--n") == 7


@pytest.mark.parametrize(("value", "match"), [("9" * 41, "digits"), (MAX_COUNT + 1, "largest"), (1.5, "whole"),
                                              (True, "whole"), ("1e3", "whole"), (float("nan"), "whole")])  # fmt: skip
def test_parse_int_refuses(value, match):
    with pytest.raises(InputError, match=match):
        parse_int(value, "--n")


def test_a_sum_that_overflows_is_refused():
    assert finite_sum([1e307, 1e307], "w") == 2e307
    with pytest.raises(InputError, match="sum to infinity"):
        finite_sum([1e308, 1e308], "--weights")
    with pytest.raises(InputError, match="not a number"):
        finite("1", "x")


def test_weights_are_checked_by_the_one_parser():
    from llmtools.cli.mix_args import parse_count, parse_stages, parse_weights
    from llmtools.data.blend import check_weights
    from llmtools.errors import UsageError

    with pytest.raises(InputError, match="sum to infinity"):
        check_weights(parse_weights("1e308,1e308"))
    with pytest.raises(InputError, match="weight 2 is inf"):
        parse_stages(["end 1 1e999"])
    with pytest.raises(UsageError, match="400 digits"):
        parse_count("9" * 400, "--num-samples")
    with pytest.raises(UsageError, match="largest count"):
        parse_count("99999999999T", "--num-samples")


# -- JSON out ----------------------------------------------------------------------------------------
def test_the_json_writer_refuses_non_finite_numbers():
    assert jsonfile.dumps({"a": 1.5}) == '{"a": 1.5}'
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(RuntimeFailure, match="non-finite"):
            jsonfile.dumps({"w": [1.0, bad]}, "mix.json")


# Where the standard library's json.dump(s) may stay: text that is never a JSON file or JSON output of
# ours (hash keys, messages, a chat template's tojson, which must match transformers').
NOT_WRITTEN = {
    "llmtools/formats/jsonfile.py": "the one writer",
    "llmtools/prep/template_sandbox.py": "a chat template's tojson filter (transformers' json.dumps)",
    "llmtools/prep/merge.py": "comparison keys of sidecar values",
    "llmtools/data/mix.py": "a hash key",
    "llmtools/data/mix_sources.py": "hash and comparison keys",
    "llmtools/data/plan_check.py": "a comparison key",
    "llmtools/train/config.py": "a hash key",
    "llmtools/train/resume.py": "a message",
    "llmtools/train/deepspeed_config.py": "messages",
    "llmtools/tokenize/megatron.py": "a hash key",
    "llmtools/tokenize/loader.py": "a hash key",
    "llmtools/tokenize/hf.py": "a tokenizer handed to gigatoken",
}


def test_every_json_we_write_goes_through_the_one_writer():
    found = []
    for path in sorted((REPO / "llmtools").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("dump", "dumps")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "json"
                and rel not in NOT_WRITTEN
            ):
                found.append(f"{rel}:{node.lineno}")
    assert found == [], f"json.dump(s) outside formats/jsonfile.dumps (NaN would be written): {found}"


# -- a model config's size -----------------------------------------------------------------------------
def _llama(**changes) -> dict:
    return {"model_type": "llama", "vocab_size": 256, "hidden_size": 8, "intermediate_size": 16,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1} | changes  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"num_hidden_layers": 10**5}, "num_hidden_layers: 100000 is beyond"),
        ({"num_hidden_layers": 10**18}, "num_hidden_layers"),
        ({"vocab_size": 2**40}, "vocab_size"),
        (
            {
                "hidden_size": 65536,
                "num_attention_heads": 512,
                "num_key_value_heads": 512,
                "intermediate_size": 262144,
                "num_hidden_layers": 1024,
            },
            "parameters",
        ),  # fmt: skip
    ],
)
def test_a_model_config_is_bounded_before_anything_is_built(changes, match):
    from llmtools.model.hf_config import from_hf_config

    started = time.perf_counter()
    with pytest.raises(InputError, match=match):
        from_hf_config(_llama(**changes), "deep/config.json")
    assert (
        time.perf_counter() - started < 5
    )  # refused on the numbers, not after building (generous: shared CPU)


# -- tokenizers ---------------------------------------------------------------------------------------
def test_tokenizer_ids_are_checked_on_load():
    from llmtools.tokenize.checks import check_vocabulary

    found = check_vocabulary({"a": 0, "b": 1, "<eod>": 3}, 4, 3, None, "t.json")
    assert found == {"tokens": 3, "max_id": 3, "unused_ids": 1, "unique_ids": True, "eod": True}
    with pytest.raises(InputError, match="t.json: tokens 'a' and 'b' share id 0"):
        check_vocabulary({"a": 0, "b": 0}, 2, None, None, "t.json")
    with pytest.raises(InputError, match="has id 9, but the tokenizer declares 4"):
        check_vocabulary({"a": 0, "b": 9}, 4, None, None, "t.json")
    with pytest.raises(InputError, match="id -1"):
        check_vocabulary({"a": -1}, 4, None, None, "t.json")
    with pytest.raises(InputError, match="EOD id 7"):
        check_vocabulary({"a": 0}, 4, 7, None, "t.json")


def test_the_sidecar_records_what_the_check_found(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from llmtools.tokenize import load_tokenizer

    tok = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({"a": 0, "b": 1, "<|endoftext|>": 2}, unk_token="a")
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    identity = load_tokenizer(tmp_path / "tokenizer.json", backend="tokenizers").identity()
    assert identity["checked"] == {"tokens": 3, "max_id": 2, "unused_ids": 0, "unique_ids": True, "eod": True}
    data = json.loads((tmp_path / "tokenizer.json").read_text())
    data["model"]["vocab"]["c"] = 1  # a second token on id 1
    (tmp_path / "dup.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match="dup.json: tokens 'b' and 'c' share id 1"):
        load_tokenizer(tmp_path / "dup.json", backend="tokenizers")


# -- a foreign save_to_disk folder ------------------------------------------------------------------
@pytest.fixture
def saved(tmp_path):
    pa = pytest.importorskip("pyarrow")
    folder = tmp_path / "saved"
    folder.mkdir()
    for k, texts in enumerate((["a", "b"], ["c"])):
        table = pa.table({"text": texts})
        with pa.OSFile(str(folder / f"data-0000{k}-of-00002.arrow"), "wb") as sink:
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
    state = {"_data_files": [{"filename": "data-00000-of-00002.arrow"}, {"filename": "data-00001-of-00002.arrow"}],
             "_split": None}  # fmt: skip
    (folder / "state.json").write_text(json.dumps(state))
    return folder


def _rows(folder) -> int:
    from llmtools.prep.hf_open import open_hf

    return sum(batch.num_rows for batch in open_hf(folder).batches(["text"]))


def _edit_state(folder: Path, entries) -> None:
    state = json.loads((folder / "state.json").read_text())
    state["_data_files"] = entries
    (folder / "state.json").write_text(json.dumps(state))


@pytest.mark.parametrize(
    ("entries", "match"),
    [
        ([{"filename": "data-00000-of-00002.arrow"}], "names say 2"),  # one dropped
        (
            [{"filename": "data-00000-of-00002.arrow"}] * 2 + [{"filename": "data-00001-of-00002.arrow"}],
            "twice",
        ),
        ([{"filename": "../outside.arrow"}], "not a file name inside"),
        ([{"filename": "/etc/passwd"}], "not a file name inside"),
        ([{"filename": 3}], "expected"),
        ([{"filename": "data-00000-of-00002.arrow"}, {"filename": "missing.arrow"}], "missing"),
    ],
)
def test_a_save_to_disk_folder_is_verified_against_its_files(saved, entries, match):
    assert _rows(saved) == 3
    (saved.parent / "outside.arrow").write_bytes((saved / "data-00000-of-00002.arrow").read_bytes())
    _edit_state(saved, entries)
    with pytest.raises(InputError, match=match):
        _rows(saved)


def test_an_unlisted_arrow_file_is_refused(saved):
    (saved / "data-00000-of-00002.arrow").rename(saved / "extra.arrow")
    (saved / "data-00001-of-00002.arrow").rename(saved / "data-00000-of-00001.arrow")
    _edit_state(saved, [{"filename": "data-00000-of-00001.arrow"}])
    with pytest.raises(InputError, match="does not list extra.arrow"):
        _rows(saved)


def test_the_manifest_row_count_must_agree(saved):
    (saved / "llmtools.json").write_text(json.dumps({"rows": 5}))
    with pytest.raises(InputError, match="records 5 rows, but the listed files hold 3"):
        _rows(saved)


# -- stored reference log-probabilities -----------------------------------------------------------------
def test_positive_reference_logprobs_are_refused(tmp_path):
    from llmtools.formats.reference import read_reference, write_reference

    identity = {"data": {"pairs": 2}}
    write_reference(tmp_path / "ref", np.array([[-1.0, -2.0], [-0.5, -3.0]]), identity)
    assert read_reference(tmp_path / "ref", identity).shape == (2, 2)
    write_reference(tmp_path / "bad", np.array([[-1.0, -2.0], [-0.5, 0.25]]), identity)
    with pytest.raises(InputError, match=r"pair 1 \(rejected\) has log-probability 0.25 > 0"):
        read_reference(tmp_path / "bad", identity)
