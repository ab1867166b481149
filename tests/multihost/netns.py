"""Hosts made of Linux network namespaces: each has its own address on a private link, so gloo, TCPStore
and torchrun's rendezvous really go over a network, while all share one filesystem (and one hostname).

    with Cluster(2) as cluster:                       # needs root and iproute2 (``ip``)
        h0, h1 = cluster.hosts
        proc = h1.popen(["python", "-c", "..."], env=...)
        h1.vanish()                                   # its link goes down: packets are dropped, no RST

Layout: a "switch" namespace holding a bridge, and one namespace per host joined to it by a veth pair
(``eth0`` inside the host, address 10.A.B.(i+1)/24 with A.B taken from the creating process's id). Every
name starts with ``lt<pid>x<n>`` so concurrent test runs never collide, and :meth:`Cluster.close` kills
every process left in the namespaces and deletes them (also at interpreter exit, should a test die).
Used by ``tests/multihost`` and ``benchmarks/fault_injection.py --hosts 2``.
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

_COUNTER = itertools.count()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None when they can)."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2's `ip` command"
    probe = f"lt{os.getpid()}probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


class Host:
    """One namespace: run commands in it, look at its link, cut it off."""

    def __init__(self, namespace: str, address: str, index: int) -> None:
        self.namespace = namespace
        self.address = address
        self.index = index
        self.interface = "eth0"

    def command(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespace, *map(str, argv)]

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` inside this host (``ip netns exec`` execs it: the pid is the command's)."""
        return subprocess.Popen(self.command(argv), **kwargs)

    def run(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(argv), **kwargs)

    def pids(self) -> list[int]:
        out = _ip("netns", "pids", self.namespace, check=False).stdout
        return [int(p) for p in out.split()]

    def processes(self, *words: str, exclude: tuple[str, ...] = ()) -> list[int]:
        """Pids in this host whose command line contains every one of ``words`` and none of ``exclude``."""
        found = []
        for pid in self.pids():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            text = b" ".join(argv).decode(errors="replace")
            if all(word in text for word in words) and not any(word in text for word in exclude):
                found.append(pid)
        return found

    def kill_all(self, sig: int = signal.SIGKILL) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def vanish(self) -> None:
        """The host drops off the network: its link goes down, packets to it are lost without a reply."""
        self.run(["ip", "link", "set", self.interface, "down"], check=True, capture_output=True)

    def link_bytes(self) -> tuple[int, int]:
        """(sent, received) bytes over this host's link so far."""
        out = self.run(
            ["cat", f"/sys/class/net/{self.interface}/statistics/tx_bytes",
             f"/sys/class/net/{self.interface}/statistics/rx_bytes"],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        return int(out[0]), int(out[1])


class Cluster:
    """``n`` hosts on one private link; a context manager that removes everything it made."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.prefix = f"lt{os.getpid()}x{next(_COUNTER)}"
        pid = os.getpid()
        self.subnet = f"10.{(pid >> 8) % 200 + 20}.{pid % 256}"
        self.switch = f"{self.prefix}sw"
        self.hosts: list[Host] = []
        self._made: list[str] = []

    def __enter__(self) -> Cluster:
        atexit.register(self.close)
        self._sigterm = None
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # a plain kill still runs the clean-up
            self._sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._made.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _build(self) -> None:
        self._add_namespace(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i in range(self.n):
            name = f"{self.prefix}h{i}"
            self._add_namespace(name)
            # Created in the host namespace straight away (nothing is ever added to the caller's namespace).
            _ip(
                "-n",
                name,
                "link",
                "add",
                "eth0",
                "type",
                "veth",
                "peer",
                "name",
                f"p{i}",
                "netns",
                self.switch,
            )
            address = f"{self.subnet}.{i + 1}"
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", self.switch, "link", "set", f"p{i}", "master", "br0")
            _ip("-n", self.switch, "link", "set", f"p{i}", "up")
            self.hosts.append(Host(name, address, i))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the bridge forwards once its ports leave the listening state
            reached = self.hosts[-1].run(
                [sys.executable, "-c", _PROBE, self.hosts[0].address], capture_output=True, text=True
            )
            if reached.returncode == 0 or len(self.hosts) == 1:
                return
            time.sleep(0.2)

    def close(self) -> None:
        for name in reversed(self._made):
            pids = _ip("netns", "pids", name, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _ip("netns", "del", name, check=False)
        self._made.clear()
        atexit.unregister(self.close)
        if getattr(self, "_sigterm", None) is not None:
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None


def _exit_on_sigterm(signum, _frame) -> None:
    raise SystemExit(128 + signum)


# Reaching a closed port is enough: "connection refused" means the packet got there and back.
_PROBE = """
import socket, sys
s = socket.socket()
s.settimeout(1)
try:
    s.connect((sys.argv[1], 9))
except ConnectionRefusedError:
    sys.exit(0)
except OSError:
    sys.exit(1)
"""
