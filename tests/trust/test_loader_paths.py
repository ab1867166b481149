"""Every way a checkpoint reaches a loader, with a `.pt` that two zip readers read differently.

The planted model-states file holds two ``data.pkl`` records: the first (which torch's reader finds) runs
``touch MARKER`` when unpickled freely; the second, named ``data.pkl`` followed by a NUL byte, is what
Python's ``zipfile`` (which cuts names at NUL and keeps the last of equal names) returns for ``data.pkl``.
meta.json is re-signed, so only the archive check stands between the file and the loaders: DeepSpeed's
engine, ``ds_to_universal`` (``convert --to universal``, ``--reshard``), ``zero_to_fp32`` and our own
readers. Each command must exit 2 naming the file, and the marker must never appear.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.trust.conftest import cli, error_line, payload_pickle, rehash, snapshot
from tests.trust.zipcraft import records_of, write

STEP4 = "checkpoints/step_00000004"
MODEL = f"{STEP4}/mp_rank_00_model_states.pt"


def plant_ambiguous(pt_file, marker) -> None:
    records = records_of(pt_file)
    pkl = next(name for name, _ in records if name.endswith("/data.pkl"))
    good = dict(records)[pkl]
    rest = [(name, data) for name, data in records if name != pkl]
    write(pt_file, [(pkl, payload_pickle(good, marker)), *rest, (pkl + "\0", good)])


@pytest.fixture
def ambiguous(run, marker):
    plant_ambiguous(run / MODEL, marker)
    rehash(run / STEP4)
    return run


def test_control_the_two_readers_disagree_and_torch_runs_the_payload(ambiguous, marker, env):
    import zipfile

    with zipfile.ZipFile(ambiguous / MODEL) as archive:  # what a check built on zipfile would read
        pkl = next(n for n in archive.namelist() if n.endswith("/data.pkl"))
        assert b"system" not in archive.read(pkl)
    code = "import sys, torch; torch.load(sys.argv[1], weights_only=False)"
    subprocess.run(
        [sys.executable, "-c", code, str(ambiguous / MODEL)], env=env, timeout=300, capture_output=True
    )
    assert marker.exists()


def _commands(run, out, train_files):
    config, ds = train_files
    zero2 = REPO / "configs" / "deepspeed" / "zero2.json"
    step = run / STEP4
    return {
        "verify": ("ckpt", "verify", step),
        "inspect": ("ckpt", "inspect", step),
        "convert-hf": ("ckpt", "convert", step, "--to", "hf", "-o", out / "hf"),
        "convert-safetensors": ("ckpt", "convert", step, "--to", "safetensors", "-o", out / "m.safetensors"),
        "convert-universal": ("ckpt", "convert", step, "--to", "universal", "-o", out / "universal"),
        "resume-auto": ("train", config, "--deepspeed", ds, "-o", run, "--resume", "auto"),
        "resume-reshard": ("train", config, "--deepspeed", zero2, "-o", run, "--resume", "auto", "--reshard"),
        "init-from": ("train", config, "--deepspeed", zero2, "-o", out / "fresh", "--init-from", step),
    }


PATHS = [
    "verify",
    "inspect",
    "convert-hf",
    "convert-safetensors",
    "convert-universal",
    "resume-auto",
    "resume-reshard",
    "init-from",
]


@pytest.mark.parametrize("path", PATHS)
def test_every_loader_path_refuses_the_ambiguous_archive(ambiguous, marker, env, train_files, tmp_path, path):
    out = tmp_path / "out"
    out.mkdir()
    before = snapshot(ambiguous / "checkpoints")
    proc = cli(*_commands(ambiguous, out, train_files)[path], env=env, timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = error_line(proc)
    assert str(ambiguous / MODEL) in line, line
    assert not marker.exists(), "the payload ran"
    assert snapshot(ambiguous / "checkpoints") == before
    assert list(out.iterdir()) == []
