"""Who the other ranks are, and what to say when one of them is gone.

A collective whose peer died fails with the backend's own words (gloo: "Connection closed by peer
[10.0.0.2]:40512", "Timed out waiting 600000ms for recv operation"). :func:`peer_loss` turns such an error
into one line that says what happened: which rank and host, at which step, and how to continue. The
address in a closed-connection error names the host directly; a timeout names nobody, so the surviving
ranks then check in at the store for a few seconds and the ranks that do not are reported.

The table of ranks is gathered once, right after the process group is made (:func:`gather_peers`).
"""

from __future__ import annotations

import os
import re
import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta

from llmtools.errors import RuntimeFailure

# Words of gloo, NCCL and the c10d store when a peer or the network is gone.
_DIST_WORDS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "read error",
    "timed out",
    "timeout",
    "connectfullmesh",
    "connection refused",
    "no route to host",
    "gloo",
    "nccl",
)
_ADDRESS = re.compile(r"\[([0-9a-fA-F.:]+)\]:(\d+)")


class PeerLost(RuntimeFailure):
    """A rank of the job is gone (killed, crashed, its host vanished): this rank cannot go on."""

    def __init__(self, message: str, lost_ranks: list[int]) -> None:
        super().__init__(message)
        self.lost_ranks = lost_ranks


@dataclass
class Peers:
    """rank -> (hostname, address the others reach it at)."""

    hostnames: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)

    def ranks_at(self, address: str) -> list[int]:
        return [r for r, a in enumerate(self.addresses) if a == address]

    def describe(self, ranks: list[int]) -> str:
        if not ranks:
            return "a rank"
        hosts = sorted(
            {f"{self.hostnames[r]} ({self.addresses[r]})" for r in ranks if r < len(self.addresses)}
        )
        who = "rank" if len(ranks) == 1 else "ranks"
        where = f" on {', '.join(hosts)}" if hosts else ""
        return f"{who} {', '.join(map(str, ranks))}{where}"


def _own_address() -> str:
    """The address of this host on the route to the master (what the other ranks connect to)."""
    master = os.environ.get("MASTER_ADDR")
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((master, int(os.environ.get("MASTER_PORT", "1") or 1)))
                return probe.getsockname()[0]
        except OSError:
            pass
    return "?"


def gather_peers() -> Peers:
    """Every rank's hostname and address (one all_gather; call on all ranks after the group exists)."""
    import torch.distributed as dist

    mine = (socket.gethostname(), _own_address())
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return Peers([mine[0]], [mine[1]])
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return Peers([h for h, _ in everyone], [a for _, a in everyone])


def is_distributed_failure(error: BaseException) -> bool:
    try:
        import torch.distributed as dist

        if isinstance(error, dist.DistError):
            return True
    except (ImportError, AttributeError):
        pass
    if isinstance(error, PeerLost):
        return True
    if not isinstance(error, RuntimeError):
        return False
    text = str(error).lower()
    return any(word in text for word in _DIST_WORDS)


def _census(rank: int, world: int, wait_s: float) -> list[int] | None:
    """Ranks that do not check in at the store within ``wait_s`` (None: the store itself is gone)."""
    import torch.distributed as dist

    try:
        store = dist.distributed_c10d._get_default_store()
        store.set_timeout(timedelta(seconds=max(wait_s, 1.0)))
        store.set(f"llmtools/census/{rank}", "1")
        keys = [f"llmtools/census/{r}" for r in range(world)]
        deadline = time.monotonic() + wait_s
        while True:
            present = [r for r, key in enumerate(keys) if store.check([key])]
            if len(present) == world or time.monotonic() > deadline:
                return sorted(set(range(world)) - set(present))
            time.sleep(0.2)
    except Exception:  # noqa: BLE001 - the store's host may be the one that is gone
        return None


def peer_loss(
    error: BaseException, step: int | None, peers: Peers | None, timeout_s: float
) -> PeerLost | None:
    """A :class:`PeerLost` describing ``error``, or None when it is not a failure of another rank."""
    if isinstance(error, PeerLost):
        return error
    if not is_distributed_failure(error):
        return None
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    text = " ".join(str(error).split())
    at = f" at step {step}" if step is not None else " while starting"
    match = _ADDRESS.search(text)
    lost: list[int] = []
    if match and peers is not None:
        lost = [r for r in peers.ranks_at(match.group(1)) if r != rank] or peers.ranks_at(match.group(1))
    lowered = text.lower()
    if lost and ("closed" in lowered or "reset" in lowered or "refused" in lowered or "broken" in lowered):
        what = f"lost {peers.describe(lost)}{at}: its connection closed (the process exited or was killed)"
    elif "timed out" in lowered or "timeout" in lowered:
        missing = _census(rank, world, wait_s=min(10.0, max(2.0, timeout_s / 4)))
        if missing is None:
            what = (
                f"no answer from the other ranks{at} within distributed.timeout_s={timeout_s:g} s, and the "
                "rendezvous store does not answer either (the host holding it is gone)"
            )
        else:
            lost = missing
            named = peers.describe(missing) if peers is not None and missing else "some rank"
            what = (
                f"lost {named}{at}: no answer within distributed.timeout_s={timeout_s:g} s "
                "(its host vanished, hung, or was cut off)"
            )
    else:
        named = f"{peers.describe(lost)} " if lost and peers is not None else ""
        first = text if len(text) <= 200 else text[:200] + "..."
        what = f"lost contact with {named or 'another rank '}{at.strip()}: {first}"
    message = (
        f"rank {rank}: {what}; continue from the newest complete checkpoint with --resume auto "
        "(with the launcher's --max-restarts this happens by itself)"
    )
    return PeerLost(message, lost)


class PeerWatch:
    """Turns the failure of a collective into :class:`PeerLost` (the loop keeps ``step`` current)::

    with PeerWatch(timeout_s) as watch:
        init_distributed(timeout_s)
        watch.gather()
        for step in ...:
            watch.step = step
            ...
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.progress = None  # an object whose ``step`` is the last finished step, once training runs
        self.peers: Peers | None = None

    @property
    def step(self) -> int | None:
        """The step in progress (None while starting)."""
        return None if self.progress is None else self.progress.step + 1

    def gather(self) -> None:
        self.peers = gather_peers()

    def __enter__(self) -> PeerWatch:
        return self

    def __exit__(self, kind, error, _traceback) -> None:
        if error is None or not isinstance(error, Exception):
            return
        lost = peer_loss(error, self.step, self.peers, self.timeout_s)
        if lost is not None and lost is not error:
            raise lost from None
