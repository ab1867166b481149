#!/usr/bin/env python3
"""Two hosts vs one host: tokens/s of the same llm-train job, and the bytes each rank reduces per step.

The same job (the ``tiny`` preset, 3.2M parameters, ZeRO-2, 2 ranks, global batch 16 x 64 tokens) runs as
* two hosts x one process: two network namespaces joined by a veth pair through a bridge, one torchrun
  agent each (c10d rendezvous), gloo over the link;
* one host x two processes: ``torchrun --standalone --nproc-per-node 2`` inside one namespace (gloo over
  loopback);
in interleaved rounds (two, one, one, two, ...). Measured per step, over the steps after the warm-up:
* tokens/s: consumed tokens / wall time between two metrics records (rank 0's clock);
* bytes on the wire: the byte counters of the interface the ranks talk over (``eth0`` of each host, or
  ``lo`` of the one host), read when step ``--warmup`` and the last step are logged;
* bytes handed to collectives: every ``torch.distributed`` collective a rank issues (DeepSpeed's and
  ours) is counted (its input tensor) by a ``sitecustomize`` hook loaded only into the benchmark's
  workers, by operation, between the end of the warm-up (a SIGUSR2 from the benchmark) and the exit.
``--rate 1gbit`` shapes the link between the hosts (tc tbf), to see a real network's cost; ``--delay 0.1ms``
adds latency instead (tc netem, which needs the kernel's sch_netem); without either the link is a veth
pair, as fast as memory.

    python benchmarks/bench_multihost.py                      # 60 steps, 2 rounds
    python benchmarks/bench_multihost.py --quick              # 20 steps, 1 round
    python benchmarks/bench_multihost.py --rate 1gbit --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# Loaded by every worker through PYTHONPATH: counts the bytes of each collective call, written at exit.
HOOK = """
import atexit, json, os
try:
    import torch.distributed as _dist
except Exception:
    _dist = None
if _dist is not None and os.environ.get("LLMTOOLS_BENCH_COLLECTIVES"):
    _counts = {}
    def _size(value):
        import torch
        if isinstance(value, torch.Tensor):
            return value.numel() * value.element_size()
        if isinstance(value, (list, tuple)):
            return sum(_size(v) for v in value)
        return 0
    # What each rank hands in: the tensor for in-place ops, the input (not the output) for gathers/scatters.
    _INPUT = {"all_reduce": (0, "tensor"), "broadcast": (0, "tensor"), "reduce": (0, "tensor"),
              "all_gather_into_tensor": (1, "input_tensor"), "reduce_scatter_tensor": (1, "input"),
              "all_gather": (1, "tensor"), "reduce_scatter": (1, "input_list"), "all_to_all_single": (1, "input")}
    def _wrap(name, position, keyword):
        original = getattr(_dist, name)
        def counted(*args, **kwargs):
            sent = args[position] if len(args) > position else kwargs.get(keyword)
            entry = _counts.setdefault(name, [0, 0])
            entry[0] += 1
            entry[1] += _size(sent)
            return original(*args, **kwargs)
        setattr(_dist, name, counted)
    for _name, (_position, _keyword) in _INPUT.items():
        if hasattr(_dist, _name):
            _wrap(_name, _position, _keyword)
    def _dump(tag):
        if not _counts:  # a helper process that inherited the environment, not a worker
            return
        path = os.environ["LLMTOOLS_BENCH_COLLECTIVES"] + f".rank{os.environ.get('RANK', '0')}.{tag}.json"
        with open(path, "w") as out:
            json.dump(_counts, out)
    import signal
    signal.signal(signal.SIGUSR2, lambda *_: _dump("warm"))  # the benchmark's mark: warm-up over
    atexit.register(_dump, "end")
