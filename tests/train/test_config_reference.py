"""The words about the train config come from the config dataclasses: ``docs/config-reference.md`` is what
:mod:`llmtools.train.config_reference` writes, ``llm-train --print-config default`` prints every key at its
real default (and loads as a config), and ``--print-config NAME`` prints each shipped config as shipped."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmtools.train.config import all_keys
from llmtools.train.config_reference import DEFAULT, TOP_LEVEL, keys, reference_markdown
from tests.contract.conftest import _inproc, contract_env

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
REFERENCE = ROOT / "docs" / "config-reference.md"
SHIPPED = sorted(p.stem for p in (ROOT / "configs" / "train").glob("*.yaml"))


def _llm_train(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "llm-train"), *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=contract_env())  # fmt: skip


def test_the_reference_page_is_generated_from_the_dataclasses():
    assert REFERENCE.read_text(encoding="utf-8") == reference_markdown(), (
        f"run: python -m llmtools.train.config_reference > {REFERENCE.relative_to(ROOT)}"
    )


def test_the_reference_page_has_every_key_with_a_meaning_and_a_resume_rule():
    text = REFERENCE.read_text(encoding="utf-8")
    for key in all_keys():
        assert f"| `{key}` |" in text, key
    for key in keys():
        assert key.meaning and key.rule, key.dotted  # no silent row: every key says what it is and does


def test_the_printed_default_config_holds_every_key_at_its_default_and_trains(tmp_path):
    printed = _llm_train("--print-config", DEFAULT, cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr
    assert printed.stderr == ""
    text = printed.stdout
    uncommented = yaml.safe_load(text)
    # The optional sections are there commented out: their lines without the '# ' load too.
    optional = yaml.safe_load("\n".join(line[2:] if line.startswith(("#   ", "# lora:", "# dpo:")) else line
                                        for line in text.splitlines()))  # fmt: skip
    for key in keys():
        if key.section == TOP_LEVEL:
            value = uncommented.get(key.key)
        else:
            value = (uncommented.get(key.section) or optional[key.section])[key.key]
        default = None if key.default is dataclasses.MISSING else key.default
        default = list(default) if isinstance(default, tuple) else default
        if dataclasses.is_dataclass(default):
            continue
        assert value == default, (key.dotted, value, default)
    # It is a config: with the three keys it says to set, the dry run passes.
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(f'{{"text": "line {i} of a small corpus"}}\n' for i in range(100)))
    _inproc("prep", "json2bin", corpus, "-t", "byte", "-o", tmp_path / "data", "--append-eod", "-q")
    _inproc("mix", tmp_path / "data_text_document", "--seq-length", "16", "--num-samples", "64", "-o",
            tmp_path / "mix.json")  # fmt: skip
    (tmp_path / "my.yaml").write_text(text)
    run = _llm_train("my.yaml", "--deepspeed", "zero2", "--dry-run", "--set", "model.preset=tiny",
                     "--set", "data.mix=mix.json", "--set", "training.train_steps=4", cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_prints_as_shipped(name, tmp_path):
    printed = _llm_train("--print-config", name, cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == (ROOT / "configs" / "train" / f"{name}.yaml").read_text(encoding="utf-8")


def test_no_shipped_config_takes_the_name_of_the_default():
    assert DEFAULT not in SHIPPED


def test_the_package_ships_the_repositorys_train_configs():
    """One copy: the package's train configs are the repository's configs/train (a link a build follows)."""
    from llmtools.resources import resource_dir

    shipped = resource_dir("train")
    assert sorted(p.stem for p in shipped.glob("*.yaml")) == SHIPPED
    for name in SHIPPED:
        assert (shipped / f"{name}.yaml").read_bytes() == (ROOT / "configs" / "train" / f"{name}.yaml").read_bytes()
