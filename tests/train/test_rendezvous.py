"""A fresh store namespace per restart round, even when the store still holds every earlier round's keys
(torchrun's agent store outlives its workers)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest


def _store():
    import torch.distributed as dist

    return dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )


def _client(server):
    """One client per rank, as every worker process has its own."""
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30))


def _round(store, world: int, delays: dict[int, float] | None = None) -> list[str]:
    import time

    from llmtools.train.rendezvous import agree_on_token

    tokens: list[str | None] = [None] * world
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            time.sleep((delays or {}).get(r, 0.0))
            tokens[r] = agree_on_token(_client(store), r, world, timeout_s=30)
        except BaseException as error:  # noqa: BLE001 - surfaced below
            errors.append(error)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    return tokens


@pytest.mark.parametrize("late", ["rank 0 late", "others late"])
def test_every_round_agrees_on_a_token_no_earlier_round_used(late):
    store = _store()
    seen = set()
    for round_ in range(4):
        # The race that hung the restarts: the new rank 0 arrives after the others read the store, or before.
        delays = {0: 0.3} if late == "rank 0 late" else {1: 0.3, 2: 0.2}
        tokens = _round(store, world=3, delays=delays if round_ else None)
        assert len(set(tokens)) == 1, f"round {round_}: {tokens}"
        assert tokens[0] not in seen, f"round {round_} reused an earlier round's namespace"
        seen.add(tokens[0])


def test_one_rank_needs_no_store():
    from llmtools.train.rendezvous import agree_on_token

    assert len(agree_on_token(None, 0, 1, timeout_s=1)) == 32


def test_rank_0_gives_up_after_the_timeout():
    from llmtools.errors import RuntimeFailure
    from llmtools.train.rendezvous import agree_on_token

    store = _store()
    store.set("llmtools/round/hello/1", "stale-nonce-of-a-dead-rank")
    with pytest.raises(RuntimeFailure, match=r"did not all join within 0.5 s \(distributed.timeout_s\)"):
        agree_on_token(store, 0, 2, timeout_s=0.5)
