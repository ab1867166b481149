"""The package as a user installs it: built as an sdist, a wheel built from that sdist, installed into a
fresh virtual environment with no source tree in sight, and run from an unrelated folder.

The fresh environment reuses this environment's third-party packages (a ``.pth`` line naming its
site-packages: a path line adds the folder, and the ``.pth`` files inside it, among them the editable
install's finder of this checkout, are not run), so the test builds nothing but llmtools itself. That
the installed copy is the one imported is checked (``llmtools.__file__`` lies in the fresh environment).
The chain: sample corpus -> tokenizer -> json2bin -> mix -> the shipped ``tiny`` train config by name (printed,
dry run) -> 5 training steps (the packaged ``tiny`` preset and ``zero2`` DeepSpeed config, by name) -> verify
-> convert -> load in transformers. Then the README's walkthrough, as printed, in a folder of its own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import pytest

from tests.conftest import REPO

COMMANDS = ("llm-prep", "llm-mix", "llm-export", "llm-train", "llm-ckpt", "llm-log")
SKIP_COPY = shutil.ignore_patterns(
    ".venv", ".git", "out", "runs", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
    ".hypothesis", ".ruff_cache", "*.so",
)  # fmt: skip


def _run(args, cwd, env=None, timeout=600) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, args))}\nexit {proc.returncode}\n{proc.stderr[-3000:]}"
    return proc


def _build(tmp: Path) -> tuple[Path, Path]:
    """(sdist, wheel): the sdist from a copy of the checkout, the wheel from the unpacked sdist."""
    source = tmp / "source"
    shutil.copytree(REPO, source, ignore=SKIP_COPY, symlinks=True)
    dist = tmp / "dist"
    dist.mkdir()
    build = "import sys, setuptools.build_meta as b; print(getattr(b, sys.argv[1])(sys.argv[2]))"
    name = _run([sys.executable, "-c", build, "build_sdist", str(dist)], cwd=source).stdout.split()[-1]
    sdist = dist / name
    with tarfile.open(sdist) as tar:
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python >= 3.10.12 / 3.11.4
        tar.extractall(tmp / "unpacked", **safe)
    (unpacked,) = (tmp / "unpacked").iterdir()
    wheel = _run([sys.executable, "-c", build, "build_wheel", str(dist)], cwd=unpacked).stdout.split()[-1]
    return sdist, dist / wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(bin folder, environment, unrelated working folder) of a fresh venv holding the built wheel."""
    tmp = tmp_path_factory.mktemp("wheel")
    sdist, wheel = _build(tmp)
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp)
    fresh_python = venv / "bin" / "python"
    purelib = Path(
        _run(
            [str(fresh_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp
        ).stdout.strip()
    )
    (purelib / "_project_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([str(fresh_python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], cwd=tmp)
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "VIRTUAL_ENV", "LLMTOOLS_MODEL_PRESETS")
    }
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
    )  # fmt: skip
    work = tmp / "elsewhere"
    work.mkdir()
    return sdist, venv, env, work


def test_the_sdist_carries_the_resources(installed):
    """The links in the checkout (llmtools/resources/* -> configs/, schemas/) become the files themselves."""
    sdist, *_ = installed
    with tarfile.open(sdist) as tar:
        members = {Path(*Path(m.name).parts[1:]).as_posix(): m for m in tar.getmembers()}
    for name in (
        "models/tiny.yaml",
        "train/tiny.yaml",
        "deepspeed/zero2.json",
        "schemas/metrics.schema.json",
    ):
        assert members[f"llmtools/resources/{name}"].isfile(), name


def test_the_installed_copy_is_imported_and_finds_its_resources(installed):
    _, venv, env, work = installed
    probe = (
        "import json, llmtools; from llmtools.resources import names; "
        "print(json.dumps([llmtools.__file__, names('models', '.yaml'), names('deepspeed', '.json'),"
        " names('schemas', '.json'), names('train', '.yaml')]))"
    )
    where, models, deepspeed, schemas, train = json.loads(
        _run([str(venv / "bin" / "python"), "-c", probe], cwd=work, env=env).stdout
    )
    assert Path(where).resolve().is_relative_to(venv.resolve()), where
    assert models == sorted(p.stem for p in (REPO / "configs" / "models").glob("*.yaml"))
    assert train == sorted(p.stem for p in (REPO / "configs" / "train").glob("*.yaml"))
    assert deepspeed == sorted(p.stem for p in (REPO / "configs" / "deepspeed").glob("*.json"))
    assert schemas == sorted(p.stem for p in (REPO / "schemas").glob("*.json"))


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_answers_help_and_version(installed, command):
    _, venv, env, work = installed
    assert (venv / "bin" / command).exists()
    help_ = _run([command, "--help"], cwd=work, env=env)
    assert "Usage:" in help_.stdout and "--version" in help_.stdout
    from llmtools import __version__

    assert _run([command, "--version"], cwd=work, env=env).stdout == f"{command} {__version__}\n"


