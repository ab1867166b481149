"""The "resume with:" line printed on a stop reproduces how the job was started: under torchrun the
launcher with its own arguments (read from the agent's command line), under the deepspeed launcher its
runner, under Slurm a requeue of the job, else the plain command; and it runs as printed."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtools.ckpt.launch import launcher_argv, resume_command
from tests.ports import free_port
from tests.train.conftest import TINY

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_the_plain_command_and_slurm():
    argv = ["/venv/bin/llm-train", "c.yaml", "-o", "run dir", "--force", "--resume", "3"]
    assert resume_command(env={}, argv=argv) == "llm-train c.yaml -o 'run dir' --resume auto"
    assert launcher_argv(env={"SLURM_JOB_ID": "4242"}, argv=argv) == ("slurm", ["4242"])
    assert resume_command(env={"SLURM_JOB_ID": "4242"}, argv=argv).startswith("scontrol requeue 4242 ")


_WORDS = st.text(alphabet="ab -m'$\"x./=", min_size=1, max_size=6)
_OPTIONS = st.lists(
    st.sampled_from([["-u"], ["-X", "dev"], ["-W", "ignore"], ["-Xutf8"], ["-O"], ["-I"], ["-B"]]), max_size=3
)


@settings(max_examples=200, deadline=None)
@given(
    python=st.sampled_from(["python", "python3", "/venv/bin/python3.12", "./.venv/bin/python"]),
    options=_OPTIONS,
    args=st.lists(_WORDS, max_size=5),
    module=st.sampled_from(["llmtools.cli.train", "llmtools.cli"]),
)
def test_under_python_m_the_hint_is_the_interpreter_line(python, options, args, module):
    """Under ``python [options] -m MODULE ...`` sys.argv[0] is the module's file: the hint is the
    interpreter's line as typed (a command), not ``train.py``; arguments that look like ``-m`` are ours."""
    flat = [word for option in options for word in option]
    argv = [f"/site-packages/{module.replace('.', '/')}.py", *args]
    orig = [python, *flat, "-m", module, *args]
    hint = shlex.split(resume_command(env={}, argv=argv, orig_argv=orig))
    kept = [a for a in args if a not in ("--force", "--rollback")]
    assert hint[: len(flat) + 3] == [python, *flat, "-m", module], hint
    assert hint[len(flat) + 3 :] == [*kept, "--resume", "auto"], hint
    # the console script: an argument of ours spelled -m is never read as the interpreter's
    script = ["/venv/bin/llm-train", *args]
    assert shlex.split(resume_command(env={}, argv=script, orig_argv=["/venv/bin/python", *script]))[0] == (
        "llm-train"
    )


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _long_run_config(folder: Path, mix: str) -> Path:
    """A run far longer than the test waits: it is stopped by a signal, never by its end."""
    config = folder / "train.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"preset": "tiny", **TINY}, "data": {"mix": mix},
        "training": {"micro_batch_size": 2, "global_batch_size": 4, "train_steps": 1500},
        "schedule": {"kind": "constant"}, "logging": {"log_every": 1}, "checkpoint": {"save_every": 0},
        "eval": {"every": 0},
    }))  # fmt: skip
    return config


