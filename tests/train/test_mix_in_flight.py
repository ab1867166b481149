"""A running job's mix changed on resume, through the training loop and real llm-train processes.

The heavy property checks live on the data layer (tests/data/test_ledger.py); here, the few that need
training: bitwise weights whether the run was interrupted never, once or five times (a schedule up front
= the mixes applied in flight); a world-size change (2 -> 1) with a mix change; the inputs refused before
compute (exit 2, one line naming both sides); the quarantine of a poisoned document.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from llmtools.ckpt.reader import CheckpointReader
from llmtools.ckpt.verify import read_meta
from llmtools.data.blend import blend_weights, build_blending_indices, normalize_weights
from tests.conftest import REPO, shared
from tests.ports import free_port
from tests.train.conftest import TINY, tiny_config, write_byte_prefix

pytestmark = pytest.mark.slow

SEQ, GBS, A, B = 64, 8, 4, 4  # A steps on the first mix, B on the second
ZERO2 = REPO / "configs" / "deepspeed" / "zero2.json"


def _mix(path: Path, prefixes, weights, samples, stages=None, seq=SEQ) -> str:
    from llmtools.data import mix as M

    config = M.MixConfig(
        blend=M.Blend([str(p) for p in prefixes], weights),
        seq_length=seq,
        num_samples=samples,
        split="100,0,0",
        stages=stages,
    )
    M.save_plan(M.build_plan(config), path)
    return str(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from llmtools.data.stages import StageKey, StageSpec

    folder = tmp_path_factory.mktemp("inflight")
    a = write_byte_prefix(shared("tinyshakespeare/input.jsonl"), folder / "shakespeare", limit_docs=400)
    b = write_byte_prefix(shared("wikitext-2/valid.jsonl"), folder / "wiki", limit_docs=200)
    c = write_byte_prefix(shared("tinystories/tinystories_sample.jsonl"), folder / "stories", limit_docs=200)
    stages = [
        StageSpec(StageKey("samples", 0), StageKey("step", A), (0.7, 0.3, 0.0)),
        StageSpec(StageKey("step", A), StageKey("end"), (0.0, 0.5, 0.5)),
    ]
    from llmtools.data import mix as M

    config = M.MixConfig(
        blend=M.Blend([str(a), str(b), str(c)]),
        seq_length=SEQ,
        num_samples=(A + B) * GBS,
        split="100,0,0",
        stages=stages,
        global_batch_size=GBS,
    )
    M.save_plan(M.build_plan(config), folder / "staged.json")
    return {
        "folder": folder,
        "a": a,
        "b": b,
        "c": c,
        # the first mix: shakespeare and wiki; the second: wiki continues, stories new, shakespeare removed
        "mix1": _mix(folder / "mix1.json", [a, b], [0.7, 0.3], A * GBS),
        "mix2": _mix(folder / "mix2.json", [b, c], [0.5, 0.5], B * GBS),
        "staged": str(folder / "staged.json"),
    }


def _train(mix, run_dir: Path, steps: int, resume=None, **overrides):
    from llmtools.train.deepspeed_config import load_ds_config
    from llmtools.train.loop import RunOptions, train

    overrides = {
        "training__train_steps": steps,
        "schedule__total_steps": A + B,  # one LR curve whatever the phase
        "checkpoint__save_final": True,
        **overrides,
    }
    cfg = tiny_config(mix, **overrides)
    return train(cfg, load_ds_config(ZERO2), RunOptions(run_dir=run_dir, quiet=True, resume=resume))


def _records(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def _weights(run_dir: Path, step: int) -> dict:
    with CheckpointReader(run_dir / "checkpoints" / f"step_{step:08d}") as reader:
        return {name: source.load() for name, source in reader.sources().items()}


def _ledger(run_dir: Path, step: int) -> dict:
    return read_meta(run_dir / "checkpoints" / f"step_{step:08d}")["data"]["ledger"]


def _counts(weights, size):
    di, _ = build_blending_indices(blend_weights(normalize_weights(weights)), size)
    return np.bincount(di, minlength=len(weights)).tolist()


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory):
    root = tmp_path_factory.mktemp("inflight-runs")
    never, once, five = root / "never", root / "once", root / "five"
    _train(data["staged"], never, A + B)  # the schedule up front: no interruption at all
    _train(data["mix1"], once, A)
    shutil.copytree(once, root / "at_switch")  # a run at the switch, for the refusals below
    _train(data["mix2"], once, A + B, resume="auto")  # the mix changed in flight
    for mix, steps in (
        (data["mix1"], 2),
        (data["mix1"], A),
        (data["mix2"], 5),
        (data["mix2"], 6),
        (data["mix2"], 7),
    ):
        _train(mix, five, steps, resume="auto" if steps > 2 else None)
    _train(data["mix2"], five, A + B, resume="auto")
    return {"never": never, "once": once, "five": five, "at_switch": root / "at_switch"}


def test_bitwise_the_same_whether_interrupted_never_once_or_five_times(runs):
    import torch

    losses = {name: [r["loss"] for r in _records(runs[name], "train")] for name in ("never", "once", "five")}
    assert len(losses["never"]) == A + B
    assert losses["never"] == losses["once"] == losses["five"]
    reference = _weights(runs["never"], A + B)
    for name in ("once", "five"):
        other = _weights(runs[name], A + B)
        assert reference.keys() == other.keys()
        assert all(torch.equal(reference[k], other[k]) for k in reference), name


def test_the_ledger_counts_what_the_two_blends_prescribe(runs):
    ca, cb = _counts([0.7, 0.3], A * GBS)
    db, dc = _counts([0.5, 0.5], B * GBS)
    expected = {"shakespeare": ca, "wiki": cb + db, "stories": dc}
    for name in ("never", "once", "five"):
        ledger = _ledger(runs[name], A + B)
        sources = {s["name"]: s for s in ledger["sources"]}
        assert {n: s["drawn"] for n, s in sources.items()} == expected, name
        assert {n: s["position"] for n, s in sources.items()} == expected, name  # no gap, no repeat
        assert [(s["start"], min(s["end"], (A + B) * GBS)) for s in ledger["stages"]] == [
            (0, A * GBS),
            (A * GBS, (A + B) * GBS),
        ]
    # metrics.jsonl: the tokens of each source, and the switch announced
    last = _records(runs["once"], "train")[-1]
    assert last["source_tokens"] == {n: c * SEQ for n, c in expected.items()}
    (event,) = [e for e in _records(runs["once"], "event") if e["event"] == "data"]
    assert event["change"] == "continued"
    assert event["sources"] == {"shakespeare": "stops", "wiki": "continues", "stories": "starts"}
    # the files keep their schemas: checkpoint meta with the ledger, every metrics record
    _validate(read_meta(runs["once"] / "checkpoints" / f"step_{A + B:08d}"), "checkpoint-meta")
    for line in (runs["once"] / "metrics.jsonl").read_text().splitlines():
        _validate(json.loads(line), "metrics")


def test_llm_ckpt_inspect_data_prints_the_ledger_of_a_run(data, runs):
    ca, cb = _counts([0.7, 0.3], A * GBS)
    db, dc = _counts([0.5, 0.5], B * GBS)
    done = subprocess.run(
        [sys.executable, "-m", "llmtools.cli.ckpt", "inspect", str(runs["once"]), "--data"],
        env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].startswith(f"checkpoint {runs['once']}/checkpoints/step_{A + B:08d} (step {A + B}, ")
    assert f"{(A + B) * GBS:,} samples, {(A + B) * GBS * SEQ:,} tokens of {SEQ} per sample" in lines[1]
    table = {line.split()[0]: line.split() for line in lines[4 : lines.index("stages")]}
    # source, samples, tokens, share, epochs, position, skipped, quarantined, repeated, now
    assert table["shakespeare"][1:3] == [f"{ca:,}", f"{ca * SEQ:,}"] and table["shakespeare"][-1] == "stopped"
    assert table["wiki"][1] == f"{cb + db:,}" and table["wiki"][-2:] == ["weight", "0.5"]
    assert table["stories"][1] == f"{dc:,}" and table["stories"][5] == f"{dc:,}"  # at its cursor
    assert all(row[6:9] == ["0", "0", "0"] for row in table.values())  # nothing skipped or repeated
    assert lines[lines.index("stages") + 1 :] == [
        f"  0  samples [0, {A * GBS}) steps 1-{A}  {data['mix1']} stage 0: shakespeare 0.700, wiki 0.300",
        f"  1  samples [{A * GBS}, {(A + B) * GBS}) steps {A + 1}-{A + B}  {data['mix2']} stage 0: "
        "wiki 0.500, stories 0.500",
    ]


def _validate(document, schema: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(document, json.loads((REPO / "schemas" / f"{schema}.schema.json").read_text()))


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update({"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"})
    env.pop("LLMTOOLS_DEBUG", None)
    return env


def _config_file(path: Path, mix: str, **overrides) -> Path:
    raw = {
        "model": {"preset": "tiny", **TINY},
        "data": {"mix": mix},
        "training": {"micro_batch_size": 4, "global_batch_size": GBS, "train_steps": A + B, "seed": 1234},
        "optimizer": {"lr": 3e-3, "weight_decay": 0.1},
        "schedule": {"kind": "cosine", "warmup_steps": 5, "total_steps": A + B},
        "logging": {"log_every": 1},
        "checkpoint": {"save_every": 0, "save_final": True},
    }
    for dotted, value in overrides.items():
        section, key = dotted.split("__")
        raw.setdefault(section, {})[key] = value
    path.write_text(yaml.safe_dump(raw))
    return path


def _llm_train(config: Path, run_dir: Path, *args, nproc: int = 1, timeout: int = 600):
    if nproc == 1:
        command = [sys.executable, "-m", "llmtools.cli.train"]
    else:
        port = free_port()
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc)]
        command += ["--master_port", str(port), "-m", "llmtools.cli.train"]
    command += [str(config), "--deepspeed", str(ZERO2), "-o", str(run_dir), *map(str, args)]
    return subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=timeout)


def test_world_size_2_to_1_with_a_mix_change_keeps_the_guarantees(data, runs, tmp_path):
    config = _config_file(tmp_path / "c.yaml", data["mix1"], training__train_steps=A)
    run = tmp_path / "run"
    two = _llm_train(config, run, nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    assert read_meta(run / "checkpoints" / f"step_{A:08d}")["world_size"] == 2
    one = _llm_train(config, run, "--resume", "auto", "--set", f"data.mix={data['mix2']}",
                     "--set", f"training.train_steps={A + B}")  # fmt: skip
    assert one.returncode == 0, one.stderr[-3000:]
    assert "wiki: continues at sample" in one.stderr and "stories: new, starts at sample 0" in one.stderr
    assert "shakespeare: stops at sample" in one.stderr
    # the same data as the one-process run: the same cursors, the same stages, the same losses
    got, want = _ledger(run, A + B), _ledger(runs["once"], A + B)
    strip = ("prefix",)
    assert [{k: v for k, v in s.items() if k not in strip} for s in got["sources"]] == [
        {k: v for k, v in s.items() if k not in strip} for s in want["sources"]
    ]
    assert [(s["start"], s["end"], s["keys"], s["offsets"]) for s in got["stages"]] == [
        (s["start"], s["end"], s["keys"], s["offsets"]) for s in want["stages"]
    ]
    losses = [r["loss"] for r in _records(run, "train")]
    # fp32 trainings resumed through another data-loader path: last-bit differences grown over the steps, 2e-4 of a loss ~5
    assert losses == pytest.approx([r["loss"] for r in _records(runs["once"], "train")], abs=2e-4)


@pytest.fixture(scope="module")
def refusals(data, runs, tmp_path_factory):
    """Mixes and files llm-train must refuse before compute."""
    from llmtools.data.stages import StageKey, StageSpec
    from llmtools.formats.sidecar import read_sidecar, write_sidecar

    folder = tmp_path_factory.mktemp("refusals")
    # the stories source, tokenized "differently": same tokens, another tokenizer identity in its sidecar
    other = folder / "stories_other_tok"
    for suffix in (".bin", ".idx"):
        shutil.copy(f"{data['c']}{suffix}", f"{other}{suffix}")
    sidecar = read_sidecar(data["c"])
    sidecar["tokenizer"] = {**sidecar["tokenizer"], "hash": "0" * 64, "name": "another-tokenizer"}
    write_sidecar(other, sidecar)
    gapped = json.loads(Path(data["staged"]).read_text())
    gapped["stages"][1]["start"] += 3
    (Path(data["staged"]).parent / "gapped.json").write_text(json.dumps(gapped))
    from llmtools.data import mix as M

    short = M.MixConfig(
        blend=M.Blend([str(data["a"]), str(data["b"])]),
        seq_length=SEQ,
        num_samples=6 * GBS,
        split="100,0,0",
        stages=[StageSpec(StageKey("samples", 0), StageKey("end"), (0.5, 0.5))],
    )
    M.save_plan(M.build_plan(short), folder / "short.json")
    return {
        "tokenizer": _mix(folder / "tok.json", [other], [1.0], B * GBS),
        "seq": _mix(folder / "seq32.json", [data["b"], data["c"]], [0.5, 0.5], B * GBS, seq=32),
        "gapped": str(Path(data["staged"]).parent / "gapped.json"),
        "short": str(folder / "short.json"),
    }


@pytest.mark.parametrize(
    "case, resume, words",
    [
        (
            "tokenizer",
            True,
            # the resume policy names it first (the data ledger would too): meta.json[tokenizer]
            ["meta.json[tokenizer]: checkpoint has", "0" * 64, "(a different tokenizer)"],
        ),
        (
            "seq",
            True,
            ["meta.json[data.ledger]: seq_length:", "has 64 tokens per sample", "seq32.json has 32"],
        ),
        (
            "gapped",
            False,
            ["gapped.json[stages[1]]: starts at sample 35 but stage 0 ends at sample 32", "a gap"],
        ),
        (
            "short",
            False,
            ["the stage schedule ends at sample 48 (step 6), before training.train_steps=8 (sample 64)"],
        ),
        (
            "quarantine",
            True,
            ["quarantine.jsonl:1: written by run not-this-run, but the checkpoint step_00000004 is run"],
        ),
    ],
)
def test_bad_input_fails_before_compute_naming_both_sides(
    data, runs, refusals, tmp_path, case, resume, words
):
    run = tmp_path / "run"
    shutil.copytree(runs["at_switch"], run) if resume else None
    mix = data["mix2"] if case == "quarantine" else refusals[case]
    if case == "quarantine":
        record = {"format": "llmtools.quarantine", "version": 1, "run": "not-this-run", "step": 2, "rank": 0,
                  "reason": "nan", "samples": []}  # fmt: skip
        (run / "quarantine.jsonl").write_text(json.dumps(record) + "\n")
    before = sorted(p.name for p in (run / "checkpoints").iterdir()) if resume else []
    metrics = (run / "metrics.jsonl").read_text() if resume else ""
    config = _config_file(tmp_path / "c.yaml", mix)
    done = _llm_train(config, run, *(["--resume", "auto"] if resume else []), timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llm-train: error: "), done.stderr
    for word in words:
        assert word in lines[0]
    if resume:  # nothing trained, nothing written
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before
        assert (run / "metrics.jsonl").read_text() == metrics
    else:
        assert not (run / "metrics.jsonl").exists() and not (run / "checkpoints").exists()


# ---------------------------------------------------------------------------------------- quarantine
POISON = 255  # byte 0xFF: valid UTF-8 text never holds it; the model's embedding row for it is NaN


@pytest.fixture(scope="module")
def poisoned(data, tmp_path_factory):
    """A source with one poisoned document, a mix of it and wiki, and init weights that make any sample
    reading the poison's tokens NaN (and no other)."""
    import torch

    from llmtools.data.reconcile import open_run_data
    from llmtools.data.train_streams import TrainStreams
    from llmtools.formats.indexed import IndexedDatasetReader, IndexedDatasetWriter
    from llmtools.formats.sidecar import read_sidecar, write_sidecar
    from llmtools.model import LlamaForCausalLM, load_model_config
    from llmtools.model.hf import save_hf_folder

    folder = tmp_path_factory.mktemp("poison")
    clean = IndexedDatasetReader(data["a"])
    prefix = folder / "poisoned"
    doc = 15
    with IndexedDatasetWriter(prefix, np.uint16, durable=False) as writer:
        for j in range(45):
            if j == doc:
                writer.add_document(np.full(5 * SEQ, POISON, dtype=np.uint16))
            writer.add_document(np.asarray(clean.document(j)))
    write_sidecar(prefix, read_sidecar(data["a"]))
    steps = 10
    mix = _mix(folder / "mix.json", [prefix, data["b"]], [0.5, 0.5], steps * GBS)
    # where the poison is drawn: the run stops at the first, and would meet it again later
    run_data, _ = open_run_data(TrainStreams.from_mix(mix), None, 0)
    hits = [
        p
        for p, d in enumerate(run_data.describe(range(steps * GBS)))
        if d["source"] == "poisoned" and any(x["document"] == doc for x in d["documents"])
    ]
    first_step = hits[0] // GBS + 1
    assert first_step < steps and any(p // GBS + 1 > first_step for p in hits), hits
    config = load_model_config({**load_model_config("tiny").to_dict(), **TINY})
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight[POISON] = float("nan")
    init = save_hf_folder(model, config, folder / "nan-init")
    return {"mix": mix, "doc": doc, "steps": steps, "first_step": first_step, "init": init}


def test_a_poisoned_document_is_quarantined_and_never_seen_again(poisoned, runs, tmp_path):
    config = _config_file(
        tmp_path / "c.yaml",
        poisoned["mix"],
        model__init_from=str(poisoned["init"]),
        health__nan_action="stop",
        training__train_steps=poisoned["steps"],
        schedule__total_steps=poisoned["steps"],
    )
    run = tmp_path / "run"
    stopped = _llm_train(config, run)
    assert stopped.returncode == 1, stopped.stderr[-3000:]
    assert f"stopped at step {poisoned['first_step']}: health.nan_action=stop" in stopped.stderr
    records = [json.loads(line) for line in (run / "quarantine.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [poisoned["first_step"]]
    for record in records:
        _validate(record, "quarantine")
    named = [s for r in records for s in r["samples"]]
    assert named and all(s["source"] == "poisoned" and s["loss"] is None for s in named)
    assert all(poisoned["doc"] in {d["document"] for d in s["documents"]} for s in named)

    # llm-prep cat shows the offending tokens (the poison), and refuses the file in another run's folder
    cat = subprocess.run(
        [sys.executable, "-m", "llmtools.cli.prep", "cat", "--quarantine", str(run / "quarantine.jsonl"), "--json"],
        env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert cat.returncode == 0, cat.stderr
    shown = [json.loads(line) for line in cat.stdout.splitlines()]
    assert len(shown) == len(named) and all(POISON in s["ids"] for s in shown)
    other = tmp_path / "other_run"
    shutil.copytree(runs["at_switch"] / "checkpoints", other / "checkpoints")
    shutil.copy(run / "quarantine.jsonl", other / "quarantine.jsonl")
    refused = subprocess.run(
        [sys.executable, "-m", "llmtools.cli.prep", "cat", "--quarantine", str(other / "quarantine.jsonl")],
        env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert (
        refused.returncode == 2 and "written by run" in refused.stderr and "\n" not in refused.stderr.strip()
    )

    # the quarantine took effect at once (the saved state passes over the document, as a resume would)
    assert "poisoned: 1 quarantined document(s) are passed over from here on" in stopped.stderr
    resumed = _llm_train(config, run, "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    train = _records(run, "train")
    after = [r for r in train if r["step"] > poisoned["first_step"]]
    assert [r["step"] for r in after] == list(range(poisoned["first_step"] + 1, poisoned["steps"] + 1))
    assert all(r["loss"] is not None and np.isfinite(r["loss"]) for r in after)  # never seen again
    ledger = {s["name"]: s for s in _ledger(run, poisoned["steps"])["sources"]}
    assert ledger["poisoned"]["quarantined"] == len(named)
    assert ledger["poisoned"]["skipped"] >= 1  # later samples of the poison were passed over ...
    assert ledger["poisoned"]["skips"][0]["documents"] == [poisoned["doc"]]
    assert (
        len(ledger["poisoned"]["passed_over"]) == ledger["poisoned"]["skipped"]
    )  # the replacements, recorded
    # ... and replaced by the source's next samples: the blend drew as many from each source as before
    assert ledger["poisoned"]["drawn"] + ledger["wiki"]["drawn"] == poisoned["steps"] * GBS
    events = [e for e in _records(run, "event") if e["event"] in ("quarantine", "data")]
    assert [e["event"] for e in events] == ["quarantine", "data"]
    for event in events:
        _validate(event, "metrics")

    inspect = subprocess.run(
        [sys.executable, "-m", "llmtools.cli.ckpt", "inspect", "--data", str(run), "--json"],
        env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert inspect.returncode == 0, inspect.stderr
    report = json.loads(inspect.stdout)
    assert {s["name"]: s["quarantined"] for s in report["sources"]} == {"poisoned": len(named), "wiki": 0}


def test_a_fresh_run_refuses_a_stale_quarantine_file_and_force_removes_it(data, tmp_path):
    from llmtools.train.rundir import clear_run_dir

    run = tmp_path / "run"
    run.mkdir()
    record = {"format": "llmtools.quarantine", "version": 1, "run": "old", "step": 2, "rank": 0,
              "reason": "nan", "samples": []}  # fmt: skip
    (run / "quarantine.jsonl").write_text(json.dumps(record) + "\n")
    done = _llm_train(
        _config_file(tmp_path / "c.yaml", data["mix1"], training__train_steps=A), run, timeout=300
    )
    assert done.returncode == 2
    assert done.stderr.strip().endswith(
        "quarantine.jsonl: holds quarantine records, but this run starts afresh: a quarantine file of "
        "another run (--force starts over and removes it)"
    )
    (run / "metrics.jsonl").write_text("")  # a run folder: --force clears what a run wrote, this file too
    clear_run_dir(run)  # what --force does, rank 0, once the run folder is locked
    assert not (run / "quarantine.jsonl").exists() and not (run / "metrics.jsonl").exists()


def test_a_grad_norm_spike_quarantines_the_whole_batch_and_the_resumed_run_passes_over_it(
    byte_data, tmp_path, monkeypatch
):
    """No single sample is to blame for a spike: the stop names the step's whole batch, and the resumed
    run passes over every document of it and finishes."""
    from llmtools.errors import RuntimeFailure
    from tests.train.test_health import inject

    inject(monkeypatch, at_call=15, factor=1e4)  # step 8's first micro-batch: gradients x 10^4
    health = {"health__spike_factor": 5.0, "health__spike_window": 4, "health__spike_action": "stop"}
    run = tmp_path / "run"
    with pytest.raises(RuntimeFailure, match="stopped at step 8: health.spike_action=stop"):
        _train(byte_data["mix"], run, 10, schedule__total_steps=10, **health)
    (record,) = [json.loads(line) for line in (run / "quarantine.jsonl").read_text().splitlines()]
    assert (record["step"], record["reason"]) == (8, "spike")
    assert record["note"] == "the whole batch: a grad-norm spike is not one sample's"
    assert sorted(s["position"] for s in record["samples"]) == list(range(7 * GBS, 8 * GBS))
    _validate(record, "quarantine")
    named = {(s["source"], d["document"]) for s in record["samples"] for d in s["documents"]}

    _train(byte_data["mix"], run, 10, resume="auto", schedule__total_steps=10, **health)
    steps = [r["step"] for r in _records(run, "train")]
    assert steps == list(range(1, 11)) and all(r["loss"] is not None for r in _records(run, "train")[8:])
    ledger = _ledger(run, 10)
    assert sum(s["quarantined"] for s in ledger["sources"]) == GBS
    passed = {(s["name"], d) for s in ledger["sources"] for skip in s["skips"] for d in skip["documents"]}
    assert passed == named
    # what the resumed steps drew (the step-8 checkpoint's ledger and the quarantine): none of those documents
    from llmtools.data.ledger import Ledger
    from llmtools.data.reconcile import open_run_data
    from llmtools.data.train_streams import TrainStreams

    saved = Ledger.from_json(read_meta(run / "checkpoints" / "step_00000008")["data"]["ledger"], "meta")
    assert saved.position == 8 * GBS
    data, _ = open_run_data(TrainStreams.from_mix(byte_data["mix"]), saved, 8 * GBS, quarantine=[record])
    end = TrainStreams.from_mix(byte_data["mix"]).size
    drawn = data.describe(range(8 * GBS, end))  # the rest of the plan, not only the steps trained
    assert not named & {(d["source"], x["document"]) for d in drawn for x in d["documents"]}
    # the quarantine took effect before the stop's checkpoint: its ledger passes over them already
    assert {(r.spec.name, d) for r in saved.sources.values() for k in r.skips for d in k.documents} == named
    unquarantined, _ = open_run_data(TrainStreams.from_mix(byte_data["mix"]), None, 0)
    drawn = unquarantined.describe(range(8 * GBS, end))
    assert named & {(d["source"], x["document"]) for d in drawn for x in d["documents"]}  # they would be