"""


def records(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


def train_records(run: Path) -> list[dict]:
    return [r for r in records(run) if r.get("kind") == "train"]


def wait_step(run: Path, step: int, procs, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r["step"] >= step for r in train_records(run)):
            return
        if all(p.poll() is not None for p in procs):
            raise SystemExit(f"the job ended before step {step}")
        time.sleep(0.005)
    raise SystemExit(f"step {step} not reached in {timeout} s")


def one_round(kind: str, cluster, workdir: Path, config: Path, steps: int, warmup: int) -> dict:
    from tests.multihost.jobs import Job, host_env
    from tests.multihost.test_elastic import train_program

    run = workdir / f"run_{kind}_{time.monotonic_ns()}"
    counts = workdir / f"collectives_{run.name}"
    hook_dir = workdir / "hook"
    hook_dir.mkdir(exist_ok=True)
    (hook_dir / "sitecustomize.py").write_text(HOOK)
    extra = {"LLMTOOLS_BENCH_COLLECTIVES": str(counts)}
    program = train_program(config, 2, run)
    if kind == "two hosts":
        job = Job(cluster.hosts, workdir / "job", env=extra)
        job.env["PYTHONPATH"] = f"{hook_dir}{os.pathsep}{job.env['PYTHONPATH']}"
        job.start(program)
        procs, links = job.procs, [(h, h.interface) for h in cluster.hosts]
    else:
        host = cluster.hosts[0]
        env = host_env({**extra, "GLOO_SOCKET_IFNAME": "lo"})
        env["PYTHONPATH"] = f"{hook_dir}{os.pathsep}{env['PYTHONPATH']}"
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                "--rdzv-endpoint", f"localhost:{21000 + os.getpid() % 1000}", *program]  # fmt: skip
        log = open(workdir / "one_host.log", "w")  # noqa: SIM115
        procs = [host.popen(argv, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)]
        links = [(host, "lo")]
    wait_step(run, warmup, procs)
    before = [link_bytes(h, name) for h, name in links]
    for host, _ in links:
        for pid in host.processes("llmtools.cli.train", exclude=("torch.distributed.run",)):
            os.kill(pid, signal.SIGUSR2)
    wait_step(run, steps, procs)
    after = [link_bytes(h, name) for h, name in links]
    for proc in procs:
        proc.wait(timeout=600)
    if any(p.returncode for p in procs):
        raise SystemExit(f"{kind}: the job failed; see {workdir}")
    recs = [r for r in train_records(run) if r["step"] > warmup]
    tokens = sum(r["consumed_tokens"] for r in recs[-1:]) - train_records(run)[warmup - 1]["consumed_tokens"]
    seconds = recs[-1]["time"] - train_records(run)[warmup - 1]["time"]
    wire = sum((a[0] - b[0]) for a, b in zip(after, before, strict=True))  # sent by every host (lo: once)
    collectives: dict[str, list[int]] = {}
    for tag, sign in (("end", 1), ("warm", -1)):
        for path in workdir.glob(f"{counts.name}.rank*.{tag}.json"):
            for name, (calls, size) in json.loads(path.read_text()).items():
                entry = collectives.setdefault(name, [0, 0])
                entry[0] += sign * calls
                entry[1] += sign * size
    span = steps - warmup
    per_rank = {name: (c / 2 / span, b / 2 / span) for name, (c, b) in collectives.items()}
    shutil.rmtree(run, ignore_errors=True)
    return {
        "tokens_per_s": tokens / seconds,
        "wire_bytes_per_step": wire / (steps - warmup),
        "collectives_per_rank_step": per_rank,
    }


def link_bytes(host, interface: str) -> tuple[int, int]:
    out = host.run(
        ["cat", f"/sys/class/net/{interface}/statistics/tx_bytes", f"/sys/class/net/{interface}/statistics/rx_bytes"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return int(out[0]), int(out[1])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rate", default=None, help="shape the host link, e.g. 1gbit (tc tbf)")
    parser.add_argument("--delay", default=None, help="delay on the host link instead, e.g. 0.1ms (tc netem)")
    parser.add_argument("--quick", action="store_true", help="20 steps, 1 round")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    if args.quick:
        args.steps, args.warmup, args.rounds = 20, 5, 1

    from tests.multihost import netns
    from tests.multihost.test_elastic import write_config

    why = netns.unavailable()
    if why:
        print(f"bench_multihost: {why}", file=sys.stderr)
        return 2
    from benchmarks.fault_injection import _byte_mix

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench_multihost_"))
    workdir.mkdir(parents=True, exist_ok=True)
    mix = _byte_mix(workdir / "data")
    config = write_config(
        workdir, mix, steps=args.steps, save_every=0,
        model={"preset": "tiny", "vocab_size": 4096, "num_hidden_layers": 4, "hidden_size": 192,
               "intermediate_size": 512},
        training={"micro_batch_size": 8, "global_batch_size": 16},
        checkpoint={"save_every": 0, "save_final": False},
    )  # fmt: skip
    results: dict[str, list[dict]] = {"two hosts": [], "one host": []}
    try:
        with netns.Cluster(2) as cluster:
            for host in cluster.hosts:
                if args.delay:  # netem needs the kernel's sch_netem
                    host.run(
                        ["tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay", args.delay],
                        check=True,
                    )
                elif args.rate:  # a token bucket: a link of that rate
                    tbf = ["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", args.rate]
                    host.run([*tbf, "burst", "256kb", "latency", "100ms"], check=True)
            for round_ in range(args.rounds):
                kinds = ["two hosts", "one host"] if round_ % 2 == 0 else ["one host", "two hosts"]
                for kind in kinds:
                    result = one_round(kind, cluster, workdir, config, args.steps, args.warmup)
                    results[kind].append(result)
                    print(
                        f"round {round_ + 1} {kind}: {result['tokens_per_s']:,.0f} tokens/s", file=sys.stderr
                    )
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)

    link = f"{args.rate or 'unshaped'}{', ' + args.delay if args.delay else ''}"
    print(
        f"\n## Two hosts vs one host (tiny, ZeRO-2, 2 ranks, 1,024 tokens/step; link {link}; "
        f"steps {args.warmup + 1}-{args.steps}, median of {args.rounds} round(s))\n"
    )
    print(
        "| layout | tokens/s | ratio | bytes on the wire per step | bytes to collectives per rank and step (calls) |"
    )
    print("|---|---:|---:|---:|---|")
    base = statistics.median(r["tokens_per_s"] for r in results["one host"])
    for kind in ("one host", "two hosts"):
        tps = statistics.median(r["tokens_per_s"] for r in results[kind])
        wire = statistics.median(r["wire_bytes_per_step"] for r in results[kind])
        per = results[kind][0]["collectives_per_rank_step"]
        ops = ", ".join(
            f"{name} {size / 1e6:.2f} MB ({calls:.1f})"
            for name, (calls, size) in sorted(per.items())
            if size > 0
        )
        print(f"| {kind} | {tps:,.0f} | {tps / base:.2f} | {wire / 1e6:.2f} MB | {ops} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
