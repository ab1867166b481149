"""`task: dpo` through the real training loop: a tiny model learns a preference rule, the reference pass is
stored and tied to its weights and data, resume is bitwise exact (ZeRO-2 and ZeRO-3, full and LoRA), and a
DPO-trained checkpoint exports to a folder transformers loads.

The data is written by `llm-prep pref` (library entry point, byte tokenizer, ChatML) over pairs made here: a
random word and an instruction; the chosen answer always follows the rule "answer in capitals", the rejected
one never does.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from llmtools.errors import InputError
from tests.numerics import logits_atol
from tests.ports import free_port
from tests.train.conftest import TINY

ROOT = Path(__file__).resolve().parents[3]
SEQ = 96


def write_pairs(path: Path, n: int = 96, seed: int = 0) -> Path:
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        word = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(3, 6)))
        op = rng.choice(["repeat", "reverse", "say"])
        answer = {"repeat": f"{word} {word}", "reverse": word[::-1], "say": word}[op]
        lines.append(json.dumps({"prompt": f"{op}: {word}", "chosen": answer.upper(), "rejected": answer}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def make_pref_prefix(folder: Path, name: str = "pairs", n: int = 96, seed: int = 0) -> str:
    from llmtools.prep.pref import PrefConfig, build_pref

    src = write_pairs(folder / f"{name}.jsonl", n=n, seed=seed)
    prefix = str(folder / name)
    build_pref(PrefConfig(inputs=[str(src)], tokenizer="byte", output_prefix=prefix, chat_template="chatml"))
    return prefix


def dpo_config(prefix: str, **overrides):
    """A small `task: dpo` train config over an llm-prep pref prefix (overrides: section__key=value)."""
    from llmtools.train.config import from_dict

    raw = {
        "task": "dpo",
        "model": {"preset": "tiny", **TINY},
        "data": {"prefixes": [prefix], "seq_length": SEQ},
        "training": {"micro_batch_size": 4, "global_batch_size": 8, "train_steps": 24, "seed": 1234},
        "optimizer": {"lr": 1e-3, "weight_decay": 0.0},
        "schedule": {"kind": "constant", "warmup_steps": 0},
        "logging": {"log_every": 1},
        "checkpoint": {"save_every": 12, "save_final": True},
        "dpo": {"beta": 0.1},
    }
    for dotted, value in overrides.items():
        section, key = dotted.split("__")
        if section == "top":
            raw[key] = value
        else:
            raw.setdefault(section, {})[key] = value
    return from_dict(raw, "test-dpo.yaml")


def ds(stage: int) -> dict:
    from llmtools.train.deepspeed_config import load_ds_config

    return load_ds_config(ROOT / f"configs/deepspeed/zero{stage}.json")


def run(prefix: str, run_dir: Path, stage: int = 2, resume: str | None = None, **overrides):
    from llmtools.train.loop import RunOptions, train

    return train(
        dpo_config(prefix, **overrides), ds(stage), RunOptions(run_dir=run_dir, quiet=True, resume=resume)
    )


def records(run_dir: Path, kind: str = "train") -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


@pytest.fixture(scope="module")
def pref(tmp_path_factory):
    pytest.importorskip("deepspeed")
    return make_pref_prefix(tmp_path_factory.mktemp("pref"))


@pytest.fixture(scope="module")
def learned(pref, tmp_path_factory):
    """24 steps of full DPO under ZeRO-2 with checkpoints at 12 and 24."""
    run_dir = tmp_path_factory.mktemp("learned") / "run"
    return run_dir, run(pref, run_dir)


def test_the_reward_learns_the_preference_rule(learned):
    run_dir, result = learned
    rows = records(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 25))
    accuracy = [r["rewards/accuracies"] for r in rows]
    margins = [r["rewards/margins"] for r in rows]
    # step 1 is measured with the starting weights: the policy is its reference, every reward is 0
    assert result.losses[0] == pytest.approx(np.log(2), abs=1e-6) and margins[0] == pytest.approx(0, abs=1e-6)
    assert accuracy[0] == 0
    assert np.mean(accuracy[-4:]) > 0.9, accuracy
    assert margins[-1] > margins[12] > margins[4] > 0, margins
    assert np.mean(result.losses[-4:]) < 0.5 * np.log(2), result.losses
    for r in rows:  # TRL's names, beside the trainer's own fields
        assert r["rewards/margins"] == pytest.approx(r["rewards/chosen"] - r["rewards/rejected"], abs=1e-5)
        assert r["logps/chosen"] < 0 and r["logps/rejected"] < 0
    assert rows[-1]["rewards/chosen"] > 0 > rows[-1]["rewards/rejected"]
    # the pairs' two sequences count as tokens: 8 pairs x 2 x 64
    assert rows[0]["consumed_tokens"] == 8 * 2 * SEQ


def test_metrics_validate_and_reach_llm_log(learned, capsys, monkeypatch, tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    from tests.conftest import run_cli_inproc

    run_dir, _ = learned
    schema = json.loads((ROOT / "schemas" / "metrics.schema.json").read_text())
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        jsonschema.validate(json.loads(line), schema)
    proc = run_cli_inproc(capsys, monkeypatch, "log", "summary", run_dir / "metrics.jsonl", "--json")
    assert proc.returncode == 0, proc.stderr
    rewards = json.loads(proc.stdout)[0]["rewards"]
    assert rewards["rewards/accuracies"]["first"] == 0 and rewards["rewards/accuracies"]["last"] > 0.9
    proc = run_cli_inproc(capsys, monkeypatch, "log", "summary", run_dir / "metrics.jsonl")
    assert "reward acc / margin  0 -> " in proc.stdout
    from llmtools.logs.tb import TbConfig, convert
    from tests.logs.helpers import scalars

    convert([str(run_dir / "metrics.jsonl")], TbConfig(tmp_path, run="dpo"))
    tags = scalars(tmp_path / "dpo")
    for name in (
        "rewards/chosen",
        "rewards/rejected",
        "rewards/accuracies",
        "rewards/margins",
        "logps/chosen",
    ):
        assert sorted(tags[f"train/{name}"]) == list(range(1, 25)), name


def test_the_reference_is_stored_in_the_run_and_tied_to_weights_and_data(learned, pref, tmp_path):
    from llmtools.formats.reference import read_reference

    run_dir, _ = learned
    meta = json.loads((run_dir / "reference" / "reference.json").read_text())
    identity = meta["identity"]
    assert identity["data"]["pairs"] == 96 and identity["seq_length"] == SEQ
    assert sorted(identity["data"]["files"]) == sorted(
        f"pairs_{k}_document.{e}" for k in ("chosen_input_ids", "chosen_loss_mask", "rejected_input_ids", "rejected_loss_mask") for e in ("bin", "idx")
    )  # fmt: skip
    logps = read_reference(run_dir / "reference", identity)
    assert logps.shape == (96, 2) and (logps < 0).all() and (logps[:, 0] != logps[:, 1]).any()
    # Another run may reuse it (a sweep over beta) ...
    reuse = run(
        pref,
        tmp_path / "beta",
        training__train_steps=1,
        dpo__beta=0.5,
        dpo__reference=str(run_dir / "reference"),
    )
    assert reuse.steps == 1 and not (tmp_path / "beta" / "reference").exists()
    # ... but not from other starting weights (another seed), nor over other data
    with pytest.raises(InputError, match=r"computed from other starting weights \(sha256 [0-9a-f]{12} there"):
        run(
            pref,
            tmp_path / "seed",
            training__train_steps=1,
            training__seed=7,
            dpo__reference=str(run_dir / "reference"),
        )
    other = make_pref_prefix(tmp_path, "other", n=96, seed=1)
    with pytest.raises(InputError, match=r"computed from other data \(.*other_chosen_input_ids_document.bin"):
        run(other, tmp_path / "data", training__train_steps=1, dpo__reference=str(run_dir / "reference"))
    # the run's own reference, over data the run no longer reads (a resume with --reset-data), is computed again
    from llmtools.train.loop import RunOptions, train

    reset = tmp_path / "reset"
    run(pref, reset, training__train_steps=1, checkpoint__save_every=1)
    with pytest.raises(InputError, match="pass --reset-data"):  # the trainer's own guard on changed data
        run(other, reset, resume="auto", training__train_steps=2)
    cfg = dpo_config(other, training__train_steps=2, checkpoint__save_every=1)
    train(cfg, ds(2), RunOptions(run_dir=reset, resume="auto", reset_data=True, quiet=True))
    assert (
        json.loads((reset / "reference" / "reference.json").read_text())["identity"]["data"]["prefix"]
        == other
    )
    # ... but not one from other starting weights (model.init_from changed): the run was trained against
    # it; the resume policy refuses the change before anything is computed or written
    with pytest.raises(InputError, match=r"model.init_from\]: .*reference was computed from the weights it"):
        run(other, reset, resume="auto", training__train_steps=3, model__init_from=str(run_dir))
    with pytest.raises(InputError, match="dpo.reference: .*holds no stored reference"):
        run(pref, tmp_path / "none", training__train_steps=1, dpo__reference=str(tmp_path))


def _weights(checkpoint: Path) -> dict:
    """Every trained and frozen tensor of a checkpoint (LoRA: the base and the adapters, unmerged)."""
    from llmtools.ckpt.lora import checkpoint_lora
    from llmtools.ckpt.reader import CheckpointReader

    found = checkpoint_lora(checkpoint)
    if found is not None:
        return found[1]
    with CheckpointReader(checkpoint) as reader:
        return {name: source.load() for name, source in reader.sources().items()}


def _resume_exactly(
    pref, full_dir: Path, full, tmp_path: Path, at: int, stage: int, keep_reference: bool, **kw
):
    import torch

    run_dir = tmp_path / "resumed"
    (run_dir / "checkpoints").mkdir(parents=True)
    name = f"step_{at:08d}"
    shutil.copytree(full_dir / "checkpoints" / name, run_dir / "checkpoints" / name)
    if keep_reference:
        shutil.copytree(full_dir / "reference", run_dir / "reference")
    resumed = run(pref, run_dir, stage=stage, resume="auto", **kw)
    assert resumed.losses == full.losses[at:]
    # recomputed before the checkpoint loaded, the reference is the first run's bit for bit
    a, b = (np.load(d / "reference" / "logps.npy") for d in (full_dir, run_dir))
    assert a.tobytes() == b.tobytes()
    theirs, ours = _weights(full.checkpoint), _weights(resumed.checkpoint)
    assert theirs.keys() == ours.keys() and all(torch.equal(theirs[k], ours[k]) for k in theirs)
    for r1, r2 in zip(records(full_dir)[at:], records(run_dir), strict=True):
        assert {k: v for k, v in r1.items() if "/" in k} == {k: v for k, v in r2.items() if "/" in k}


def test_zero2_full_resume_is_exact(learned, pref, tmp_path):
    run_dir, full = learned
    _resume_exactly(pref, run_dir, full, tmp_path, at=12, stage=2, keep_reference=True)


LORA = {"lora__r": 4, "lora__alpha": 8.0, "lora__target_modules": ["q_proj", "v_proj", "down_proj"]}
SHORT = {"training__train_steps": 6, "checkpoint__save_every": 3}


@pytest.mark.parametrize(
    "stage,lora,keep_reference",
    [(3, False, False), (2, True, False), (3, True, True)],
    ids=["zero3-full", "zero2-lora", "zero3-lora"],
)
def test_resume_is_exact(pref, tmp_path, stage, lora, keep_reference):
    settings = {**SHORT, **(LORA if lora else {})}
    full_dir = tmp_path / "full"
    full = run(pref, full_dir, stage=stage, **settings)
    assert full.steps == 6 and full.losses[-1] < full.losses[0]
    _resume_exactly(
        pref, full_dir, full, tmp_path, at=3, stage=stage, keep_reference=keep_reference, **settings
    )


def test_a_checkpoint_from_other_starting_weights_is_refused():
    from llmtools.train.tasks import make_task

    task = make_task(dpo_config("unused"))
    task.reference_weights = "a" * 64
    task.load_state_dict({"reference_weights": "a" * 64})
    with pytest.raises(
        InputError, match="trained against a reference computed from starting weights sha256 bbbb"
    ):
        task.load_state_dict({"reference_weights": "b" * 64})


@pytest.mark.numerics
def test_with_lora_the_reference_is_the_base_with_adapters_off(pref):
    torch = pytest.importorskip("torch")
    from llmtools.model import LlamaForCausalLM
    from llmtools.model.lora import LoraSection, adapters_disabled, apply_lora
    from llmtools.train.plan import resolve_model_config
    from llmtools.train.tasks.base import RunContext
    from llmtools.train.tasks.dpo import PrefTrainData
    from llmtools.train.tasks.reference import compute_reference_logps, weights_sha256

    torch.manual_seed(0)
    base = LlamaForCausalLM(resolve_model_config(dpo_config(pref)))
    data = PrefTrainData(pref, SEQ, 16)
    ctx = RunContext(
        run_dir=Path("."), rank=0, world_size=1, device="cpu", micro_batch_size=5, log=lambda _: None
    )
    want = compute_reference_logps(base, data, ctx, lora=False)
    base_digest = weights_sha256(base, lora=False)

    model = base
    apply_lora(model, LoraSection(r=4, alpha=8.0, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("lora_B"):
                param.normal_()  # adapters that change the output
    assert weights_sha256(model, lora=True) == base_digest  # the adapters are not part of the reference
    assert np.array_equal(compute_reference_logps(model, data, ctx, lora=True), want)
    # the opposite claim: without LoRA the log-probs differ by far more than allclose's defaults
    assert not np.allclose(compute_reference_logps(model, data, ctx, lora=False), want)
    with adapters_disabled(model) as switched:
        assert switched == 2 * TINY["num_hidden_layers"]
    assert all(m.adapter_enabled for m in model.modules() if hasattr(m, "adapter_enabled"))


@pytest.mark.numerics
def test_a_dpo_trained_checkpoint_exports_to_transformers(learned, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from llmtools.ckpt.convert import ConvertConfig, convert
    from llmtools.ckpt.lora import checkpoint_weights
    from llmtools.model import LlamaForCausalLM
    from llmtools.train.plan import resolve_model_config

    run_dir, result = learned
    out = convert(
        ConvertConfig(checkpoint=run_dir, to="hf", output=tmp_path / "hf")
    )  # llm-ckpt convert's library call
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ours = LlamaForCausalLM(resolve_model_config(dpo_config("unused")))
    ours.load_state_dict(checkpoint_weights(result.checkpoint))
    ids = torch.randint(0, 257, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        # fp32 decoder twice, in another op order: logits_atol's rounding model (tests/numerics.py)
        expected = ours.eval()(ids)
        torch.testing.assert_close(
            hf(input_ids=ids).logits, expected, atol=logits_atol(expected, hf.config), rtol=0
        )


def test_llm_train_runs_the_dpo_config_and_a_resume_reuses_its_reference(
    pref, python, cli_env, capsys, tmp_path
):
    from llmtools.train.config import load_train_config
    from llmtools.train.loop import RunOptions, train

    run_dir = tmp_path / "run"
    settings = [f"data.prefixes=[{pref}]", f"data.seq_length={SEQ}", "model.init_from=null", "model.preset=tiny",
                f"model.vocab_size={TINY['vocab_size']}", "checkpoint.save_every=1",
                "schedule.warmup_steps=0"]  # fmt: skip
    proc = subprocess.run(
        [python, "-m", "llmtools.cli.train", str(ROOT / "configs/train/tiny-dpo.yaml"),
         "--deepspeed", str(ROOT / "configs/deepspeed/zero2.json"), "-o", str(run_dir),
         *[f"--set={s}" for s in [*settings, "training.train_steps=1"]]],
        capture_output=True, text=True, env=cli_env, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (
        f"reference log-probs: one forward pass over 96 pairs with the starting weights -> {run_dir}/reference"
        in proc.stderr
    )
    assert "task: dpo" in (run_dir / "config.yaml").read_text()
    capsys.readouterr()
    config = load_train_config(ROOT / "configs/train/tiny-dpo.yaml", [*settings, "training.train_steps=2"])
    train(config, ds(2), RunOptions(run_dir=run_dir, resume="auto"))
    err = capsys.readouterr().err
    assert f"reference log-probs of 96 pairs from {run_dir}/reference (same starting weights and data)" in err
    assert [r["step"] for r in records(run_dir)] == [1, 2]
    assert all(r["rewards/accuracies"] is not None for r in records(run_dir))
    # the step line shows TRL's reward accuracy and margin: the values of the step's record
    for out, record in zip((proc.stderr, err), records(run_dir), strict=True):
        shown = f"| reward acc {record['rewards/accuracies']:.4f} | margin {record['rewards/margins']:.4f} |"
        (line,) = [x for x in out.splitlines() if x.startswith(f"step {record['step']:>6}/")]
        assert shown in line, line


@pytest.mark.numerics
def test_two_ranks_share_one_reference_pass(pref, learned, cli_env, python, tmp_path):
    """ZeRO-3 over 2 processes: each rank computes half the pairs, every rank gets them all, in pair order."""

    import yaml

    port = free_port()
    config = tmp_path / "dpo.yaml"
    config.write_text(
        yaml.safe_dump(dpo_config(pref, training__train_steps=2, checkpoint__save_every=0).to_dict())
    )
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [python, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
         "-m", "llmtools.cli.train", str(config), "--deepspeed", str(ROOT / "configs/deepspeed/zero3.json"),
         "-o", str(run_dir)],
        capture_output=True, text=True, env={**cli_env, "OMP_NUM_THREADS": "1"}, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = records(run_dir)
    # at step 1 the policy is its reference on every pair of every rank: rewards 0, loss log 2
    assert rows[0]["loss"] == pytest.approx(np.log(2), abs=1e-5) and rows[0][
        "rewards/margins"
    ] == pytest.approx(0, abs=1e-5)
    one_rank, _ = learned  # the same starting weights and data, one process, ZeRO-2
    ours, theirs = (
        json.loads((d / "reference" / "reference.json").read_text())["identity"] for d in (run_dir, one_rank)
    )
    assert ours == theirs  # the ZeRO-3 partitions hash as the whole weights do
    np.testing.assert_allclose(
        np.load(run_dir / "reference" / "logps.npy"), np.load(one_rank / "reference" / "logps.npy"), rtol=1e-5
    )


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"dpo__beta": 0}, "test-dpo.yaml: dpo.beta: must be a finite number > 0, got 0.0"),
        ({"dpo__beta": float("inf")}, "dpo.beta: expected a finite number, got inf"),
        (
            {"dpo__loss": "sigmoidd"},
            "dpo.loss: 'sigmoidd' is not one of sigmoid, ipo, hinge (did you mean 'sigmoid'?)",
        ),
        ({"dpo__label_smoothing": 0.5}, "dpo.label_smoothing: must be in [0, 0.5), got 0.5"),
        (
            {"dpo__loss": "ipo", "dpo__label_smoothing": 0.1},
            "dpo.label_smoothing: only with dpo.loss: sigmoid",
        ),
        ({"dpo__bet": 0.1}, "unknown key dpo.bet (did you mean 'dpo.beta'?)"),
        ({"top__task": "sft"}, "test-dpo.yaml: dpo: only with task: dpo (this config has task: sft)"),
    ],
)
def test_the_dpo_section_is_checked_with_clear_messages(overrides, message):
    with pytest.raises(InputError) as error:
        dpo_config("unused", **overrides)
    assert message in str(error.value)


def test_data_problems_fail_before_compute(pref, tmp_path):
    from llmtools.train.plan import make_plan

    with pytest.raises(InputError, match="task dpo reads one prefix written by llm-prep pref"):
        make_plan(dpo_config(pref, data__prefixes=[pref, pref]), ds(2))
    with pytest.raises(
        InputError,
        match=r"nothing_chosen_input_ids_document.bin/.idx: not found \(write it with llm-prep pref",
    ):
        make_plan(dpo_config(str(tmp_path / "nothing")), ds(2))
    with pytest.raises(
        InputError,
        match=r"96 of 96 pairs .* have no answer token within data.seq_length=32: their prompt fills it",
    ):
        make_plan(dpo_config(pref, data__seq_length=32), ds(2))
    plan = make_plan(
        dpo_config(pref, training__train_tokens=8 * 2 * SEQ * 3, training__train_steps=None), ds(2)
    )
    assert plan.steps == 3 and plan.tokens_per_step == 8 * 2 * SEQ  # a pair's two sequences are counted


def test_a_resume_may_change_beta_and_says_so(pref, tmp_path):
    run_dir = tmp_path / "run"
    run(pref, run_dir, training__train_steps=1, checkpoint__save_every=1)
    assert (
        "dpo:\n  beta: 0.1\n  loss: sigmoid" in (run_dir / "config.yaml").read_text()
    )  # the defaults, resolved
    resumed = run(pref, run_dir, resume="auto", training__train_steps=2, dpo__beta=0.3)
    assert resumed.steps == 2
    changes = {
        e["key"]: (e["old"], e["new"]) for e in records(run_dir, "event") if e["event"] == "config_change"
    }
    assert changes["dpo.beta"] == (0.1, 0.3)