def test_the_chain_runs_from_an_unrelated_folder(installed):
    _, venv, env, work = installed

    def run(*args):
        return _run(list(args), cwd=work, env=env)

    run("llm-prep", "sample-corpus", "-o", "raw", "--docs", "300", "--seed", "1")
    run(
        "llm-prep",
        "tokenizer",
        "train",
        "raw/stories.jsonl",
        "raw/arith.jsonl",
        "--vocab-size",
        "300",
        "-o",
        "tok.json",
    )
    run("llm-prep", "json2bin", "raw/stories.jsonl", "-t", "tok.json", "-o", "data/stories", "--append-eod")
    run(
        "llm-mix", "data/stories_text_document", "--seq-length", "32", "--num-samples", "64", "-o", "mix.json"
    )
    # The shipped train configs by name, as the README and --help name them.
    for name in ("tiny", "default"):
        printed = run("llm-train", "--print-config", name).stdout
        assert name == "default" or printed == (REPO / "configs" / "train" / "tiny.yaml").read_text()
    run("llm-train", "tiny", "--deepspeed", "zero2", "--dry-run", "--set", "data.mix=mix.json",
        "--set", "training.train_steps=4", "--set", "schedule.warmup_steps=0")  # fmt: skip
    unknown = subprocess.run(["llm-train", "tinyy", "--deepspeed", "zero2"], cwd=work, env=env, capture_output=True,
                             text=True)  # fmt: skip
    assert (
        unknown.returncode == 2 and "did you mean 'tiny'?" in unknown.stderr and "tiny-sft" in unknown.stderr
    )
    (work / "train.yaml").write_text(
        "model: {preset: tiny, vocab_size: 384, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1,\n"
        "        num_attention_heads: 2, num_key_value_heads: 1}\n"
        "data: {mix: mix.json}\n"
        "training: {micro_batch_size: 2, global_batch_size: 2, train_steps: 5, precision: fp32}\n"
        "optimizer: {lr: 1.0e-3}\nschedule: {kind: constant}\neval: {every: 0}\n"
        "logging: {log_every: 1}\ncheckpoint: {save_every: 5}\n"
    )
    result = json.loads(run("llm-train", "train.yaml", "--deepspeed", "zero2", "-o", "run", "--json").stdout)
    assert result["steps"] == 5 and result["checkpoint"]
    run("llm-ckpt", "verify", "run")
    run("llm-ckpt", "convert", "run", "--to", "hf", "-o", "hf", "--tokenizer", "tok.json")
    load = (
        "import transformers; m = transformers.AutoModelForCausalLM.from_pretrained('hf'); "
        "print(m.config.vocab_size)"
    )
    assert run(str(venv / "bin" / "python"), "-c", load).stdout.split()[-1] == "384"


def test_the_readme_walkthrough_runs_from_an_unrelated_folder(installed):
    """The README's walkthrough, line by line as printed, against the installed wheel in a folder holding only
    the user's data (two JSONL files, a tokenizer folder): no file of the source tree is in reach. The
    changes are those of tests/contract/test_examples.py (``adapt``: a training line runs as ``--dry-run``,
    the port is a free one), and the run the later steps read is trained for two steps of a very small model
    before them (``walkthrough_run``, with the installed llm-train)."""
    from tests.conftest import SHARED_DATA
    from tests.contract.test_examples import (
        NOT_HERE,
        README,
        adapt,
        section_examples,
        walkthrough_inputs,
        walkthrough_run,
    )

    if not (SHARED_DATA / "tokenizers" / "gpt2" / "tokenizer.json").exists():
        pytest.skip("needs the shared data folder beside the repo (GPT-2's tokenizer)")
    _, venv, env, work = installed
    folder = work / "walkthrough"
    folder.mkdir()
    walkthrough_inputs(folder)
    # torch's own torchrun, run by the fresh environment's python (a user's environment has it beside llm-train)
    torchrun = venv / "bin" / "torchrun"
    torchrun.write_text(
        f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom torch.distributed.run import main\nsys.exit(main())\n"
    )
    torchrun.chmod(0o755)
    commands = section_examples(README, "Walkthrough")
    assert any(c.startswith("llm-train --print-config") for c in commands), commands
    trained = False
    for command in commands:
        if any(command.startswith(p) for p in NOT_HERE):
            continue
        if command.startswith("llm-ckpt") and not trained:
            walkthrough_run(folder, venv / "bin", env)
            trained = True
        adapted, _ = adapt(command)
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", adapted], cwd=folder, env=env, capture_output=True,
                              text=True, timeout=900)  # fmt: skip
        assert proc.returncode == 0, f"{adapted}\nexit {proc.returncode}\n{proc.stderr[-3000:]}"
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert trained and (folder / "hf" / "my" / "config.json").is_file()
    assert not (folder / "configs").exists()


