"""The one scorer (``llm-ckpt eval``'s lm-eval model and the in-loop ``eval.tasks``) against lm-evaluation-
harness's own ``hf`` model, request by request, over generated multiple-choice shapes: empty contexts,
contexts of or ending in whitespace, one-token choices, unicode. Where lm-eval scores a request, ours gives
the same log-likelihood and greediness (and the in-loop task the same acc and acc_norm); where lm-eval
refuses one, ours refuses it with an InputError."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import shared

pytest.importorskip("lm_eval")
transformers = pytest.importorskip("transformers")

WORDS = ["the", "a", "cat", "é", "中文", "😀", "sat", "king", "\n", "1", "of", "Über", "dog", ""]


def _folder(root, bos: bool):
    """A random tiny Llama with GPT-2's vocabulary and a tokenizer folder beside it (GPT-2's, or GPT-2's
    with a post-processor that puts <|endoftext|> before every text, as Llama's tokenizers add BOS)."""
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(shared("tokenizers/gpt2") / "tokenizer.json"))
    if bos:
        tok.post_processor = tokenizers.processors.TemplateProcessing(
            single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 50256)]
        )
    config = transformers.LlamaConfig(
        vocab_size=50257, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False,
    )  # fmt: skip
    transformers.set_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(root)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
    )
    fast.save_pretrained(root)
    return root


@pytest.fixture(scope="module", params=[False, True], ids=["gpt2", "gpt2-bos"])
def pair(request, tmp_path_factory):
    from lm_eval.models.huggingface import HFLM

    from llmtools.ckpt.harness import make_lm
    from llmtools.tokenize.loader import load_tokenizer

    root = _folder(tmp_path_factory.mktemp("hf"), request.param)
    theirs = HFLM(pretrained=str(root), device="cpu", dtype="float32", batch_size=4)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(root)).eval().float()
    tokenizer = load_tokenizer(str(root), backend="tokenizers")
    ours = make_lm(model, tokenizer, int(model.config.max_position_embeddings) - 1, 4)
    return ours, theirs, model, tokenizer


text = st.lists(st.sampled_from(WORDS), max_size=4).map(" ".join)
spaces = st.sampled_from(["", " ", "  ", "\n", " \n"])
contexts = st.one_of(st.just(""), spaces, st.tuples(text, spaces).map("".join), st.text(max_size=8))
choice = st.one_of(
    st.sampled_from(["a", " a", "the", " the", "é", " 中文", "😀", "\n", " ", "Über"]),
    st.tuples(spaces, text).map("".join).filter(bool),
    st.text(min_size=1, max_size=6),
)


def _request(context, continuation):
    from lm_eval.api.instance import Instance

    return Instance("loglikelihood", doc={}, arguments=(context, continuation), idx=0)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(context=contexts, choices=st.lists(choice, min_size=2, max_size=4))
def test_each_request_scores_as_lm_eval_hf_or_both_refuse(pair, tmp_path, context, choices):
    from llmtools.errors import InputError
    from llmtools.train.downstream import evaluate_tasks, load_tasks

    ours, theirs, model, tokenizer = pair
    scored = []
    for continuation in choices:
        try:
            want = theirs.loglikelihood([_request(context, continuation)], disable_tqdm=True)[0]
        except AssertionError:  # lm-eval's hf model refuses: nothing before the choice, or no choice tokens
            with pytest.raises(InputError):
                ours.loglikelihood([_request(context, continuation)])
            continue
        got = ours.loglikelihood([_request(context, continuation)])[0]
        # the same fp32 model in two batchings (theirs pads, ours packs): sums of a few fp32 log-softmaxes
        assert got[0] == pytest.approx(want[0], abs=1e-4), (context, continuation, got, want)
        assert got[1] == want[1], (context, continuation, got, want)
        scored.append(want[0])
    if len(scored) < len(choices):
        return
    # the in-loop task on the same example: lm-eval's choice by log-likelihood, and per character
    task = tmp_path / "shape.jsonl"
    task.write_text(json.dumps({"context": context, "choices": choices, "gold": 0}) + "\n")
    loaded = load_tasks([str(task)], tokenizer, None, int(model.config.max_position_embeddings) - 1)
    record = evaluate_tasks(lambda ids: model(ids).logits, loaded, "cpu", 0, 1, 4)
    norm = [ll / len(c) for ll, c in zip(scored, choices, strict=True)]
    for metric, values in (("acc", scored), ("acc_norm", norm)):
        top = sorted(values)
        if top[-1] - top[-2] > 1e-3:  # a clear winner (a near tie may fall either way in float32)
            assert record[f"shape/{metric}"] == float(values.index(top[-1]) == 0), (metric, values, record)
