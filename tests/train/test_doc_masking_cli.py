"""``llm-train`` with Megatron's document masking (data.reset_position_ids / reset_attention_mask /
eod_mask_loss): the real command trains; data that records no EOD id is refused in one line."""

from __future__ import annotations

import json

from tests.train.test_cli import DS, llm_train, losses, write_config

FLAGS = {"reset_position_ids": True, "reset_attention_mask": True, "eod_mask_loss": True}


def test_document_masking_trains_through_the_command(byte_data, tmp_path, cli_env):
    config = write_config(tmp_path, byte_data["mix"], data=FLAGS, training={"train_steps": 3})
    run_dir = tmp_path / "run"
    out = llm_train([config, "--deepspeed", DS, "-o", run_dir], cli_env)
    assert out.returncode == 0, out.stderr
    assert len(losses(run_dir)) == 3
    assert "reset_attention_mask: true" in (run_dir / "config.yaml").read_text()


def test_data_without_an_eod_id_is_refused(byte_data, tmp_path, cli_env):
    from llmtools.data import mix as mixlib

    prefix = tmp_path / "noeod_text_document"
    for suffix in (".bin", ".idx"):
        (tmp_path / f"noeod_text_document{suffix}").write_bytes(
            (byte_data["folder"] / f"wiki_text_document{suffix}").read_bytes()
        )
    sidecar = json.loads((byte_data["folder"] / "wiki_text_document.json").read_text())
    del sidecar["tokenizer"]["eod_id"]
    (tmp_path / "noeod_text_document.json").write_text(json.dumps(sidecar))
    plan = mixlib.MixConfig(
        blend=mixlib.Blend([str(prefix)], [1.0]), seq_length=64, num_samples=200, valid_samples=0,
        test_samples=0, split="100,0,0",
    )  # fmt: skip
    mix_path = tmp_path / "mix.json"
    mixlib.save_plan(mixlib.build_plan(plan), mix_path)
    config = write_config(tmp_path, str(mix_path), data={"reset_attention_mask": True})
    out = llm_train([config, "--deepspeed", DS, "-o", tmp_path / "run"], cli_env)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "records no tokenizer eod_id" in lines[0], out.stderr
    assert not (tmp_path / "run").exists()  # refused before anything is written