# The --help examples that need more than one machine (each run elsewhere: tests/multihost, tests/train/test_slurm.py).
HELP_NOT_HERE = ("srun ", "deepspeed --hostfile", "torchrun --nnodes", "llm-train --nnodes")
SOURCE_TREE = ("configs/", "schemas/", "tests/", "benchmarks/", "mk/", "docs/")


def help_examples(text: str) -> list[str]:
    """The command lines under ``Examples:`` of a --help text (continuations joined, comments dropped)."""
    if "Examples:" not in text:
        return []
    body = text.split("Examples:", 1)[1]
    body = re.split(r"\n\s*(Arguments|Options|Commands):", body, maxsplit=1)[0]
    body = re.sub(r"\\\n\s*", " ", body)
    lines = (re.sub(r"\s+#(?![^'\"]*['\"]).*$", "", line).strip() for line in body.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _all_help(env, work) -> dict[str, str]:
    """Every --help text of the installed commands and their subcommands."""
    texts = {}
    for command in COMMANDS:
        top = _run([command, "--help"], cwd=work, env=env).stdout
        texts[command] = top
        if "Commands" in top:
            listed = top.split("Commands", 1)[1]
            for sub in re.findall(r"^[│ ]\s+([a-z][a-z0-9-]+)\s", listed, re.M):
                texts[f"{command} {sub}"] = _run([command, sub, "--help"], cwd=work, env=env).stdout
    return texts


def test_no_help_example_needs_a_file_of_the_source_tree(installed):
    _, venv, env, work = installed
    texts = _all_help(env, work)
    assert len(texts) > len(COMMANDS)  # the subcommands were found
    found = [
        f"{where}: {line}"
        for where, text in texts.items()
        for line in help_examples(text)
        if any(part in line for part in SOURCE_TREE)
    ]
    assert not found, "--help examples that read a file an installed package does not have:\n" + "\n".join(
        found
    )


def test_llm_train_help_examples_run_from_an_unrelated_folder(installed):
    """Each example of ``llm-train --help`` on one machine, as printed (a training as ``--dry-run``, the
    ports free ones: tests/contract/test_examples.py's ``adapt``), against the wheel, in a folder holding only
    the mixes they name (``out/pretrain/mix.json``, make pretrain's place, ``out/mix.json``, ``out/mix2.json``)."""
    from tests.contract.test_examples import adapt

    _, venv, env, work = installed
    folder = work / "help-examples"
    (folder / "out" / "pretrain").mkdir(parents=True)
    for launcher, module in (
        ("torchrun", "torch.distributed.run"),
        ("deepspeed", "deepspeed.launcher.runner"),
    ):
        shim = venv / "bin" / launcher  # the launcher's console script, run by the fresh environment's python
        shim.write_text(
            f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom {module} import main\nsys.exit(main())\n"
        )
        shim.chmod(0o755)
    run = lambda *args: _run(list(args), cwd=folder, env=env)  # noqa: E731
    run("llm-prep", "sample-corpus", "-o", "raw", "--docs", "300", "--seed", "1")
    run("llm-prep", "json2bin", "raw/stories.jsonl", "-t", "byte", "-o", "data/stories", "--append-eod")
    run("llm-mix", "data/stories_text_document", "--seq-length", "128", "--num-samples", "3200",
        "--valid-samples", "64", "-o", "out/pretrain/mix.json")  # fmt: skip
    for name in ("mix.json", "mix2.json"):
        run("llm-mix", "data/stories_text_document", "--seq-length", "128", "--num-samples", "3200",
            "--valid-samples", "64", "-o", f"out/{name}")  # fmt: skip
    examples = help_examples(run("llm-train", "--help").stdout)
    assert any(e.startswith("llm-train tiny --deepspeed zero2") for e in examples), examples
    ran = 0
    for example in examples:
        if example.startswith(HELP_NOT_HERE):
            continue
        adapted, _ = adapt(example)
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", adapted], cwd=folder, env=env, capture_output=True,
                              text=True, timeout=600)  # fmt: skip
        assert proc.returncode == 0, f"{adapted}\nexit {proc.returncode}\n{proc.stderr[-3000:]}"
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        ran += 1
    assert ran >= 10, ran
