"""The DPO loss against TRL's own DPOTrainer, and against the papers' formulas by hand.

One set-up serves every comparison: a byte-level BPE tokenizer folder with a ChatML template, our tiny model and the
same weights in a transformers ``LlamaForCausalLM``, four conversational preference pairs. TRL's
``DPOTrainer`` (``precompute_ref_log_probs=True``) tokenizes the pairs and computes the reference log-probs
itself; ``llm-prep pref`` and our reference pass do the same on our side. Then:

* the token ids and answer masks are TRL's (prompt_ids + chosen_ids, completion mask);
* our reference pass gives TRL's precomputed reference log-probs;
* on the same batch and the same reference log-probs, our loss, its gradient on every parameter and the six
  metrics equal TRL's, for the sigmoid, ipo and hinge losses and two betas.

Label smoothing (conservative DPO) left TRL's sigmoid loss in v0.29, so it is checked by hand, with the
plain formulas (Rafailov et al. 2023 eq. 7; Mitchell 2023; Azar et al. 2023 eq. 17; SLiC's hinge).
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from llmtools.prep.chat_template import CHATML
from tests.conftest import shared

torch = pytest.importorskip("torch")

USER = {"role": "user", "content": "Which is larger, 7 or 12?"}
PAIRS = [
    {
        "prompt": [{"role": "system", "content": "Answer briefly."}, USER],
        "chosen": [{"role": "assistant", "content": "12 is larger."}],
        "rejected": [
            {"role": "assistant", "content": "7, because it comes first in the alphabet of numbers."}
        ],
    },
    {
        "prompt": [{"role": "user", "content": "Say hello in French."}],
        "chosen": [{"role": "assistant", "content": "Bonjour !"}],
        "rejected": [{"role": "assistant", "content": "Hola."}],
    },
    {
        "prompt": [USER, {"role": "assistant", "content": "12."}, {"role": "user", "content": "Why?"}],
        "chosen": [{"role": "assistant", "content": "Twelve is seven plus five."}],
        "rejected": [{"role": "assistant", "content": "It just is."}],
    },
    {
        "prompt": [{"role": "user", "content": "Spell cat backwards."}],
        "chosen": [{"role": "assistant", "content": "tac"}],
        "rejected": [{"role": "assistant", "content": "cta, café ☕"}],
    },
]


def small_bpe():
    """A byte-level BPE of 400 ids trained on real text (a small vocabulary keeps the models fast)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    text = shared("tinyshakespeare/input.txt").read_text(encoding="utf-8")[:50_000]
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator([text], trainer=trainer)
    return bpe


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Our model, data and reference; TRL's trainer over the same weights and pairs."""
    transformers = pytest.importorskip("transformers")
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("trl")
    folder = tmp_path_factory.mktemp("dpo-trl")
    os.environ["HF_DATASETS_CACHE"] = str(folder / "hf-cache")  # TRL caches its reference pass there
    from trl import DPOConfig, DPOTrainer

    from llmtools.model.config import ModelConfig
    from llmtools.model.hf import save_hf_folder
    from llmtools.model.llama import LlamaForCausalLM
    from llmtools.prep.pref import PrefConfig, build_pref
    from llmtools.train.tasks.dpo import PrefTrainData
    from llmtools.train.tasks.reference import compute_reference_logps

    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=small_bpe(), eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHATML
    tok.save_pretrained(folder / "tok")

    config = ModelConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    ours = LlamaForCausalLM(config)
    save_hf_folder(ours, config, folder / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder / "hf")

    (folder / "pairs.jsonl").write_text(
        "".join(__import__("json").dumps(p) + "\n" for p in PAIRS), encoding="utf-8"
    )
    prefix = str(folder / "pref")
    build_pref(
        PrefConfig(inputs=[str(folder / "pairs.jsonl")], tokenizer=str(folder / "tok"), output_prefix=prefix)
    )
    data = PrefTrainData(prefix, seq_length=128, num_samples=len(PAIRS))
    from llmtools.train.tasks.base import RunContext

    run = RunContext(
        run_dir=folder, rank=0, world_size=1, device="cpu", micro_batch_size=3, log=lambda _: None
    )
    reference = compute_reference_logps(ours, data, run, lora=False)

    args = DPOConfig(
        output_dir=str(folder / "trl"),
        precompute_ref_log_probs=True,
        per_device_train_batch_size=len(PAIRS),
        max_length=None,
        report_to=[],
        use_cpu=True,
        bf16=False,  # TRL defaults to bf16 autocast; ours runs fp32 here
        beta=0.1,
    )
    trainer = DPOTrainer(
        model=hf, args=args, processing_class=tok, train_dataset=datasets.Dataset.from_list(PAIRS)
    )
    return {
        "ours": ours,
        "hf": hf,
        "data": data,
        "reference": reference,
        "trainer": trainer,
        "prefix": prefix,
        "folder": folder,
    }


