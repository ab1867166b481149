#!/usr/bin/env python3
"""The GPU check: tokens/s and MFU of llm-train's own loop on one GPU, against transformers + DeepSpeed.

One command, at most ~8 minutes on one H100/H200:

    python benchmarks/gpu_check.py --out gpu_check/            # on a CUDA machine
    python benchmarks/gpu_check.py --cpu-smoke --out /tmp/gc   # the same script end to end, tiny model, CPU

Every variant runs in a process of its own (a crash, an out-of-memory or a compile failure is recorded
as that variant's error; the others still run) and trains through ``llmtools.train.loop.train`` -- the
code path ``llm-train`` runs, with its device choices (:mod:`llmtools.train.device`): fused AdamW,
bf16 through DeepSpeed, SDPA restricted to the flash/efficient kernels, NCCL. The variants, in order
(the check stops starting new ones when ``--budget-s`` is spent and marks the rest skipped):

* ``zero0-eager``, ``zero2-eager``, ``zero0-compiled``, ``zero2-compiled``: ZeRO-0/2, with and without
  ``training.compile``;
* ``zero2-eager-ac``, ``zero2-compiled-ac``: activation checkpointing on;
* ``moe-zero2-eager``: one MoE model (the 1B shape with 8 experts of width 2048, 2 per token);
* ``zero2-eager-docmask``, ``zero2-compiled-docmask``: document masking (``data.reset_attention_mask``)
  on, where this build has it; otherwise recorded as "not available in this build";
* ``hf-deepspeed-zero2``: the same model as ``transformers.LlamaForCausalLM`` (SDPA attention) under
  ``deepspeed.initialize`` with ZeRO-2, bf16 and the same fused AdamW, on the same token batches' shape:
  the baseline every other row is compared with (``vs_baseline``).

Each variant runs ``--warmup`` steps (compilation, allocator warm-up) and then ``--steps`` timed steps;
tokens/s is ``micro_batch x seq_length`` over the median step time, MFU is tokens/s x
``llmtools.model.flops.flops_per_token`` over the device's peak dense bf16 FLOP/s, looked up by device name
(``llmtools.train.metrics.PEAK_TFLOPS``: H100 and H200 989, A100 312). Output (the format is in
docs/gpu.md): ``OUT/gpu_check.json`` and ``OUT/gpu_check.md``, rewritten after every variant, and
``OUT/gpu_check.log`` with every variant's stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FORMAT = "llmtools.gpu-check"
NOT_AVAILABLE = "not available in this build"

# name, kind, options
VARIANTS = [
    ("zero0-eager", "llmtools", {"stage": 0}),
    ("zero2-eager", "llmtools", {"stage": 2}),
    ("zero0-compiled", "llmtools", {"stage": 0, "compile": True}),
    ("zero2-compiled", "llmtools", {"stage": 2, "compile": True}),
    ("hf-deepspeed-zero2", "hf", {"stage": 2}),
    ("zero2-eager-ac", "llmtools", {"stage": 2, "ac": True}),
    ("zero2-compiled-ac", "llmtools", {"stage": 2, "compile": True, "ac": True}),
    ("moe-zero2-eager", "llmtools", {"stage": 2, "moe": True}),
    ("zero2-eager-docmask", "llmtools", {"stage": 2, "docmask": True}),
    ("zero2-compiled-docmask", "llmtools", {"stage": 2, "compile": True, "docmask": True}),
]
BASELINE = "hf-deepspeed-zero2"


@dataclasses.dataclass
class Setup:
    preset: str
    overrides: dict
    moe: dict
    seq_length: int
    micro_batch: int
    precision: str
    steps: int
    warmup: int
    budget_s: float
    timeout_s: float


def setup_for(args) -> Setup:
    if args.cpu_smoke:
        return Setup(
            preset="tiny",
            overrides={"vocab_size": 512},
            moe={"num_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 256},
            seq_length=64,
            micro_batch=2,
            precision="fp32",  # DeepSpeed's CPU accelerator: bf16 is emulated and slow; fp32 is what CPUs train in
            steps=args.steps or 2,
            warmup=args.warmup if args.warmup is not None else 1,
            budget_s=args.budget_s or 1e9,
            timeout_s=args.timeout_s or 600,
        )
    return Setup(
        preset="1b",
        overrides={},
        moe={"num_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 2048},
        seq_length=args.seq_length,
        micro_batch=args.micro_batch,
        precision="bf16",
        steps=args.steps or 10,
        warmup=args.warmup if args.warmup is not None else 3,
        budget_s=args.budget_s or 420,
        timeout_s=args.timeout_s or 150,
    )


# ------------------------------------------------------------------------------------------ data
def write_data(folder: Path, vocab: int, seq_length: int, samples: int, seed: int = 0) -> str:
    """Random documents (lengths 64..seq_length, each ending in the EOD id 0) as an indexed dataset: what
    document masking needs (several documents per sample), with no tokenizer and no download."""
    import numpy as np

    from llmtools.formats.indexed import IndexedDatasetWriter
    from llmtools.formats.sidecar import write_sidecar

    rng = np.random.default_rng(seed)
    prefix = folder / "random_text_document"
    dtype = np.int32 if vocab > 65535 else np.uint16
    need = (samples + 2) * (seq_length + 1)
    written = 0
    documents = 0
    with IndexedDatasetWriter(prefix, dtype) as writer:
        while written < need:
            n = int(rng.integers(64, max(seq_length, 65)))
            ids = rng.integers(1, vocab, size=n, dtype=np.int64)
            ids[-1] = 0
            writer.add_document(ids.astype(dtype))
            written += n
            documents += 1
    # The sidecar names the EOD id (document masking needs it) and the vocabulary (checked against the model).
    write_sidecar(
        prefix,
        {
            "format": "llmtools.indexed-sidecar",
            "version": 1,
            "tool": "benchmarks/gpu_check.py",
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "tokenizer": {
                "kind": "random",
                "source": "gpu_check",
                "name": "random",
                "hash": "",
                "vocab_size": vocab,
                "eod_id": 0,
                "bos_id": None,
            },  # fmt: skip
            "json_key": "text",
            "append_eod": True,
            "dtype": np.dtype(dtype).name,
            "special_tokens": "none",
            "inputs": [],
            "counts": {
                "documents": documents,
                "sequences": documents,
                "tokens": written,
                "empty_documents": 0,
                "skipped": {},
            },  # fmt: skip
        },
    )
    return str(prefix)


def docmask_available() -> bool:
    from llmtools.train.config_sections import DataSection

    return any(f.name == "reset_attention_mask" for f in dataclasses.fields(DataSection))


# ------------------------------------------------------------------------------------------ workers
def model_config(setup: Setup, moe: bool):
    from llmtools.model.presets import load_model_config

    fields = dict(setup.overrides)
    if moe:
        fields.update(setup.moe)
    base = load_model_config(setup.preset).to_dict()
    base.update(fields)
    return load_model_config(base), fields


def peak_flops(device: str) -> tuple[float | None, str]:
    from llmtools.train.metrics import peak_tflops

    name = "cpu"
    if device.startswith("cuda"):
        import torch

        name = torch.cuda.get_device_name()
    peak = peak_tflops(device)
    return (peak * 1e12 if peak else None), name


def summarize(setup: Setup, times: list[float], config, device: str) -> dict:
    from llmtools.model.flops import flops_per_token

    timed = times[setup.warmup :]
    median = statistics.median(timed)
    tokens_per_s = setup.micro_batch * setup.seq_length / median
    fpt = flops_per_token(config, setup.seq_length)
    peak, _ = peak_flops(device)
    out = {
        "step_s_median": median,
        "step_s_min": min(timed),
        "step_s_max": max(timed),
        "first_step_s": times[0],
        "tokens_per_s": tokens_per_s,
        "tflops": tokens_per_s * fpt / 1e12,
        "mfu": tokens_per_s * fpt / peak if peak else None,
        "flops_per_token": fpt,
        "timed_steps": len(timed),
    }
    if device.startswith("cuda"):
        import torch

        out["max_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def run_llmtools(setup: Setup, options: dict, data: str, work: Path) -> dict:
    from llmtools.train.config import from_dict
    from llmtools.train.deepspeed_config import load_ds_config
    from llmtools.train.loop import RunOptions, train

    config, fields = model_config(setup, bool(options.get("moe")))
    steps = setup.warmup + setup.steps
    raw = {
        "model": {"preset": setup.preset, **fields},
        "data": {"prefixes": [data], "weights": [1.0], "seq_length": setup.seq_length, "split": "100,0,0"},
        "training": {
            "micro_batch_size": setup.micro_batch,
            "global_batch_size": setup.micro_batch,
            "train_steps": steps,
            "precision": setup.precision,
            "compile": bool(options.get("compile")),
            "activation_checkpointing": bool(options.get("ac")),
        },
        "optimizer": {"lr": 3e-4, "weight_decay": 0.1},
        "schedule": {"kind": "cosine", "warmup_steps": 2},
        "eval": {"every": 0},
        "logging": {"log_every": 1000},
        "checkpoint": {"save_every": 0, "save_final": False},
    }
    if options.get("docmask"):
        raw["data"].update(reset_attention_mask=True, reset_position_ids=True)
    cfg = from_dict(raw, "gpu_check.yaml")
    ds = load_ds_config(ROOT / f"configs/deepspeed/zero{options['stage']}.json")
    stamps: list[float] = []
    losses: list[float] = []

    def on_step(step: int, loss: float) -> None:
        stamps.append(time.perf_counter())
        losses.append(loss)

    started = time.perf_counter()
    train(cfg, ds, RunOptions(run_dir=work / "run", quiet=True, on_step=on_step, force=True))
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    times = [b - a for a, b in zip([started, *stamps[:-1]], stamps, strict=True)]
    out = summarize(setup, times, config, device)
    out.update(losses=losses, parameters=config.num_parameters())
    return out


def run_hf(setup: Setup, options: dict, work: Path) -> dict:
    """transformers' LlamaForCausalLM under DeepSpeed: the baseline (same shapes, bf16, ZeRO, fused AdamW)."""
    import deepspeed
    import torch
    import transformers

    from llmtools.model.hf_config import to_hf_config
    from llmtools.train.distributed import init_distributed

    info = init_distributed()
    config, _ = model_config(setup, False)
    hf = to_hf_config(config)
    hf.pop("architectures", None)
    hf.pop("model_type", None)
    hf.pop("torch_dtype", None)
    hf_config = transformers.LlamaConfig(**hf, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(hf_config)
    cuda = info.device.startswith("cuda")
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=3e-4, weight_decay=0.1, **({"fused": True} if cuda else {"foreach": False})
    )
    ds = {
        "train_batch_size": setup.micro_batch,
        "train_micro_batch_size_per_gpu": setup.micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": setup.precision == "bf16"},
        "zero_optimization": {"stage": options["stage"], "overlap_comm": False, "contiguous_gradients": cuda},
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=ds, dist_init_required=False
    )
    gen = torch.Generator().manual_seed(0)
    times, losses = [], []
    for _ in range(setup.warmup + setup.steps):
        ids = torch.randint(0, config.vocab_size, (setup.micro_batch, setup.seq_length + 1), generator=gen)
        ids = ids.to(engine.device)
        started = time.perf_counter()
        loss = engine(input_ids=ids[:, :-1], labels=ids[:, :-1]).loss
        engine.backward(loss)
        engine.step()
        losses.append(float(loss))  # a host sync, as llm-train's loop has
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    out = summarize(setup, times, config, info.device)
    out.update(losses=losses, parameters=config.num_parameters())
    return out