def _start_and_wait_for_a_step(launch: list[str], cwd: Path, env: dict) -> subprocess.Popen:
    """The launcher started, once its run logged a training step (or it ended, or 300 s passed)."""
    proc = subprocess.Popen(launch, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    metrics = cwd / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and '"train"' in metrics.read_text():
            break
        time.sleep(0.2)
    return proc


def _resume_as_printed(hint: str, stopped_output: str, cwd: Path, env: dict) -> None:
    """Paste the hint as printed (two more steps than were done, so it ends by itself): it resumes."""
    stopped = int(re.search(r"checkpoints/step_(\d+)", stopped_output).group(1))
    resumed = subprocess.run(
        [*shlex.split(hint), "--set", f"training.train_steps={stopped + 2}"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"step_{stopped + 2:08d}" in resumed.stdout


def test_under_torchrun_the_hint_is_the_torchrun_line_and_it_resumes(byte_data, tmp_path, cli_env):
    config = _long_run_config(tmp_path, byte_data["mix"])
    port = free_port()
    launch = [str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", str(port), "-m", "llmtools.cli.train",
              str(config), "--deepspeed", str(ROOT / "configs/deepspeed/zero1.json"), "-o", "run", "--force"]  # fmt: skip
    env = {**cli_env, "PATH": f"{BIN}{os.pathsep}{cli_env['PATH']}"}
    proc = _start_and_wait_for_a_step(launch, tmp_path, env)
    for worker in _children(proc.pid):  # as Slurm or a scheduler signals every task
        os.kill(worker, signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    err = err.decode()
    hints = re.findall(r"resume with: (.*)", err)
    assert hints, err[-3000:]
    hint = hints[0]
    assert hint.startswith(f"torchrun --nproc_per_node 2 --master_port {port} -m llmtools.cli.train "), hint
    assert hint.endswith(" --resume auto") and "--force" not in hint
    _resume_as_printed(hint, err, tmp_path, env)


def _descendants(pid: int) -> list[int]:
    found = []
    for child in _children(pid):
        found += [child, *_descendants(child)]
    return found


def test_under_the_deepspeed_launcher_the_hint_is_its_runner_line_and_it_resumes(
    byte_data, tmp_path, cli_env
):
    """The deepspeed launcher runs ``deepspeed`` -> ``deepspeed.launcher.launch`` -> a worker per rank
    (``python -u llm-train --local_rank=N ...``): the hint is the ``deepspeed`` line, and it resumes."""
    config = _long_run_config(tmp_path, byte_data["mix"])
    port = free_port()
    launch = [str(BIN / "deepspeed"), "--num_gpus", "2", "--master_port", str(port), str(BIN / "llm-train"),
              str(config), "--deepspeed", str(ROOT / "configs/deepspeed/zero1.json"), "-o", "run", "--force"]  # fmt: skip
    env = {**cli_env, "PATH": f"{BIN}{os.pathsep}{cli_env['PATH']}"}
    proc = _start_and_wait_for_a_step(launch, tmp_path, env)
    workers = [
        pid for pid in _descendants(proc.pid) if "--local_rank=" in Path(f"/proc/{pid}/cmdline").read_text()
    ]
    assert len(workers) == 2, workers
    for worker in workers:  # as a scheduler signals every task
        os.kill(worker, signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    both = out.decode() + err.decode()
    hints = re.findall(r"resume with: (.*)", both)
    assert hints, both[-3000:]
    hint = hints[0]
    assert hint.startswith(f"deepspeed --num_gpus 2 --master_port {port} {BIN / 'llm-train'} "), hint
    assert hint.endswith(" --resume auto") and "--force" not in hint and "--local_rank" not in hint, hint
    _resume_as_printed(hint, both, tmp_path, env)


def test_under_python_m_the_hint_runs_as_printed(byte_data, tmp_path, cli_env):
    """``python -m llmtools.cli.train ...`` stopped by SIGTERM: the hint is that line, and it resumes."""
    config = _long_run_config(tmp_path, byte_data["mix"])
    launch = [sys.executable, "-m", "llmtools.cli.train", str(config), "--deepspeed",
              str(ROOT / "configs/deepspeed/zero1.json"), "-o", "run", "--force"]  # fmt: skip
    proc = _start_and_wait_for_a_step(launch, tmp_path, cli_env)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    err = err.decode()
    hints = re.findall(r"resume with: (.*)", err)
    assert hints, err[-3000:]
    assert hints[0] == shlex.join([*launch[:-1], "--resume", "auto"]), hints[0]
    _resume_as_printed(hints[0], err, tmp_path, cli_env)
