"""Lion and Muon: their maths against the references, llm-train's losses against a bare PyTorch loop with the
same optimizer (ZeRO 0, 1, 2) on the embedded sample corpus, exact resume, two ranks equal to one, and what
is refused before compute.

The bare loop is what one would write by hand: forward, fp32 cross-entropy, backward, step, the same LR
schedule; for Muon it is ``torch.optim.Muon`` on the hidden matrices beside ``torch.optim.AdamW`` on the
rest. Gradient clipping is off in the comparison: DeepSpeed's clip coefficient differs from
``torch.nn.utils.clip_grad_norm_``'s in its last bit, which is the trainer's business, not the optimizer's
(Muon's bf16 Newton-Schulz turns that bit into ~1e-4 after 20 steps).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmtools.errors import InputError
from tests.numerics import bf16_update_loss_atol, movement
from tests.ports import free_port
from tests.train.conftest import tiny_config, write_byte_prefix

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("optim_worker.py")
STEPS = 20
# Lion's usual setting relative to AdamW's: a smaller step, a larger decay.
LION = {"optimizer__lr": 1e-3, "optimizer__weight_decay": 0.5}


@pytest.fixture(scope="module")
def corpus_mix(tmp_path_factory):
    """The embedded sample corpus (stories and arithmetic, as `make pretrain` makes it), byte-tokenized."""
    from llmtools.data import mix as mixlib
    from llmtools.prep.sample_corpus import generate

    folder = tmp_path_factory.mktemp("corpus")
    prefixes = []
    for style in ("stories", "arith"):
        source = folder / f"{style}.jsonl"
        source.write_text("".join(json.dumps({"text": t}) + "\n" for t in generate(style, 400)))
        prefixes.append(str(write_byte_prefix(source, folder / f"{style}_text_document")))
    config = mixlib.MixConfig(
        blend=mixlib.Blend(prefixes, [0.7, 0.3]), seq_length=64, num_samples=400, split="100,0,0"
    )
    mixlib.save_plan(mixlib.build_plan(config), folder / "mix.json")
    return str(folder / "mix.json")


def config_for(mix: str, optimizer: str, **overrides):
    extra = {"training__train_steps": STEPS, **(LION if optimizer == "lion" else {}), **overrides}
    return tiny_config(mix, optimizer__name=optimizer, **extra)


def run_llm_train(cfg, stage: int, run_dir: Path, resume: str | None = None):
    from llmtools.train.deepspeed_config import load_ds_config
    from llmtools.train.loop import RunOptions, train

    ds = load_ds_config(ROOT / f"configs/deepspeed/zero{stage}.json")
    return train(cfg, ds, RunOptions(run_dir=run_dir, quiet=True, resume=resume))


def bare_losses(cfg) -> list[float]:
    """The hand-written loop over the same batches, model, optimizer maths and schedule."""
    import torch
    import torch.nn.functional as F

    from llmtools.data.dataset import BlendedGPTDataset, MicroBatchSampler
    from llmtools.model import LlamaForCausalLM
    from llmtools.train.engine import param_groups
    from llmtools.train.optim import Lion, muon_param_groups
    from llmtools.train.plan import resolve_model_config
    from llmtools.train.schedule import build_lr_scheduler

    data = BlendedGPTDataset.from_mix(cfg.data.mix)
    t, o = cfg.training, cfg.optimizer
    steps = cfg.steps(data.seq_length)
    torch.manual_seed(t.seed)
    model = LlamaForCausalLM(resolve_model_config(cfg))
    if o.name == "muon":
        hidden, *rest = muon_param_groups(model, o.weight_decay)
        muon = torch.optim.Muon(hidden["params"], lr=o.lr, weight_decay=o.weight_decay, momentum=o.momentum,
                                nesterov=o.nesterov, ns_steps=o.ns_steps, adjust_lr_fn=o.muon_adjust_lr)  # fmt: skip
        adamw = torch.optim.AdamW([{"params": g["params"], "weight_decay": g["weight_decay"]} for g in rest],
                                  lr=o.lr, betas=tuple(o.betas), eps=o.eps, foreach=False)  # fmt: skip
        optimizers = [muon, adamw]
    else:
        optimizers = [Lion(param_groups(model, o.weight_decay), lr=o.lr, betas=tuple(o.betas))]
    schedulers = [
        build_lr_scheduler(opt, cfg.schedule, cfg.total_steps(data.seq_length)) for opt in optimizers
    ]
    gas = t.global_batch_size // t.micro_batch_size
    batches = iter(
        MicroBatchSampler(steps * t.global_batch_size, t.micro_batch_size, t.global_batch_size, 0, 1)
    )
    losses = []
    for _ in range(steps):
        total = 0.0
        for _ in range(gas):
            tokens = torch.from_numpy(data.batch(next(batches))).long()
            loss = F.cross_entropy(model(tokens[:, :-1]).float().flatten(0, 1), tokens[:, 1:].flatten())
            (loss / gas).backward()
            total += loss.item() / gas
        for opt in optimizers:
            opt.step()
        for sched in schedulers:
            sched.step()
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        losses.append(total)
    return losses


# -- the maths ----------------------------------------------------------------------------------------
@pytest.mark.numerics
def test_lion_is_the_papers_update():
    """Chen et al. 2023, Algorithm 2, written out: c = b1 m + (1-b1) g; p -= lr (sign(c) + wd p);
    m = b2 m + (1-b2) g."""
    import torch

    from llmtools.train.optim import Lion

    torch.manual_seed(0)
    ours = torch.nn.Parameter(torch.randn(7, 5))
    ref, m = ours.detach().clone(), torch.zeros(7, 5)
    lr, wd, (b1, b2) = 1e-2, 0.3, (0.9, 0.99)
    opt = Lion([ours], lr=lr, betas=(b1, b2), weight_decay=wd)
    for _ in range(5):
        grad = torch.randn(7, 5)
        ours.grad = grad.clone()
        opt.step()
        c = b1 * m + (1 - b1) * grad
        ref = ref - lr * (torch.sign(c) + wd * ref)
        m = b2 * m + (1 - b2) * grad
        # fp32 Lion: sign() is exact, lr*(sign + wd p) rounds once per step: 1e-6 over 5 steps of weights ~1
        assert torch.allclose(ours.detach(), ref, atol=1e-6, rtol=0)
    # fp32 lerp vs b1*m + (1-b1)*g: one or two roundings of values ~1 per step: 1e-7 (allclose's rtol 1e-5 too)
    assert torch.allclose(opt.state[ours]["exp_avg"], m, atol=1e-7)


@pytest.mark.numerics
def test_muon_is_torch_muon_on_matrices_and_adamw_elsewhere():
    """Bitwise torch.optim.Muon + torch.optim.AdamW; a stack of matrices (MoE experts) is one matrix each."""
    import torch

    from llmtools.model import LlamaForCausalLM, load_model_config
    from llmtools.train.config_sections import OptimizerSection
    from llmtools.train.optim import build_optimizer, muon_param_groups

    shape = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    config = load_model_config({**shape, "num_attention_heads": 2})

    def model():
        torch.manual_seed(0)
        return LlamaForCausalLM(config)

    section = OptimizerSection(name="muon", lr=1e-2)
    ours_model, ref_model = model(), model()
    ours = build_optimizer(section, muon_param_groups(ours_model, 0.1))
    hidden, *rest = muon_param_groups(ref_model, 0.1)
    names = {id(p): n for n, p in ref_model.named_parameters()}
    assert sorted(names[id(p)].split(".")[-2] for p in hidden["params"]) == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    outer = [names[id(p)] for g in rest for p in g["params"] if g["weight_decay"]]
    assert outer == ["model.embed_tokens.weight", "lm_head.weight"]
    assert all(p.ndim == 1 for g in rest if not g["weight_decay"] for p in g["params"])  # norms, no decay
    reference = [
        torch.optim.Muon(hidden["params"], lr=1e-2, weight_decay=0.1, adjust_lr_fn="match_rms_adamw"),
        torch.optim.AdamW([{k: g[k] for k in ("params", "weight_decay")} for g in rest], lr=1e-2,
                          betas=(0.9, 0.95), foreach=False),
    ]  # fmt: skip
    ids = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        for net, opts in ((ours_model, [ours]), (ref_model, reference)):
            torch.nn.functional.cross_entropy(net(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()).backward()
            for opt in opts:
                opt.step()
                opt.zero_grad()
    for a, b in zip(ours_model.parameters(), ref_model.parameters(), strict=True):
        # bitwise: the same torch kernels on the same tensors in one process (our wrapper only calls them)
        assert torch.equal(a, b)

    stack = torch.nn.Parameter(torch.randn(3, 8, 5))
    slices = [torch.nn.Parameter(stack.detach()[k].clone()) for k in range(3)]
    ours = build_optimizer(section, [{"params": [stack], "weight_decay": 0.1, "muon": True}])
    ref = torch.optim.Muon(slices, lr=1e-2, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    grad = torch.randn(3, 8, 5)
    stack.grad = grad.clone()
    for k, p in enumerate(slices):
        p.grad = grad[k].clone()
    ours.step()
    ref.step()
    # bitwise: one matrix of the stack goes through the same kernels as the matrix alone
    assert all(torch.equal(stack.detach()[k], slices[k].detach()) for k in range(3))


# -- llm-train against the bare loop, falling loss, resume ----------------------------------------------
@pytest.fixture(scope="module")
def bare(corpus_mix):
    return {
        name: bare_losses(config_for(corpus_mix, name, training__clip_grad=0.0)) for name in ("lion", "muon")
    }


# Lion is elementwise, so ZeRO-3 (each parameter partitioned on its own) runs it too; Muon is refused there.
@pytest.mark.numerics
@pytest.mark.parametrize(
    "optimizer, stage", [(name, stage) for name in ("lion", "muon") for stage in (0, 1, 2)] + [("lion", 3)]
)
def test_losses_equal_a_bare_loop_and_fall(corpus_mix, bare, tmp_path, optimizer, stage):
    cfg = config_for(corpus_mix, optimizer, training__clip_grad=0.0)
    result = run_llm_train(cfg, stage, tmp_path / "run")
    reference = bare[optimizer]
    assert len(result.losses) == len(reference) == STEPS
    # the same optimizer maths over ZeRO's flat buffers vs per tensor: fp32 last bits (bf16 Newton-Schulz sees the same inputs), 1e-6 of a loss ~5
    assert max(abs(a - b) for a, b in zip(result.losses, reference, strict=True)) < 1e-6
    first, last5 = result.losses[0], sum(result.losses[-5:]) / 5
    # ln(320) = 5.77 at the start; the sample corpus's patterns fall well below it within 20 steps.
    assert first > 5.0 and last5 < first - 1.5, (first, last5)


@pytest.mark.numerics
@pytest.mark.parametrize("optimizer, stage", [("lion", 1), ("lion", 3), ("muon", 2)])
def test_resume_is_bitwise_exact(corpus_mix, tmp_path, optimizer, stage):
    import torch

    from llmtools.ckpt.reader import CheckpointReader

    cfg = config_for(corpus_mix, optimizer, training__train_steps=8, checkpoint__save_every=4,
                     checkpoint__save_final=True)  # fmt: skip
    full = run_llm_train(cfg, stage, tmp_path / "full")
    run = tmp_path / "resumed"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "full/checkpoints/step_00000004", run / "checkpoints/step_00000004")
    resumed = run_llm_train(cfg, stage, run, resume="auto")
    # bitwise: a resume repeats the interrupted run's steps on the same machine, kernels and batches
    assert resumed.losses == full.losses[4:]

    def state(folder: Path):
        with CheckpointReader(folder / "checkpoints/step_00000008") as reader:
            weights = {name: source.load() for name, source in reader.sources().items()}
        optim = sorted((folder / "checkpoints/step_00000008").rglob("*optim_states.pt"))
        return weights, [torch.load(p, weights_only=False)["optimizer_state_dict"] for p in optim]

    (wa, oa), (wb, ob) = state(tmp_path / "full"), state(run)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    key = "momentum_buffer" if optimizer == "muon" else "exp_avg"
    moments = [
        (x, y)
        for sa, sb in zip(oa, ob, strict=True)
        for x, y in zip(_tensors(sa, key), _tensors(sb, key), strict=True)
    ]
    assert moments and all(torch.equal(x, y) for x, y in moments)


def _tensors(state: dict, key: str) -> list:
    """Every optimizer-state tensor named ``key`` in a (ZeRO-wrapped) optimizer state dict."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == key and hasattr(v, "shape"):
                    found.append(v)
                else:
                    walk(v)
        elif isinstance(node, (list, tuple)):
            for v in node:
                walk(v)

    walk(state)
    return found