def test_pairs_are_tokenized_as_trl_tokenizes_them(world):
    trl_rows = world["trainer"].train_dataset
    dataset = world["data"].dataset
    for j in range(len(PAIRS)):
        row = trl_rows[j]
        for side, answer in ((dataset.chosen, row["chosen_ids"]), (dataset.rejected, row["rejected_ids"])):
            doc = side[j]
            assert doc["input_ids"].tolist() == row["prompt_ids"] + answer
            assert doc["loss_mask"].tolist() == [0] * len(row["prompt_ids"]) + [1] * len(answer)


def test_max_length_truncates_and_drops_as_trl_does(world):
    """--max-length against TRL's own rule: its collator keeps the first max_length tokens (keep_start) and
    its dataset preparation drops a pair whose prompt alone has max_length tokens or more."""
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    from llmtools.data.pref_dataset import PrefDataset
    from llmtools.prep.pref import PrefConfig, build_pref

    rows = [world["trainer"].train_dataset[j] for j in range(len(PAIRS))]
    limit = max(len(r["prompt_ids"]) for r in rows)  # the longest prompt fills it: that pair is dropped
    assert any(
        len(r["prompt_ids"]) + len(r["rejected_ids"]) > limit for r in rows if len(r["prompt_ids"]) < limit
    )
    kept = [r for r in rows if len(r["prompt_ids"]) < limit]
    collated = DataCollatorForPreference(pad_token_id=0, max_length=limit)(kept)
    prefix = str(world["folder"] / "cut")
    result = build_pref(
        PrefConfig(
            inputs=[str(world["folder"] / "pairs.jsonl")], tokenizer=str(world["folder"] / "tok"),
            output_prefix=prefix, max_length=limit,
        )
    )  # fmt: skip
    assert (
        result.pairs == len(kept) == len(PAIRS) - 1 and result.dropped_too_long == 1 and result.truncated >= 1
    )
    ours = PrefDataset(prefix)
    n = len(kept)
    for j in range(n):
        for side, row in ((ours.chosen, j), (ours.rejected, n + j)):
            length = int(collated["attention_mask"][row].sum())
            assert side[j]["input_ids"].tolist() == collated["input_ids"][row, :length].tolist()
            assert side[j]["loss_mask"].tolist() == collated["completion_mask"][row, :length].tolist()


@pytest.mark.numerics
def test_the_reference_pass_gives_trls_precomputed_log_probs(world):
    rows = world["trainer"].train_dataset
    trl = np.stack([np.asarray(rows["ref_chosen_logps"]), np.asarray(rows["ref_rejected_logps"])], axis=1)
    assert world["reference"].shape == (len(PAIRS), 2)
    # fp32 sums of <=64 token log-probs, ~5 each, in another order than TRL: ~4 sqrt(64) 2^-24 ~ 2e-6 relative at worst; rtol 1e-6 holds (same kernels sum them)
    np.testing.assert_allclose(world["reference"], trl, rtol=1e-6, atol=0)


def _dpo_task(prefix: str, **dpo):
    from llmtools.train.config import from_dict
    from llmtools.train.tasks import make_task

    raw = {
        "task": "dpo",
        "data": {"prefixes": [prefix], "seq_length": 128},
        "training": {"train_steps": 1},
        "dpo": dpo,
    }
    return make_task(from_dict(raw, "test-dpo.yaml"))


@pytest.mark.numerics
@pytest.mark.parametrize("loss,beta", [("sigmoid", 0.1), ("sigmoid", 0.5), ("ipo", 0.1), ("hinge", 0.3)])
def test_loss_gradients_and_metrics_equal_trls(world, loss, beta):
    trainer, ours, hf = world["trainer"], world["ours"], world["hf"]
    rows = trainer.train_dataset
    pairs = list(range(len(PAIRS)))
    # The same reference log-probs on both sides: TRL's own, moved away from the policy (at the start the two
    # are equal and every reward is 0 up to rounding, which would leave the accuracy to noise).
    ref = np.stack([np.asarray(rows["ref_chosen_logps"]), np.asarray(rows["ref_rejected_logps"])], axis=1)
    ref = ref + np.array([[0.5, -0.7], [-1.2, 0.3], [0.8, 0.9], [-0.4, -2.0]]) * 4
    inputs = trainer.data_collator([rows[j] for j in pairs])
    inputs["ref_chosen_logps"], inputs["ref_rejected_logps"] = (
        torch.tensor(ref[:, k], dtype=torch.float32) for k in (0, 1)
    )

    trainer.beta, trainer.loss_types, trainer.loss_weights = beta, [loss], [1.0]
    trainer._metrics["train"].clear()
    hf.train()
    hf.zero_grad()
    trl_loss = trainer.compute_loss(hf, inputs)
    trl_loss.backward()

    task = _dpo_task(world["prefix"], loss=loss, beta=beta)
    batch = world["data"].pair_batch(pairs)
    batch["ref_logps"] = ref
    ours.zero_grad()
    out = task.loss(ours, batch, "cpu")
    out.loss.backward()

    assert float(out.loss.detach()) > 0
    # fp32 DPO loss ~0.7 from the log-prob sums above: rtol 1e-5 of it, ~100 ulps
    torch.testing.assert_close(out.loss, trl_loss.detach(), rtol=1e-5, atol=1e-6)
    hf_params = dict(hf.named_parameters())
    for name, param in ours.named_parameters():
        want = hf_params[name].grad
        error = float((param.grad - want).abs().max() / want.abs().max())
        # fp32 gradients through log-softmax and the sums above: 1e-4 of the largest entry (~1000 ulps)
        assert error < 1e-4, f"{name}: gradient differs by {error:.2e} of its largest entry"
    assert task.metric_names == (
        "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen", "logps/rejected"
    )  # fmt: skip
    assert 0 < float(out.metrics["rewards/accuracies"]) < 1  # a batch where the reward picks some pairs right
    for name in task.metric_names:
        # fp32 metrics as TRL computes them, in another order: rel 1e-5 (~100 ulps)
        assert math.isclose(
            float(out.metrics[name]), trainer._metrics["train"][name][-1], rel_tol=1e-5, abs_tol=1e-6
        ), name


