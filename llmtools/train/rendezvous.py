"""A store namespace of our own for each restart round under torchrun's elastic agent.

Since torch 2.4 the c10d rendezvous handler of ``torchrun`` keeps ONE TCPStore server per agent for the
whole job and hands it to every generation of workers (``TORCHELASTIC_USE_AGENT_STORE=True``), without a
per-round prefix (pytorch/pytorch#135712: the restart count that was meant to separate rounds is counted
per agent, so agents disagree on it). The keys the previous workers wrote — among them the gloo/NCCL
addresses of every rank of the default process group — are still there when the restarted workers look
them up; a worker that looks before its peer has overwritten its key connects to the address of a process
that no longer exists ("Connection refused"), fails, and costs its agent one of ``--max-restarts``. The
agents' budgets drift apart until one gives up and the other waits for it: the hang that half of our
two-host restarts ended in.

:func:`round_store` gives the workers of one round a prefix no earlier round used. Rank 0 draws a random
token; every other rank draws a random nonce, publishes it under its rank, and waits for the answer under
a key that names its nonce — a key no earlier round can have written. Rank 0 answers every nonce it sees
(a stale one is answered harmlessly: no live process waits for it) until all ranks have confirmed the
token. Three store round trips per poll, whatever the world size. Every worker of an earlier round is dead
by then: an agent joins the next round only after stopping its own workers.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

from llmtools.errors import RuntimeFailure

PREFIX = "llmtools/round"


def _hello(rank: int) -> str:
    return f"{PREFIX}/hello/{rank}"


def agree_on_token(store, rank: int, world_size: int, timeout_s: float, poll_s: float = 0.005) -> str:
    """A token shared by exactly the ranks of this round; ``store`` may hold any earlier round's keys."""
    if world_size == 1:
        return uuid.uuid4().hex
    if rank != 0:
        nonce = uuid.uuid4().hex
        store.set(_hello(rank), nonce)
        token = store.get(f"{PREFIX}/ack/{rank}/{nonce}").decode()  # waits up to the store's timeout
        store.add(f"{PREFIX}/ready/{token}", 1)
        return token
    token = uuid.uuid4().hex
    others = list(range(1, world_size))
    hello_keys = [_hello(r) for r in others]
    answered: dict[int, bytes] = {}
    deadline = time.monotonic() + timeout_s
    while store.add(f"{PREFIX}/ready/{token}", 0) < len(others):
        if time.monotonic() > deadline:
            raise RuntimeFailure(
                f"rank 0: the other {len(others)} rank(s) did not all join within {timeout_s:g} s "
                "(distributed.timeout_s)"
            )
        nonces = store.multi_get(hello_keys)  # waits until every rank has published one (stale or fresh)
        fresh = [(r, n) for r, n in zip(others, nonces, strict=True) if answered.get(r) != n]
        if fresh:
            store.multi_set([f"{PREFIX}/ack/{r}/{n.decode()}" for r, n in fresh], [token] * len(fresh))
            answered.update(fresh)
        else:
            time.sleep(poll_s)
    return token


def round_store(host: str, port: int, rank: int, world_size: int, timeout_s: float):
    """A client of the agent's store (as ``env://`` would make), under a prefix fresh for this round."""
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    token = agree_on_token(store, rank, world_size, timeout_s)
    return dist.PrefixStore(f"{PREFIX}/{token}/", store)