# -- two ranks ------------------------------------------------------------------------------------------


@pytest.mark.numerics
def test_two_ranks_equal_one_with_twice_the_accumulation(byte_data, tmp_path, cli_env):
    """ZeRO partitions cut a matrix between the ranks (3 layers): Muon gathers it whole. Two ranks give the
    one-rank losses (same global batch: one micro-batch per rank instead of two on one rank)."""
    from llmtools.train.optim import muon_param_groups
    from tests.train.optim_worker import SCENARIOS, scenario_config
    from tests.train.optim_worker import STEPS as WORKER_STEPS

    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    command += ["--master_port", str(free_port()), str(WORKER), byte_data["mix"], str(tmp_path / "two")]
    cli_env.update({"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"})
    done = subprocess.run(command, env=cli_env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]

    from llmtools.model import LlamaForCausalLM
    from llmtools.train.plan import resolve_model_config

    cfg = scenario_config(byte_data["mix"], "muon")
    hidden = muon_param_groups(LlamaForCausalLM(resolve_model_config(cfg)), 0.0)[0]["params"]
    starts = [0]
    for p in hidden:
        starts.append(starts[-1] + p.numel())
    assert starts[-1] % 2 == 0 and starts[-1] // 2 not in starts  # the partition boundary cuts a matrix
    for name, (optimizer, stage) in SCENARIOS.items():
        one = run_llm_train(scenario_config(byte_data["mix"], optimizer), stage, tmp_path / f"one-{name}")
        records = (tmp_path / "two" / name / "metrics.jsonl").read_text().splitlines()
        two = [r["loss"] for r in map(json.loads, records) if r["kind"] == "train"]
        assert len(two) == len(one.losses) == WORKER_STEPS
        # bf16 Newton-Schulz on gradients reduced in another order: its rounding, not fp32's, bounds this.
        tol = bf16_update_loss_atol(movement(one.losses), starts[-1], cfg.optimizer.ns_steps)
        assert max(abs(a - b) for a, b in zip(one.losses, two, strict=True)) < tol, name
        assert math.isfinite(two[-1]) and two[-1] < two[0]


