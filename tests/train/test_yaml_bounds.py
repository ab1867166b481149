"""Every YAML we read goes through one loader that builds no more than the file's size: aliases (which let
a 1 KB file name a tree of 10^9 leaves) and deep nesting are refused in one line naming the file, and an
unknown key inside a nested section (``rope_scaling``) is refused rather than carried along unchecked.
Checked through the real ``llm-train --dry-run`` for each way a YAML reaches it (the train config, a
preset path, a preset in an ``LLMTOOLS_MODEL_PRESETS`` folder, a ``--set`` value) and through each reader."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmtools.errors import InputError, UsageError
from llmtools.formats import yamlfile
from llmtools.model.presets import load_model_config
from llmtools.train.config import load_train_config, parse_set
from tests.conftest import REPO
from tests.train.conftest import TINY

LLM_TRAIN = Path(sys.executable).parent / "llm-train"
DS = str(REPO / "configs" / "deepspeed" / "zero2.json")
BOUND = 60  # seconds for a refusal; a bomb that got through runs for hours


def alias_bomb(levels: int = 9, width: int = 10, merge: bool = False) -> list[str]:
    """Lines of a mapping whose last entry names width**levels leaves through aliases (a few hundred bytes)."""
    lines = [f"l0: &a0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    if merge:
        lines.append(f"m: {{<<: {{k: *a{levels - 1}}}}}")
    return lines


def _indent(lines: list[str], by: int) -> str:
    return "\n".join(" " * by + line for line in lines) + "\n"


def preset_text(bomb: list[str]) -> str:
    """A model preset whose rope_scaling carries the bomb beside its real keys."""
    fields = "".join(f"{k}: {v}\n" for k, v in TINY.items())
    return fields + "rope_scaling:\n  rope_type: linear\n  factor: 2.0\n" + _indent(bomb, 2)


def train_text(mix: str, model: str) -> str:
    return (
        f"model:\n{model}"
        f"data:\n  mix: {mix}\n"
        "training:\n  micro_batch_size: 4\n  global_batch_size: 8\n  train_steps: 50\n"
        "schedule:\n  warmup_steps: 5\n"
    )


def _run(args, env, cwd, bound: float = BOUND):
    start = time.monotonic()
    try:
        proc = subprocess.run(
            [str(LLM_TRAIN), *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd, timeout=bound
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"llm-train {' '.join(map(str, args))[:200]} still running after {bound} s")
    return proc, time.monotonic() - start


def _routes(folder: Path, mix: str, preset_body: str, set_value: str):
    """(name, args, extra env) for each way a YAML reaches llm-train: all carry the same content."""
    (folder / "presets").mkdir(exist_ok=True)
    (folder / "presets" / "hostile.yaml").write_text(preset_body)
    (folder / "hostile.yaml").write_text(preset_body)
    inline = "  preset: null\n" + _indent(preset_body.splitlines(), 2)
    (folder / "inline.yaml").write_text(train_text(mix, inline))
    (folder / "by_path.yaml").write_text(train_text(mix, f"  preset: {folder / 'hostile.yaml'}\n"))
    (folder / "by_name.yaml").write_text(train_text(mix, "  preset: hostile\n"))
    tiny = "".join(f"  {k}: {v}\n" for k, v in TINY.items())
    (folder / "plain.yaml").write_text(train_text(mix, "  preset: tiny\n" + tiny))
    common = ["--deepspeed", DS, "--dry-run"]
    return [
        ("train config", [folder / "inline.yaml", *common], {}),
        ("preset path", [folder / "by_path.yaml", *common], {}),
        ("LLMTOOLS_MODEL_PRESETS", [folder / "by_name.yaml", *common],
         {"LLMTOOLS_MODEL_PRESETS": str(folder / "presets")}),
        ("--set", [folder / "plain.yaml", *common, "--set", f"model.rope_scaling={set_value}"], {}),
    ]  # fmt: skip


def _check_refused(proc, elapsed, *words):
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-2000:]
    for word in words:
        assert word in lines[0], lines[0]
    assert elapsed < BOUND


@pytest.mark.parametrize("merge", [False, True], ids=["alias-tree", "merge-key"])
def test_an_alias_bomb_is_refused_at_once_by_every_route(byte_data, tmp_path, cli_env, merge):
    bomb = alias_bomb(merge=merge)
    flow = "{rope_type: linear, factor: 2, l0: &a0 [lol, lol, lol], l1: [*a0, *a0, *a0]}"
    for name, args, env in _routes(tmp_path, byte_data["mix"], preset_text(bomb), flow):
        proc, elapsed = _run(args, {**cli_env, **env}, tmp_path)
        _check_refused(proc, elapsed, "alias")
        where = "--set" if name == "--set" else ("hostile.yaml" if "preset" in name.lower() else "inline.yaml")
        assert where in proc.stderr, (name, proc.stderr)


@pytest.mark.parametrize(
    "extra",
    [
        {"scale_everything": 2},  # a key no kind uses
        {"original_max_position_embeddings": 8192},  # a key of llama3, given to linear
        {"partial_rotary_factor": 0.5},  # a transformers key we do not implement
    ],
    ids=["unknown", "other-kind", "unimplemented"],
)
def test_an_unknown_rope_scaling_key_is_refused_by_every_route(byte_data, tmp_path, cli_env, extra):
    (key, value), = extra.items()  # fmt: skip
    body = preset_text([f"{key}: {value}"])
    flow = f"{{rope_type: linear, factor: 2, {key}: {value}}}"
    for name, args, env in _routes(tmp_path, byte_data["mix"], body, flow):
        proc, elapsed = _run(args, {**cli_env, **env}, tmp_path)
        _check_refused(proc, elapsed, "rope_scaling", repr(key))


def test_the_same_configs_without_the_hostile_part_pass_the_dry_run(byte_data, tmp_path, cli_env):
    """The routes above are real: with only the kind's own keys, each dry run succeeds."""
    for _name, args, env in _routes(tmp_path, byte_data["mix"], preset_text([]), "{rope_type: linear, factor: 2}"):
        proc, _ = _run(args, {**cli_env, **env}, tmp_path, bound=600)  # a full dry run: no bound to prove
        assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_deeply_nested_config_is_refused_in_one_line(byte_data, tmp_path, cli_env):
    deep = "[" * 50_000 + "]" * 50_000
    path = tmp_path / "deep.yaml"
    path.write_text(train_text(byte_data["mix"], f"  preset: tiny\n  rope_scaling: {deep}\n"))
    proc, elapsed = _run([path, "--deepspeed", DS, "--dry-run"], cli_env, tmp_path)
    _check_refused(proc, elapsed, "deep.yaml:", "nested")


