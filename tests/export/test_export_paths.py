"""``llm-export hf`` with paths that are not UTF-8: any bytes the filesystem allows, in the input prefix,
the mix's sources, the sidecar's inputs and the output folder. The real console script, both layouts,
documents and packed rows, text and ``--json`` output: exit 0, the dataset card is valid UTF-8 (each
such byte shown as ``\\xNN``), and llmtools.json and ``--json`` give the exact bytes back (``bytes_b64``).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import shared

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

BIN = Path(sys.executable).parent


def _not_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


# A file name: any bytes but "/" and NUL, not "." or "..", and at least one sequence that is not UTF-8.
NAMES = (
    st.binary(min_size=1, max_size=10)
    .map(lambda raw: raw.replace(b"/", b"_").replace(b"\0", b"_"))
    .filter(lambda raw: raw not in (b".", b"..") and _not_utf8(raw))
)


def _bytes_of(value) -> bytes:
    return base64.b64decode(value["bytes_b64"]) if isinstance(value, dict) else os.fsencode(value)


def _dataset(folder: Path, name: bytes) -> Path:
    """A byte-tokenized prefix named ``name`` in ``folder``, its sidecar naming an input of that name."""
    from tests.train.conftest import write_byte_prefix

    source = folder / os.fsdecode(name + b".jsonl")
    lines = shared("tinyshakespeare/input.jsonl").read_text(encoding="utf-8").splitlines()[:40]
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return write_byte_prefix(source, folder / os.fsdecode(name + b"_text_document"))


def _mix(folder: Path, prefix: Path) -> Path:
    from llmtools.data import mix as mixlib

    config = mixlib.MixConfig(blend=mixlib.Blend([str(prefix)], [1.0]), seq_length=16, num_samples=20,
                              valid_samples=0, test_samples=0, split="100,0,0")  # fmt: skip
    path = folder / "mix.json"
    mixlib.save_plan(mixlib.build_plan(config), path)
    return path


# Real processes: no shrinking (each try is a process; the first failing example is reported as drawn).
@settings(max_examples=8, deadline=None, derandomize=True, database=None, phases=(Phase.explicit, Phase.generate),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    folder_name=NAMES,
    prefix_name=NAMES,
    output_name=NAMES,
    source=st.sampled_from(["prefix", "mix"]),
    layout=st.sampled_from(["arrow", "parquet"]),
    packed=st.booleans(),
    as_json=st.booleans(),
)
def test_paths_that_are_not_utf8(tmp_path_factory, folder_name, prefix_name, output_name, source, layout,
                                 packed, as_json):  # fmt: skip
    root = tmp_path_factory.mktemp("paths")
    folder = root / os.fsdecode(folder_name)
    folder.mkdir()
    prefix = _dataset(folder, prefix_name)
    given_source = _mix(folder, prefix) if source == "mix" else prefix
    output = root / os.fsdecode(output_name)
    args = [given_source, "-o", output, "--format", layout, "-q"]
    if packed and source == "prefix":
        args += ["--packed", "--seq-length", "16"]
    if as_json:
        args.append("--json")
    proc = subprocess.run([os.fsencode(BIN / "llm-export"), b"hf", *map(os.fsencode, args)],
                          capture_output=True, timeout=300)  # fmt: skip
    stderr = proc.stderr.decode("utf-8", "backslashreplace")
    assert proc.returncode == 0, stderr
    assert "internal error" not in stderr and "Traceback" not in stderr, stderr
    if as_json:
        assert _bytes_of(json.loads(proc.stdout)["output"]) == os.fsencode(output)
    else:
        assert proc.stdout.rstrip(b"\n") == os.fsencode(output)
    card = (output / "README.md").read_bytes().decode("utf-8")  # valid UTF-8, whatever the paths
    assert "\\x" in card and "\udc80" not in card
    manifest = json.loads((output / "llmtools.json").read_bytes().decode("utf-8"))
    assert _bytes_of(manifest["source"]["path"]) == os.fsencode(Path(given_source).resolve())