def sdpa_support() -> dict:
    """What torch says its flash / efficient kernels accept for the 1B shapes (checks the device rule)."""
    import torch

    if not torch.cuda.is_available() or not hasattr(torch.backends.cuda, "SDPAParams"):
        return {}
    out = {}
    for dtype in (torch.bfloat16, torch.float32):
        for masked in (False, True):
            for gqa in (False, True):
                q = torch.randn(1, 32, 256, 64, device="cuda", dtype=dtype)
                k = torch.randn(1, 8 if gqa else 32, 256, 64, device="cuda", dtype=dtype)
                mask = torch.ones(1, 1, 256, 256, device="cuda", dtype=torch.bool).tril() if masked else None
                try:
                    params = torch.backends.cuda.SDPAParams(q, k, k, mask, 0.0, not masked, gqa)
                    flash = torch.backends.cuda.can_use_flash_attention(params, False)
                    eff = torch.backends.cuda.can_use_efficient_attention(params, False)
                except (TypeError, RuntimeError) as error:
                    flash = eff = f"unknown ({error})"
                key = f"{str(dtype).split('.')[-1]}{'-mask' if masked else ''}{'-gqa' if gqa else ''}"
                out[key] = {"flash": flash, "efficient": eff}
    return out


def worker(args) -> None:
    setup = Setup(**json.loads(args.setup))
    options = json.loads(args.options)
    work = Path(args.work)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(args.cache)))
    if args.kind == "hf":
        result = run_hf(setup, options, work)
    else:
        result = run_llmtools(setup, options, args.data, work)
    Path(args.result).write_text(json.dumps(result))


