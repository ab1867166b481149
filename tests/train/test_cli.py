"""``llm-train`` end to end: the real command in a subprocess; bad input fails before compute with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.ports import free_port
from tests.train.conftest import TINY

ROOT = Path(__file__).resolve().parents[2]
DS = str(ROOT / "configs" / "deepspeed" / "zero2.json")


def write_config(folder: Path, mix: str, **sections) -> Path:
    raw = {
        "model": {"preset": "tiny", **TINY},
        "data": {"mix": mix},
        "training": {"micro_batch_size": 4, "global_batch_size": 8, "train_steps": 8},
        "optimizer": {"lr": 3e-3},
        "schedule": {"warmup_steps": 3, "total_steps": 20},
        "logging": {"log_every": 1},
        "checkpoint": {"save_every": 4},
    }
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    path = folder / "train.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def llm_train(args, env, cwd=None, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "llmtools.cli.train", *map(str, args)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if r["kind"] == "train"]


def test_help_is_light_and_has_examples(cli_env):
    """--help imports neither torch nor deepspeed (what makes it instant); no wall-clock limit here, the
    machines are shared."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from llmtools.cli.train import main; sys.argv=['llm-train','--help']; main()",
        ],
        env=cli_env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0
    assert "--deepspeed" in out.stdout and "torchrun --nproc_per_node 2" in out.stdout
    assert "srun" in out.stdout and "--resume auto" in out.stdout
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, llmtools.cli.train; print(any(m in sys.modules for m in ('torch', 'deepspeed')))",
        ],
        env=cli_env,
        capture_output=True,
        text=True,
    )
    assert check.stdout.strip() == "False"


def test_train_then_resume(byte_data, tmp_path, cli_env):
    config = write_config(tmp_path, byte_data["mix"])
    run_dir = tmp_path / "run"
    out = llm_train([config, "--deepspeed", DS, "-o", run_dir], cli_env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        str(run_dir / "metrics.jsonl"),
        str(run_dir / "checkpoints" / "step_00000008"),
    ]
    assert "step      8/8 | loss" in out.stderr
    assert "Traceback" not in out.stderr
    first = losses(run_dir)
    assert len(first) == 8 and first[-1] < first[0] - 1.0
    assert (run_dir / "checkpoints" / "step_00000004" / "meta.json").exists()

    # The same folder again without --resume/--force: refused, nothing touched.
    again = llm_train([config, "--deepspeed", DS, "-o", run_dir], cli_env)
    assert again.returncode == 2
    assert "already holds a run" in again.stderr and "--resume auto" in again.stderr

    # Continue to step 10 on the same LR curve (schedule.total_steps fixed at 20).
    more = llm_train(
        [
            config,
            "--deepspeed",
            DS,
            "-o",
            run_dir,
            "--resume",
            "auto",
            "--json",
            "--set",
            "training.train_steps=10",
        ],
        cli_env,
    )
    assert more.returncode == 0, more.stderr
    result = json.loads(more.stdout)
    assert result["steps"] == 10 and result["checkpoint"].endswith("step_00000010")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["event"] for r in records if r["kind"] == "event"][:3] == ["start", "checkpoint", "checkpoint"]
    assert any(r.get("event") == "resume" for r in records)
    assert [r["step"] for r in records if r["kind"] == "train"] == list(range(1, 11))