# -- refused before compute -----------------------------------------------------------------------------
def test_muon_refusals_name_the_setting(byte_data):
    from llmtools.train.plan import make_plan

    with pytest.raises(InputError, match="optimizer.name=muon: not with ZeRO stage 3"):
        make_plan(config_for(byte_data["mix"], "muon"), {"zero_optimization": {"stage": 3}})
    lora = {"lora__r": 4}
    with pytest.raises(InputError, match="optimizer.name=muon: not with lora"):
        make_plan(config_for(byte_data["mix"], "muon", **lora), {"zero_optimization": {"stage": 2}})
    offload = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    with pytest.raises(InputError, match="offload_optimizer"):
        make_plan(config_for(byte_data["mix"], "muon"), offload)
    plan = make_plan(config_for(byte_data["mix"], "lion"), {"zero_optimization": {"stage": 3}})
    assert plan.zero_stage == 3  # Lion is elementwise: stage 3 is fine


def test_resume_policy_applies_muon_settings_to_muon_groups_only(byte_data):
    """A resumed Muon run with a new momentum, muon_lr, lr or eps: each lands in the groups it belongs to."""
    from types import SimpleNamespace

    import torch

    from llmtools.train.optim import build_optimizer
    from llmtools.train.resume import Change, apply
    from llmtools.train.resume_rules import APPLY, Rule
    from llmtools.train.schedule import build_lr_scheduler

    old = config_for(byte_data["mix"], "muon", optimizer__lr=1e-3)
    new = config_for(byte_data["mix"], "muon", optimizer__lr=2e-3, optimizer__muon_lr=0.02,
                     optimizer__momentum=0.9, optimizer__eps=1e-6)  # fmt: skip
    groups = [
        {"params": [torch.nn.Parameter(torch.zeros(4, 4))], "weight_decay": 0.1, "muon": True},
        {"params": [torch.nn.Parameter(torch.zeros(4))], "weight_decay": 0.0, "muon": False},
    ]
    optimizer = build_optimizer(old.optimizer, groups)
    scheduler = build_lr_scheduler(optimizer, old.schedule, 20)
    engine = SimpleNamespace(optimizer=optimizer, lr_scheduler=scheduler)
    keys = ("optimizer.lr", "optimizer.muon_lr", "optimizer.momentum", "optimizer.eps")
    apply(engine, [Change(k, None, None, Rule(APPLY, "")) for k in keys], new)
    muon, adamw = optimizer.param_groups
    assert muon["momentum"] == 0.9 and muon["eps"] == 1e-7 and "betas" not in muon  # Muon's own eps kept
    assert adamw["eps"] == 1e-6 and "momentum" not in adamw
    assert scheduler.base_lrs == [0.02, 2e-3]