# -- every reader, by a generator ------------------------------------------------------------------------
def _readers(folder: Path):
    """Each function of ours that reads YAML, on a file holding ``text``."""

    def train(text):
        (folder / "t.yaml").write_text(text)
        return load_train_config(folder / "t.yaml")

    def preset(text):
        (folder / "p.yaml").write_text(text)
        return load_model_config(folder / "p.yaml")

    def setting(text):
        return parse_set(f"model.rope_scaling={text}")

    return {"train config": train, "preset": preset, "--set": setting, "loader": lambda t: yamlfile.loads(t, "x")}


@st.composite
def _hostile_yaml(draw):
    """A mapping where one value, somewhere, is an alias (to a scalar, a list, a map, or by a merge key)."""
    target = draw(st.sampled_from(["1", "[1, 2]", "{a: 1}", "lol"]))
    where = draw(st.sampled_from(["top", "nested", "flow", "merge"]))
    if where == "top":
        return f"x: &r {target}\ny: *r\n"
    if where == "nested":
        return f"model:\n  x: &r {target}\n  rope_scaling:\n    y: *r\n"
    if where == "flow":
        return f"model: {{x: &r {target}, y: [*r]}}\n"
    return "base: &r {a: 1}\nmodel:\n  <<: *r\n"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_hostile_yaml())
def test_every_yaml_reader_refuses_aliases(tmp_path, text):
    for name, reader in _readers(tmp_path).items():
        with pytest.raises((InputError, UsageError), match="alias") as error:
            reader(text)
        assert "\n" not in str(error.value), name
        assert yaml.safe_load(text) is not None  # valid YAML: refused for what it builds, not its syntax


def test_the_shipped_yaml_files_load_through_the_one_loader():
    """No file we ship needs an alias (or the bound would break the configs themselves)."""
    files = sorted((REPO / "configs").rglob("*.yaml")) + sorted((REPO / "llmtools" / "resources").rglob("*.yaml"))
    assert files
    for path in files:
        yamlfile.read(path)


def test_a_hugging_face_config_with_an_unknown_rope_scaling_key_is_refused(tmp_path):
    config = {
        "model_type": "llama", "vocab_size": 320, "hidden_size": 96, "intermediate_size": 256,
        "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 6,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "surprise": [1] * 3},
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="rope_scaling: unknown key 'surprise'"):
        load_model_config(tmp_path)
    del config["rope_scaling"]["surprise"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_model_config(tmp_path).rope_scaling["factor"] == 8.0