def test_two_processes_equal_one_with_twice_the_accumulation(byte_data, tmp_path, cli_env):
    """torchrun --nproc_per_node 2 (micro 4, accumulation 1) == 1 process (micro 4, accumulation 2)."""
    from llmtools.train.config import load_train_config
    from llmtools.train.deepspeed_config import load_ds_config
    from llmtools.train.loop import RunOptions, train

    config = write_config(
        tmp_path,
        byte_data["mix"],
        checkpoint={"save_every": 0, "save_final": False},
        training={"train_steps": 6},
    )
    one = train(
        load_train_config(config), load_ds_config(DS), RunOptions(run_dir=tmp_path / "one", quiet=True)
    )
    assert one.steps == 6
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        "-m",
        "llmtools.cli.train",
        config,
        "--deepspeed",
        DS,
        "-o",
        tmp_path / "two",
    ]
    two = subprocess.run(list(map(str, torchrun)), env=cli_env, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    resolved = yaml.safe_load((tmp_path / "two" / "config.yaml").read_text())["resolved"]
    assert resolved["world_size"] == 2 and resolved["grad_accumulation"] == 1
    a, b = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert len(a) == len(b) == 6
    # fp32 AdamW trainings, gradients reduced in another order: last-bit (2^-24) update differences, summed over a few steps on a loss ~5: ~1e-6; 1e-5 leaves 10x
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5
    assert two.stdout.count("metrics.jsonl") == 1  # only rank 0 prints and writes


@pytest.mark.parametrize(
    "args, sections, message",
    [
        (["--set", "optimizer.learning_rate=1e-3"], {}, "unknown key optimizer.learning_rate"),
        ([], {"trainig": {"seed": 1}}, "unknown section 'trainig' (did you mean 'training'?)"),
        (["--set", "training.train_steps=many"], {}, "training.train_steps: expected integer"),
        (
            [],
            {"model": {"hidden_sise": 64}},
            "unknown key model.hidden_sise (did you mean 'model.hidden_size'?)",
        ),
        (
            ["--set", "model.vocab_size=128"],
            {},
            "tokenizer 'llmtools-byte' has 257 ids but the model's vocab_size is 128",
        ),
        (
            ["--set", "training.train_steps=5000", "--set", "schedule.total_steps=5000"],
            {},
            "the data ends before the requested steps",
        ),
        (["--set", "data.mix=nowhere/mix.json"], {}, "nowhere/mix.json: no such file"),
        (["--set", "data.seq_length=128"], {}, "data.seq_length=128 contradicts seq_length=64"),
        (["--set", "model.max_position_embeddings=32"], {}, "longer than model.max_position_embeddings=32"),
    ],
)
def test_bad_input_fails_before_compute(byte_data, tmp_path, cli_env, args, sections, message):
    config = write_config(tmp_path, byte_data["mix"])
    if sections:
        raw = yaml.safe_load(config.read_text())
        for name, values in sections.items():
            raw.setdefault(name, {}).update(values)
        config.write_text(yaml.safe_dump(raw))
    out = llm_train([config, "--deepspeed", DS, "-o", tmp_path / "run", *args], cli_env)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llm-train: error: "), out.stderr
    assert message in lines[0]
    assert not (tmp_path / "run").exists()  # nothing written: no compute started


def test_deepspeed_contradiction_names_both(byte_data, tmp_path, cli_env):
    config = write_config(tmp_path, byte_data["mix"])
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 16, "zero_optimization": {"stage": 1}}))
    out = llm_train([config, "--deepspeed", ds, "-o", tmp_path / "run"], cli_env)
    assert out.returncode == 2
    assert (
        f"{ds}[train_micro_batch_size_per_gpu]=16 contradicts training.micro_batch_size=4 in {config}"
        in out.stderr
    )
    assert not (tmp_path / "run").exists()


def test_dry_run_prints_resolved_deepspeed_config(byte_data, tmp_path, cli_env):
    config = write_config(tmp_path, byte_data["mix"])
    out = llm_train(
        [config, "--deepspeed", str(ROOT / "configs/deepspeed/zero3.json"), "--dry-run", "--json"], cli_env
    )
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["steps"] == 8 and plan["total_steps"] == 20 and plan["seq_length"] == 64
    assert plan["deepspeed"]["zero_optimization"]["stage"] == 3
    assert plan["deepspeed"]["train_batch_size"] == 8


def test_init_from_flag_is_model_init_from(byte_data, tmp_path, cli_env):
    """--init-from DIR is the spelled-out form of --set model.init_from=DIR (checked before compute)."""
    config = write_config(tmp_path, byte_data["mix"])
    missing = tmp_path / "no-such-hf-folder"
    zero0 = str(ROOT / "configs/deepspeed/zero0.json")
    by_flag = llm_train([config, "--deepspeed", zero0, "--dry-run", "--init-from", str(missing)], cli_env)
    by_set = llm_train(
        [config, "--deepspeed", zero0, "--dry-run", "--set", f"model.init_from={missing}"], cli_env
    )
    assert by_flag.returncode == 2 and by_set.returncode == 2, by_flag.stderr
    assert str(missing) in by_flag.stderr and "Traceback" not in by_flag.stderr
    assert by_flag.stderr == by_set.stderr
