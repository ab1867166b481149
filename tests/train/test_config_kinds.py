"""One parse and one check, whichever way a value or a length is given: a ``--set`` value is read as the
same YAML value a file holds (``+8``, ``8.0``, ``0x8`` and ``8`` are one integer everywhere, side checks
included), and every check on the run's length applies whether it is given in steps or in tokens."""

from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmtools.errors import InputError, UsageError
from llmtools.train.config import SECTION_TYPES, config_key, load_train_config
from tests.train.conftest import SEQ, TINY
from tests.train.test_cli import DS, llm_train

BASE = {
    "model": {"preset": "tiny", **TINY},
    "data": {"mix": "mix.json"},
    "training": {"micro_batch_size": 4, "global_batch_size": 8, "train_steps": 200},
    "schedule": {"warmup_steps": 20, "total_steps": 200},  # a full curve: fewer steps need a word
}


def outcome(call) -> tuple[str, str]:
    """("ok", the resolved config) or (the error's type, its message)."""
    try:
        return "ok", repr(call().to_dict())
    except (InputError, UsageError) as error:
        return type(error).__name__, str(error)


def spellings(n: int) -> st.SearchStrategy[str]:
    """Texts YAML reads as the integer ``n`` (in a file and after --set alike)."""
    forms = [str(n), f"+{n}", f"{n}.0", hex(n), f"{n:_}"]
    if n >= 10:
        text = str(n)
        forms.append(f"{text[0]}_{text[1:]}")
    return st.sampled_from(forms)


def int_keys() -> list[str]:
    """Every integer key of the config's sections (``int`` or ``int | None``)."""
    keys = []
    for name, cls in SECTION_TYPES.items():
        if name == "model":
            continue
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            if tp is int or (typing.get_origin(tp) in (typing.Union, __import__("types").UnionType)
                             and set(typing.get_args(tp)) == {int, type(None)}):  # fmt: skip
                keys.append(f"{name}.{config_key(f)}")
    return keys


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 400).flatmap(lambda n: st.tuples(st.just(n), spellings(n))))
def test_set_train_steps_in_any_spelling_meets_the_check_its_plain_number_meets(tmp_path, n):
    number, text = n
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(BASE))
    plain = outcome(lambda: load_train_config(path, [f"training.train_steps={number}"]))
    spelled = outcome(lambda: load_train_config(path, [f"training.train_steps={text}"]))
    assert spelled == plain, (text, spelled, plain)
    if number != 200:  # fewer or more steps than the file's full curve: refused with both ways out
        assert plain[0] == "UsageError" and f"--set schedule.total_steps={number}" in plain[1]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_set_value_is_the_value_the_same_text_has_in_the_file(tmp_path, data):
    """Any integer key, any spelling: ``--set key=TEXT`` over the base file gives what the file with
    ``key: TEXT`` written in it gives (the same config, or the same refusal)."""
    key = data.draw(st.sampled_from(int_keys()), label="key")
    number = data.draw(st.integers(0, 300), label="number")
    text = data.draw(spellings(number), label="text")
    section, name = key.split(".")
    base = dict(BASE, schedule={"warmup_steps": 0})  # no full curve: only the value's own checks
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump(base))
    written = tmp_path / "written.yaml"
    body = {k: dict(v) for k, v in base.items()}
    body.setdefault(section, {})[name] = "@@"
    written.write_text(yaml.safe_dump(body).replace("'@@'", text))
    by_set = outcome(lambda: load_train_config(plain, [f"{key}={text}"]))
    in_file = outcome(lambda: load_train_config(written))
    # the same verdict; messages differ only in where the value came from
    assert by_set[0] == in_file[0] or {by_set[0], in_file[0]} == {"InputError", "UsageError"}, (key, text)
    if by_set[0] == "ok":
        assert by_set == in_file, (key, text)


# -- the run's length, in steps or in tokens ----------------------------------------------------------
def verdict(config_path: Path, overrides: list[str], byte_mix: str) -> str:
    """What the checks before compute say about a config: ok, or which check refused it."""
    from llmtools.train.plan import make_plan

    try:
        config = load_train_config(config_path, [f"data.mix={byte_mix}", *overrides])
        make_plan(config, {"zero_optimization": {"stage": 0}}, world_size=1)
    except (InputError, UsageError) as error:
        message = str(error)
        for check in ("is not shorter than", "runs past schedule.total_steps", "is longer than"):
            if check in message:
                return check
        raise
    return "ok"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=st.integers(1, 24),
    warmup=st.integers(0, 30),
    total=st.none() | st.integers(1, 30),
    part=st.floats(0, 1, exclude_max=True),
)
def test_every_length_check_applies_to_steps_and_tokens_alike(byte_data, tmp_path, steps, warmup, total, part):
    per_step = 8 * SEQ
    tokens = (steps - 1) * per_step + 1 + math.floor(part * per_step)  # ceil(tokens / per_step) == steps
    path = tmp_path / "train.yaml"
    schedule = {"warmup_steps": warmup, **({"total_steps": total} if total is not None else {})}
    path.write_text(yaml.safe_dump(dict(BASE, schedule=schedule)))
    in_steps = verdict(path, [f"training.train_steps={steps}"], byte_data["mix"])
    in_tokens = verdict(path, ["training.train_steps=null", f"training.train_tokens={tokens}"], byte_data["mix"])
    assert in_tokens == in_steps, (steps, tokens, warmup, total)


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_warmup_longer_than_a_run_given_in_tokens_is_refused_by_llm_train(byte_data, tmp_path, cli_env, dry_run):
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(dict(BASE, data={"mix": byte_data["mix"]}, schedule={"warmup_steps": 20})))
    run_dir = tmp_path / "run"
    args = [path, "--deepspeed", DS, "-o", run_dir, "--set", "training.train_steps=null"]
    args += ["--set", f"training.train_tokens={5 * 8 * SEQ}", *(["--dry-run"] if dry_run else [])]
    out = llm_train(args, cli_env, timeout=120)
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert (
        f"schedule.warmup_steps=20 is not shorter than training.train_tokens={5 * 8 * SEQ} (5 steps of 8 x {SEQ} "
        "tokens)" in line
    ), line
    assert not run_dir.exists()
