"""Train config: YAML loading, --set overrides, unknown keys with suggestions, wrong types, validation."""

from __future__ import annotations

import textwrap

import pytest

from llmtools.errors import InputError, UsageError
from llmtools.train.config import all_keys, load_train_config

BASE = """
model:
  preset: tiny
data:
  mix: mix.json
training:
  micro_batch_size: 2
  global_batch_size: 4
  train_steps: 10
optimizer:
  lr: 3e-4
"""


@pytest.fixture
def cfg_file(tmp_path):
    def write(text: str = BASE):
        path = tmp_path / "train.yaml"
        path.write_text(textwrap.dedent(text))
        return path

    return write


def test_tiny_preset_config_loads():
    cfg = load_train_config("configs/train/tiny.yaml")
    assert cfg.model.preset == "tiny"
    assert cfg.training.global_batch_size % cfg.training.micro_batch_size == 0
    assert cfg.schedule.total_steps is None and cfg.total_steps(128) == cfg.training.train_steps  # follows it


def test_defaults_and_float_strings(cfg_file):
    cfg = load_train_config(cfg_file())
    assert cfg.optimizer.lr == pytest.approx(3e-4)  # PyYAML reads "3e-4" as a string; accepted as a number
    assert cfg.optimizer.betas == [0.9, 0.95]
    assert cfg.grad_accumulation(1) == 2 and cfg.grad_accumulation(2) == 1
    assert cfg.steps(seq_length=128) == 10


def test_set_overrides(cfg_file):
    cfg = load_train_config(
        cfg_file(),
        [
            "optimizer.lr=1e-3",
            "training.train_steps=7",
            "model.hidden_size=64",
            "optimizer.betas=[0.8, 0.9]",
            "logging.tensorboard=true",
        ],
    )
    # a YAML number parsed to float64: the default tolerance only allows its decimal rounding
    assert cfg.optimizer.lr == pytest.approx(1e-3)
    assert cfg.training.train_steps == 7
    assert cfg.model.overrides == {"hidden_size": 64}
    assert cfg.optimizer.betas == [0.8, 0.9]
    assert cfg.logging.tensorboard is True


def test_train_tokens_rounds_up_to_steps(cfg_file):
    cfg = load_train_config(cfg_file(), ["training.train_steps=null", "training.train_tokens=1000"])
    assert cfg.steps(seq_length=128) == 2  # 1000 / (4 x 128) rounded up


@pytest.mark.parametrize(
    "text, expected",
    [
        ("optimizer:\n  lrr: 1.0\n", "unknown key optimizer.lrr (did you mean 'optimizer.lr'?)"),
        ("trainig:\n  seed: 1\n", "unknown section 'trainig' (did you mean 'training'?)"),
        ("schedule:\n  warmup: 5\n", "did you mean 'schedule.warmup_steps'?"),
    ],
)
def test_unknown_key_suggests(cfg_file, text, expected):
    with pytest.raises(InputError) as error:
        load_train_config(cfg_file(BASE + text))
    assert expected in str(error.value)
    assert "train.yaml" in str(error.value)


def test_unknown_set_key_suggests(cfg_file):
    with pytest.raises(
        UsageError, match=r"unknown key training\.micro_batch \(did you mean 'training\.micro_batch_size'\?\)"
    ):
        load_train_config(cfg_file(), ["training.micro_batch=4"])
    with pytest.raises(UsageError, match="KEY=VALUE"):
        load_train_config(cfg_file(), ["training.train_steps"])


@pytest.mark.parametrize(
    "override, key",
    [
        ("training.train_steps=ten", "training.train_steps: expected integer"),
        ("training.micro_batch_size=2.5", "training.micro_batch_size: expected integer"),
        ("optimizer.lr=fast", "optimizer.lr: expected number"),
        ("logging.tensorboard=3", "logging.tensorboard: expected true/false"),
        ("optimizer.betas=0.9", "optimizer.betas: expected list of number"),
        ("training.precision=fp8", "'fp8' is not one of fp32, bf16, fp16"),
    ],
)
def test_wrong_type_names_the_key(cfg_file, override, key):
    with pytest.raises(InputError, match=key.replace("(", r"\(").replace(".", r"\.")):
        load_train_config(cfg_file(), [override])


def test_wrong_type_in_yaml_names_file_and_key(cfg_file):
    with pytest.raises(
        InputError, match=r"train\.yaml: training\.global_batch_size: expected integer, got str"
    ):
        load_train_config(cfg_file(BASE.replace("global_batch_size: 4", "global_batch_size: four")))


@pytest.mark.parametrize(
    "override, message",
    [
        ("training.global_batch_size=5", "not a multiple of training.micro_batch_size=2"),
        ("training.train_tokens=100", "exactly one of training.train_steps and training.train_tokens"),
        ("optimizer.lr=-1", "optimizer.lr: must be > 0"),
        ("schedule.kind=cosinus", "did you mean 'cosine'"),
        ("schedule.total_steps=5", "training.train_steps=10 runs past schedule.total_steps=5"),
        ("health.spike_factor=0.5", "health.spike_factor: must be 0 (off) or > 1"),
        ("data.prefixes=[a]", "give data.mix or data.prefixes, not both"),
    ],
)
def test_invalid_values(cfg_file, override, message):
    with pytest.raises(InputError) as error:
        load_train_config(cfg_file(), [override])
    assert message in str(error.value)


def test_bad_yaml_names_the_line(cfg_file):
    with pytest.raises(InputError, match=r"train\.yaml:\d+: not valid YAML"):
        load_train_config(cfg_file("model:\n  preset: tiny\n  bad: [1, 2\n"))


def test_prefixes_need_seq_length(cfg_file):
    text = BASE.replace("mix: mix.json", "prefixes: [a, b]\n  weights: [0.7, 0.3]")
    with pytest.raises(InputError, match="data.seq_length: required with data.prefixes"):
        load_train_config(cfg_file(text))
    cfg = load_train_config(cfg_file(text), ["data.seq_length=64"])
    assert cfg.data.weights == [0.7, 0.3]


def test_to_dict_round_trips(cfg_file):
    from llmtools.train.config import from_dict

    cfg = load_train_config(cfg_file(), ["model.hidden_size=64"])
    again = from_dict(cfg.to_dict(), "again")
    assert again.to_dict() == cfg.to_dict()
    assert again.fingerprint() == cfg.fingerprint()


def test_schema_file_is_generated_from_the_dataclasses():
    import json
    from pathlib import Path

    from llmtools.train.schema import train_config_schema

    path = Path(__file__).resolve().parents[2] / "schemas" / "train-config.schema.json"
    assert json.loads(path.read_text()) == train_config_schema(), (
        "run: python -m llmtools.train.schema > " + str(path)
    )


def test_schema_knows_every_key():
    import json
    from pathlib import Path

    schema = json.loads(
        (Path(__file__).resolve().parents[2] / "schemas" / "train-config.schema.json").read_text()
    )
    sections = {
        name: sec.get("anyOf", [sec])[0] for name, sec in schema["properties"].items()
    }  # lora: or null
    in_schema = {f"{s}.{k}" for s, sec in sections.items() for k in sec.get("properties", {})}
    assert set(all_keys()) <= in_schema


def test_schema_validates_shipped_configs():
    jsonschema = pytest.importorskip("jsonschema")
    import json
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2]
    schema = json.loads((root / "schemas" / "train-config.schema.json").read_text())
    for path in sorted((root / "configs" / "train").glob("*.yaml")):
        jsonschema.validate(yaml.safe_load(path.read_text()), schema)
