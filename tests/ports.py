"""A TCP port for a test's torchrun master: free when chosen, and outside the kernel's ephemeral range.

A port from ``bind(port 0)`` is an ephemeral one: once its socket is closed, any outgoing connection on
the machine (gloo's, or the store clients of another test's job) may take it as its source port before
torchrun binds it, and the job fails with EADDRINUSE (seen with suites running side by side). Ports
below the ephemeral range are only ever handed out when asked for by number, so a free one picked at
random there is still free when torchrun binds it, unless another test picks the same one.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_PICK = random.SystemRandom()  # not the seeded global generator: every test worker picks differently


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    high = min(_ephemeral_low(), 32768)
    for _ in range(200):
        port = _PICK.randrange(15000, high)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port in 15000..{high}")
