"""Paths read from files stay inside their folder: ``latest``, meta.json's file list (and symlinks), HF shard
indexes, mix.json's cache names; a file present but not listed fails verification; convert verifies what
it reads. Every case runs the real command.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

from tests.trust.conftest import cli, error_line, rehash, snapshot

STEP2, STEP4 = "checkpoints/step_00000002", "checkpoints/step_00000004"
MODEL = "mp_rank_00_model_states.pt"
RNG = "rng_rank0000.pt"


def _meta(folder):
    return json.loads((folder / "meta.json").read_text())


def _write_meta(folder, meta):
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))


def test_latest_pointing_out_of_the_run_is_refused_before_any_compute(run, env, train_files, tmp_path):
    config, ds = train_files
    foreign = tmp_path / "other"
    shutil.copytree(run, foreign)
    before = (run / "metrics.jsonl").read_bytes()
    for tag in (f"../../{foreign.name}/{STEP4}", str(foreign / STEP4)):
        (run / "checkpoints" / "latest").write_text(tag + "\n")
        proc = cli("train", config, "--deepspeed", ds, "-o", run, "--resume", "latest", env=env)
        assert proc.returncode == 2
        assert "latest: names" in error_line(proc) and "not a checkpoint folder of this run" in proc.stderr
        assert "Loss" not in proc.stderr and (run / "metrics.jsonl").read_bytes() == before


def test_a_step_folder_symlinked_out_of_the_run_is_refused(run, env, train_files, tmp_path):
    foreign = tmp_path / "other"
    shutil.copytree(run / STEP4, foreign)
    (run / "checkpoints" / "step_00000006").symlink_to(foreign, target_is_directory=True)
    proc = cli("ckpt", "verify", run, env=env)
    assert proc.returncode == 2 and "step_00000006: a symlink out of" in error_line(proc)
    config, ds = train_files
    proc = cli("train", config, "--deepspeed", ds, "-o", run, "--resume", "6", env=env)
    assert proc.returncode == 2 and "step_00000006: a symlink out of" in error_line(proc)


def test_meta_json_naming_files_outside_the_folder(run, env):
    folder = run / STEP4
    original = _meta(folder)
    secret = "/etc/passwd"
    for name in (secret, "../../metrics.jsonl", f"../{STEP2.split('/')[1]}/{MODEL}"):
        meta = json.loads(json.dumps(original))
        meta["files"][name] = {"size": 1, "sha256": "0" * 64}
        _write_meta(folder, meta)
        proc = cli("ckpt", "verify", folder, env=env)
        line = error_line(proc)
        assert proc.returncode == 2 and "lies outside" in line and name in line, line
        assert "size" not in line  # nothing about the named file is read, not even its size


def test_a_listed_file_that_is_a_symlink_out_is_refused(run, env, tmp_path):
    folder = run / STEP4
    outside = tmp_path / "elsewhere.pt"
    shutil.copyfile(folder / RNG, outside)  # same bytes, same checksum: only where it lies differs
    (folder / RNG).unlink()
    (folder / RNG).symlink_to(outside)
    proc = cli("ckpt", "verify", folder, env=env)
    assert proc.returncode == 2 and "is a symlink out of" in error_line(proc) and RNG in proc.stderr


def test_a_file_present_but_not_listed_fails(run, env):
    """Weights removed from the list, then corrupted: verify used to say ok."""
    folder = run / STEP4
    meta = _meta(folder)
    del meta["files"][MODEL]
    _write_meta(folder, meta)
    with open(folder / MODEL, "r+b") as handle:
        handle.seek(2000)
        handle.write(b"\xff" * 64)
    proc = cli("ckpt", "verify", folder, env=env)
    assert proc.returncode == 2 and "not listed in meta.json" in error_line(proc) and MODEL in proc.stderr
    meta["files"][MODEL] = json.loads((run / STEP2 / "meta.json").read_text())["files"][MODEL]  # any entry
    _write_meta(folder, meta)
    (folder / "extra_optim_states.pt").write_bytes(b"planted")  # a file no save writes, and no list names
    proc = cli("ckpt", "verify", folder, env=env)
    assert proc.returncode == 2 and "extra_optim_states.pt: present but not listed" in error_line(proc)


def test_convert_verifies_an_explicit_step_folder(run, env, tmp_path):
    folder = run / STEP4
    with open(folder / MODEL, "r+b") as handle:
        handle.seek(os.path.getsize(folder / MODEL) - 100)
        handle.write(b"\x00" * 8)
    for target in ("hf", "safetensors"):
        out = tmp_path / f"out-{target}"
        proc = cli("ckpt", "convert", folder, "--to", target, "-o", out, env=env)
        assert proc.returncode == 2 and "sha256 differs from meta.json (corrupt)" in error_line(proc)
        assert not out.exists()


def test_import_hf_refuses_a_shard_index_naming_files_outside(run, env, tmp_path):
    import pytest

    from llmtools.ckpt.convert import to_hf
    from llmtools.errors import InputError
    from llmtools.model.hf import load_hf_state_dict

    hf = to_hf(run / STEP4, tmp_path / "hf", shard_size="40KB")
    index_path = hf / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = sorted(set(index["weight_map"].values()))[0]
    outside = tmp_path / "outside.safetensors"
    shutil.move(hf / shard, outside)

    def name(bad: str) -> None:
        index_path.write_text(
            json.dumps(
                {
                    **index,
                    "weight_map": {k: (bad if v == shard else v) for k, v in index["weight_map"].items()},
                }
            )
        )

    name(str(outside))  # an absolute path: the command
    out = tmp_path / "imported"
    proc = cli("ckpt", "import-hf", hf, "-o", out, env=env)
    assert proc.returncode == 2 and "lies outside" in error_line(proc) and str(outside) in proc.stderr
    assert not out.exists()
    name(f"../{outside.name}")  # climbing out: the same reader, in this process
    with pytest.raises(InputError, match=r"weight_map\]: '\.\./outside\.safetensors' lies outside"):
        load_hf_state_dict(hf)


def test_mix_cache_names_stay_inside_the_mix_folder(trust_data, env, tmp_path):
    folder = tmp_path / "mixdir"
    shutil.copytree(trust_data["folder"], folder)
    mix_path = folder / "mix.json"
    mix = json.loads(mix_path.read_text())
    name = mix["cache"]["files"]["train"]["dataset_index"]
    base = name.rsplit("/", 1)[-1]  # the file's name, out of its cache folder
    shutil.copyfile(folder / name, tmp_path / base)  # a valid array, outside the mix's folder
    mix["cache"]["files"]["train"]["dataset_index"] = f"../{base}"
    mix_path.write_text(json.dumps(mix))
    proc = cli("export", "hf", mix_path, "-o", tmp_path / "out", env=env)
    assert proc.returncode == 2 and "lies outside" in error_line(proc) and "cache.files.train" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_rehashed_checkpoint_still_verifies(run, env):
    """The tests above are refusals for their stated reason: the untouched run verifies (exit 0)."""
    rehash(run / STEP4)  # no change: the same checksums
    before = snapshot(run)
    proc = cli("ckpt", "verify", run, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count(": ok") == 2 and snapshot(run) == before
    digest = hashlib.sha256((run / STEP4 / MODEL).read_bytes()).hexdigest()
    assert _meta(run / STEP4)["files"][MODEL]["sha256"] == digest