@pytest.mark.parametrize("key, old, new", [("world_size", 2, 1), ("zero_optimization.stage", 2, 1)])
def test_resharding_a_lion_or_muon_run_is_refused_before_compute(byte_data, key, old, new):
    """World-size changes and --reshard go through DeepSpeed's universal checkpoint, which carries Adam's
    moments only: refused in one line naming the key, the optimizer and the way out."""
    from llmtools.train.resume import review

    def resolved(value, optimizer):
        config = config_for(byte_data["mix"], optimizer).to_dict()
        extra = {"world_size": value, "zero_stage": 2} if key == "world_size" else {"zero_stage": value}
        return {**config, "resolved": extra}

    for optimizer in ("lion", "muon"):
        meta = {"step": 4, "config": resolved(old, optimizer)}
        with pytest.raises(InputError) as error:
            review(meta, "run/checkpoints/step_00000004", resolved(new, optimizer), reshard=True)
        message = str(error.value)
        assert message.startswith(f"run/checkpoints/step_00000004/meta.json[{key}]: checkpoint has {old}")
        assert f"optimizer.name='{optimizer}'" in message and "carries Adam's moments only" in message
    assert review({"step": 4, "config": resolved(old, "adamw")}, "ckpt", resolved(new, "adamw"), reshard=True)