# ------------------------------------------------------------------------------------------ driver
def environment(cpu_smoke: bool) -> dict:
    import torch

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": "cpu",
        "peak_bf16_tflops": None,
    }
    for name in ("deepspeed", "transformers"):
        try:
            module = __import__(name)
            env[name] = module.__version__
        except Exception as error:  # noqa: BLE001 - recorded: the variants that need it say why they failed
            env[name] = f"missing ({type(error).__name__})"
    if torch.cuda.is_available() and not cpu_smoke:
        peak, name = peak_flops("cuda")
        env.update(device=name, peak_bf16_tflops=peak / 1e12 if peak else None)
        env["sdpa_support"] = sdpa_support()
    return env


def table(report: dict) -> str:
    base = report["results"].get(BASELINE, {})
    lines = [
        f"device: {report['environment']['device']}; model {report['setup']['preset']}, seq {report['setup']['seq_length']}, "
        f"micro batch {report['setup']['micro_batch']}, {report['setup']['precision']}; median of "
        f"{report['setup']['steps']} steps after {report['setup']['warmup']} warm-up",
        "",
        "| variant | tokens/s | TFLOP/s | MFU | vs baseline | step s | first step s | memory GiB | note |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, _, _ in VARIANTS:
        r = report["results"].get(name)
        if r is None:
            continue
        if "tokens_per_s" not in r:
            lines.append(f"| {name} | | | | | | | | {r.get('status', '')}: {r.get('error', '')[:120]} |")
            continue
        ratio = r["tokens_per_s"] / base["tokens_per_s"] if "tokens_per_s" in base else None
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "n/a"
        mem = f"{r['max_memory_gib']:.1f}" if r.get("max_memory_gib") is not None else ""
        lines.append(
            f"| {name} | {r['tokens_per_s']:,.0f} | {r['tflops']:.1f} | {mfu} | "
            f"{f'{ratio:.2f}x' if ratio else ''} | {r['step_s_median']:.3f} | {r['first_step_s']:.1f} | {mem} | |"
        )
    return "\n".join(lines) + "\n"


def write_report(out: Path, report: dict) -> None:
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    (out / "gpu_check.md").write_text(table(report))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="gpu_check")
    parser.add_argument(
        "--cpu-smoke", action="store_true", help="tiny model on CPU, the whole script end to end"
    )
    parser.add_argument("--only", default="", help="comma-separated variant names")
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--seq-length", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--budget-s", type=float, default=0, help="start no variant after this many seconds")
    parser.add_argument("--timeout-s", type=float, default=0, help="one variant's limit")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", default="", help="scratch folder (default OUT/work)")
    for name in ("kind", "setup", "options", "data", "result", "cache"):
        parser.add_argument(f"--{name}", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0

    started = time.perf_counter()
    setup = setup_for(args)
    if args.cpu_smoke:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work) if args.work else out / "work"  # data, run folders, compile cache
    work.mkdir(parents=True, exist_ok=True)
    log = out / "gpu_check.log"  # every variant's stderr, one after another
    log.write_text("")
    only = {n for n in args.only.split(",") if n}
    unknown = only - {n for n, _, _ in VARIANTS}
    if unknown:
        print(f"gpu_check: --only: unknown variant(s) {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    config, _ = model_config(setup, False)
    samples = (setup.warmup + setup.steps + 2) * setup.micro_batch
    data = write_data(work, config.vocab_size, setup.seq_length, samples)
    report = {
        "format": FORMAT,
        "version": 1,
        "environment": environment(args.cpu_smoke),
        "setup": dataclasses.asdict(setup),
        "baseline": BASELINE,
        "results": {},
    }
    has_docmask = docmask_available()
    for name, kind, options in VARIANTS:
        if only and name not in only:
            continue
        if options.get("docmask") and not has_docmask:
            report["results"][name] = {"status": "skipped", "error": NOT_AVAILABLE}
            write_report(out, report)
            continue
        elapsed = time.perf_counter() - started
        if elapsed > setup.budget_s:
            report["results"][name] = {"status": "skipped", "error": f"time budget spent ({elapsed:.0f} s)"}
            write_report(out, report)
            continue
        result_file = work / f"{name}.json"
        result_file.unlink(missing_ok=True)
        cmd = [
            sys.executable, str(Path(__file__).resolve()), "--worker", "--kind", kind,
            "--setup", json.dumps(dataclasses.asdict(setup)), "--options", json.dumps(options),
            "--data", data, "--work", str(work / name), "--result", str(result_file),
            "--cache", str(work / "inductor-cache"),
        ]  # fmt: skip
        print(f"gpu_check: {name} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=setup.timeout_s)
            rc, stderr = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired as error:
            rc, stderr = (
                "timeout",
                (error.stderr or b"").decode(errors="replace")
                if isinstance(error.stderr, bytes)
                else (error.stderr or ""),
            )
        wall = time.perf_counter() - t0
        with log.open("a") as f:
            f.write(f"==> {name} (exit {rc}, {wall:.0f} s)\n{stderr or ''}\n")
        if rc == 0 and result_file.exists():
            result = {"status": "ok", "wall_s": wall, **json.loads(result_file.read_text())}
        else:
            tail = [line for line in (stderr or "").strip().splitlines() if line.strip()][-3:]
            if rc == "timeout":  # the killed process's stderr is often lost: say what happened
                tail.insert(0, f"timed out after {setup.timeout_s:.0f} s")
            result = {"status": "failed", "wall_s": wall, "returncode": rc, "error": " | ".join(tail)[-600:]}
        report["results"][name] = result
        line = (
            f"{result['tokens_per_s']:,.0f} tokens/s, MFU {result['mfu']:.3f}" if result.get("mfu") is not None
            else f"{result['tokens_per_s']:,.0f} tokens/s" if "tokens_per_s" in result
            else result["error"]
        )  # fmt: skip
        print(f"gpu_check: {name}: {result['status']} in {wall:.0f} s: {line}", file=sys.stderr, flush=True)
        write_report(out, report)
    report["wall_s"] = time.perf_counter() - started
    write_report(out, report)
    print(table(report))
    print(f"{out / 'gpu_check.json'}\n{out / 'gpu_check.md'}")
    failed = [n for n, r in report["results"].items() if r.get("status") == "failed"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
