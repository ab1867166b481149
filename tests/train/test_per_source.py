"""``eval.per_source`` is honoured or refused in one line, never silently dropped: a valid split with its
own blend (one source or several) and a single prefix report each of their sources (whose token-weighted
losses make the eval loss); a task whose samples are no source's text is refused before compute."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.train.test_cli import DS, llm_train, write_config


def own_valid_blend(byte_data, folder: Path, valid: list[str]) -> str:
    """A mix of both byte sources for training whose valid split is a blend of its own (``valid``)."""
    from llmtools.data import mix as mixlib

    prefixes = dict(zip(("shakespeare", "wiki"), byte_data["prefixes"], strict=True))
    config = mixlib.MixConfig(
        blend=None,
        blend_per_split={
            "train": mixlib.Blend(list(prefixes.values()), [0.7, 0.3]),
            "valid": mixlib.Blend([prefixes[name] for name in valid], [1.0] * len(valid)),
        },
        seq_length=64,
        num_samples=400,
        valid_samples=64,
        test_samples=0,
    )
    path = folder / "mix.json"
    mixlib.save_plan(mixlib.build_plan(config), path)
    return str(path)


@pytest.mark.parametrize(
    "valid", [["wiki"], ["wiki", "shakespeare"], None], ids=["own-blend-1", "own-blend-2", "one-prefix"]
)
def test_each_source_of_the_valid_split_is_reported(byte_data, tmp_path, cli_env, valid):
    sections = {
        "training": {"train_steps": 2},
        "schedule": {"warmup_steps": 0, "total_steps": 2},
        "checkpoint": {"save_every": 0, "save_final": False},
        "eval": {"every": 2, "iters": 2, "per_source": True},
    }
    if valid is None:  # one prefix, split Megatron-style: a blend of one source
        config = write_config(tmp_path, byte_data["mix"], **sections)
        text = config.read_text().replace(f"mix: {byte_data['mix']}", "mix: null")
        config.write_text(text)
        extra = ["--set", f"data.prefixes=[{byte_data['prefixes'][1]}]", "--set", "data.seq_length=64",
                 "--set", "data.split=90,10,0"]  # fmt: skip
        names = ["wiki_text_document"]
    else:
        config = write_config(tmp_path, own_valid_blend(byte_data, tmp_path, valid), **sections)
        extra, names = [], [f"{name}_text_document" for name in valid]
    out = llm_train([config, "--deepspeed", DS, "-o", tmp_path / "run", *extra], cli_env, timeout=300)
    assert out.returncode == 0, out.stderr
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    (record,) = [r for r in records if r["kind"] == "eval"]
    tokens = {name: record[f"{name}/tokens"] for name in names}
    assert sum(tokens.values()) == record["eval_tokens"] and min(tokens.values()) > 0, record
    mean = sum(record[f"{name}/loss"] * tokens[name] for name in names) / record["eval_tokens"]
    # per-source means re-weighted in float64 against the fp32 sum of the same token losses
    assert mean == pytest.approx(record["eval_loss"], rel=1e-5)


def test_a_task_whose_samples_are_no_source_is_refused_in_one_line(tmp_path, cli_env):
    from tests.train.tasks.test_sft import make_sft_prefix, sft_config

    prefix = make_sft_prefix(tmp_path, "chat", pack=False, n=32)
    import yaml

    raw = sft_config(prefix, eval__every=2, eval__per_source=True).to_dict()
    config = tmp_path / "sft.yaml"
    config.write_text(yaml.safe_dump(raw))
    for dry in ([], ["--dry-run"]):
        out = llm_train([config, "--deepspeed", DS, "-o", tmp_path / "run", *dry], cli_env, timeout=120)
        assert out.returncode == 2, out.stderr
        (line,) = out.stderr.strip().splitlines()
        assert "eval.per_source: task sft's samples are not a source's text" in line
        assert not (tmp_path / "run").exists()
