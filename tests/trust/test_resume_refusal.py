"""A newest checkpoint that our safe reader refuses although its checksums match (someone re-signed
meta.json) stops ``llm-train --resume auto`` with exit 2 naming the file: it is never skipped for an older
step, whose training would then replace the hostile one and whose pruning could delete good ones."""

from __future__ import annotations

import pytest

from tests.trust.bombs import with_item
from tests.trust.conftest import cli, error_line, rehash, snapshot
from tests.trust.zipcraft import records_of, write

STEP4 = "checkpoints/step_00000004"
OPTIM = f"{STEP4}/zero_pp_rank_0_mp_rank_00_optim_states.pt"


def _compress_a_storage(records):
    storage = next(name for name, _ in records if "/data/" in name)
    return records, {storage}


def _bomb(records):
    return [(n, with_item(d, "doubling") if n.endswith("/data.pkl") else d) for n, d in records], set()


@pytest.mark.parametrize("plant", [_compress_a_storage, _bomb], ids=["compressed-storage", "pickle-bomb"])
def test_resume_auto_stops_at_a_refused_checkpoint(run, env, train_files, plant):
    records, compress = plant(records_of(run / OPTIM))
    write(run / OPTIM, records, compress=compress)
    rehash(run / STEP4)
    before = snapshot(run / "checkpoints")
    config, ds = train_files
    proc = cli("train", config, "--deepspeed", ds, "-o", run, "--resume", "auto", env=env, timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert str(run / OPTIM) in error_line(proc)
    assert "resumed from" not in proc.stderr
    assert snapshot(run / "checkpoints") == before
