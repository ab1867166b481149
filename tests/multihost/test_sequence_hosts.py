"""``parallel.sequence: 2`` with the two ranks of a group on two hosts (network namespaces, one torchrun
agent each): DeepSpeed-Ulysses' all-to-all of attention heads crosses the link every layer, and the run
equals the same group on one host with two processes, loss for loss, and one rank holding whole
sequences."""

from __future__ import annotations

import sys

import pytest

from tests.multihost.jobs import REPO, host_env
from tests.multihost.test_elastic import losses, run_job, train_program, write_config

pytestmark = pytest.mark.slow


def test_a_sequence_parallel_group_across_two_hosts_trains_as_on_one(hosts, byte_data, tmp_path):
    data = {"reset_attention_mask": True, "reset_position_ids": True, "eod_mask_loss": True}
    config = write_config(
        tmp_path, byte_data["mix"], steps=6, save_every=0, parallel={"sequence": 2}, data=data
    )
    two = tmp_path / "two_hosts"
    run_job(hosts, tmp_path / "job", train_program(config, 2, two))

    one = tmp_path / "one_host"
    single = hosts[0].run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "--rdzv-endpoint", "localhost:21012", *train_program(config, 2, one)],
        env=host_env({"GLOO_SOCKET_IFNAME": "lo"}), cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert single.returncode == 0, single.stderr[-3000:]
    assert losses(two) == losses(one) and len(losses(two)) == 6  # the same ranks, the same sums: identical
    # and one rank holding whole sequences (sequence: 1): the same losses up to summation order
    whole = tmp_path / "one_rank"
    (tmp_path / "c1").mkdir()
    config1 = write_config(tmp_path / "c1", byte_data["mix"], steps=6, save_every=0, data=data)
    plain = hosts[0].run([sys.executable, *train_program(config1, 2, whole)], env=host_env(), cwd=REPO,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert plain.returncode == 0, plain.stderr[-3000:]
    # fp32; attention over two head groups and the loss in two halves: the same sums in another order
    assert max(abs(losses(two)[s] - losses(whole)[s]) for s in range(1, 7)) < 1e-5
