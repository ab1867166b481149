"""model.init_from: llm-train starts from a Hugging Face folder written by transformers, at the same loss."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.train.conftest import tiny_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.numerics
def test_init_from_hf_folder_starts_at_the_same_loss(byte_data, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from llmtools.data.dataset import BlendedGPTDataset
    from llmtools.model.hf import to_hf_config
    from llmtools.train.deepspeed_config import load_ds_config
    from llmtools.train.loop import RunOptions, train
    from llmtools.train.plan import resolve_model_config

    shape = resolve_model_config(tiny_config(byte_data["mix"]))
    torch.manual_seed(7)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**to_hf_config(shape))).eval()
    hf.save_pretrained(tmp_path / "hf")

    # The first global batch of the run (8 samples, the same order llm-train reads them in).
    batch = torch.from_numpy(BlendedGPTDataset.from_mix(byte_data["mix"]).batch(np.arange(8))).long()
    with torch.no_grad():
        logits = hf(input_ids=batch[:, :-1]).logits
        expected = torch.nn.functional.cross_entropy(
            logits.float().flatten(0, 1), batch[:, 1:].flatten()
        ).item()

    cfg = tiny_config(byte_data["mix"], training__train_steps=2)
    cfg.model.preset, cfg.model.overrides, cfg.model.init_from = None, {}, str(tmp_path / "hf")
    result = train(
        cfg,
        load_ds_config(ROOT / "configs/deepspeed/zero1.json"),
        RunOptions(run_dir=tmp_path / "run", quiet=True),
    )
    # the first fp32 loss of the same weights computed by another run's kernels and order: ~1e-6 of ~5; 1e-5 holds it
    assert result.losses[0] == pytest.approx(expected, abs=1e-5)
    # A fresh model would start near ln(320) = 5.77 from a different draw; this one starts where HF's is.
    assert result.losses[1] < result.losses[0]


def test_init_from_with_a_different_shape_is_refused(byte_data, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from llmtools.errors import InputError
    from llmtools.model.hf import to_hf_config
    from llmtools.train.deepspeed_config import load_ds_config
    from llmtools.train.loop import RunOptions, train
    from llmtools.train.plan import resolve_model_config

    shape = resolve_model_config(tiny_config(byte_data["mix"], model__num_hidden_layers=1))
    torch.manual_seed(7)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**to_hf_config(shape))).save_pretrained(
        tmp_path / "hf"
    )
    cfg = tiny_config(byte_data["mix"], model__init_from=str(tmp_path / "hf"))  # preset tiny, 2 layers
    with pytest.raises(InputError, match=r"config\.json\[num_hidden_layers\]: 1 but the model config has 2"):
        train(
            cfg, load_ds_config(ROOT / "configs/deepspeed/zero1.json"), RunOptions(run_dir=tmp_path / "run")
        )