def _losses(loss, beta, logps, ref, tokens=None, label_smoothing=0.0):
    from llmtools.train.tasks.dpo import preference_losses

    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    kw = {"chosen_tokens": t(tokens[0]), "rejected_tokens": t(tokens[1])} if tokens else {}
    return preference_losses(
        t(logps[0]),
        t(logps[1]),
        t(ref[0]),
        t(ref[1]),
        beta=beta,
        loss=loss,
        label_smoothing=label_smoothing,
        **kw,
    ).tolist()


def test_losses_by_hand():
    # two pairs: chosen / rejected log-probs under the policy and the reference
    logps, ref = ([-10.0, -4.0], [-14.0, -3.0]), ([-11.0, -5.0], [-12.0, -3.5])
    # h = (chosen - ref_chosen) - (rejected - ref_rejected) = (1 - (-2), 1 - 0.5) = (3, 0.5)
    sig = lambda z: 1 / (1 + math.exp(-z))  # noqa: E731
    beta = 0.2
    # DPO (Rafailov et al. 2023, eq. 7): -log sigmoid(beta h)
    assert _losses("sigmoid", beta, logps, ref) == pytest.approx([-math.log(sig(0.6)), -math.log(sig(0.1))])
    # conservative DPO (Mitchell 2023): -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)
    eps = 0.1
    # float64 closed forms vs fp32 losses of O(1): default rel=1e-6 is ~8 fp32 ulps
    assert _losses("sigmoid", beta, logps, ref, label_smoothing=eps) == pytest.approx(
        [
            -(1 - eps) * math.log(sig(0.6)) - eps * math.log(sig(-0.6)),
            -(1 - eps) * math.log(sig(0.1)) - eps * math.log(sig(-0.1)),
        ]
    )
    # SLiC hinge: max(0, 1 - beta h)
    assert _losses("hinge", beta, logps, ref) == pytest.approx([0.4, 0.9])
    # float64 closed forms vs fp32 losses of O(1): default rel=1e-6 is ~8 fp32 ulps
    assert _losses("hinge", 0.5, logps, ref) == pytest.approx([0.0, 0.75])
    # IPO (Azar et al. 2023, eq. 17) on per-token averages: (h' - 1 / (2 beta))^2
    tokens = ([2.0, 4.0], [4.0, 1.0])
    h = [1 / 2 - (-2) / 4, 1 / 4 - 0.5 / 1]  # (1.0, -0.25)
    assert _losses("ipo", beta, logps, ref, tokens) == pytest.approx([(h[0] - 2.5) ** 2, (h[1] - 2.5) ** 2])
    with pytest.raises(ValueError, match="token counts"):
        _losses("ipo", beta, logps, ref)


@pytest.mark.numerics
def test_at_the_start_the_policy_is_its_reference():
    """With reference = policy, every reward is 0 and the DPO loss is log 2 (the first step's loss)."""
    from llmtools.train.tasks.dpo import preference_losses, preference_metrics

    logps = torch.tensor([-3.0, -7.5, -1.25])
    losses = preference_losses(logps, logps - 1, logps, logps - 1, beta=0.1)
    # fp32 log(2) from logsigmoid(0): allclose's defaults (rtol 1e-5) are ~100 ulps
    assert torch.allclose(losses, torch.full((3,), math.log(2)))
    metrics = preference_metrics(logps, logps - 1, logps, logps - 1, beta=0.1)
    assert float(metrics["rewards/margins"]) == 0 and float(metrics["rewards/accuracies"]) == 0
    # an fp32 mean of three log-probs vs its float64 value: default rel=1e-6 is ~8 fp32 ulps
    assert float(metrics["logps/chosen"]) == pytest.approx(-3.9166667)
