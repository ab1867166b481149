"""The harness itself: hosts reach each other over their link, a vanished host does not answer, and nothing
is left behind."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.multihost.netns import _PROBE

pytestmark = pytest.mark.slow


def test_hosts_reach_each_other_and_are_removed_afterwards(cluster):
    made = cluster(3)
    names = [h.namespace for h in made.hosts]
    a, b, c = made.hosts
    assert len({h.address for h in made.hosts}) == 3
    for src, dst in ((a, b), (b, c), (c, a)):
        assert src.run([sys.executable, "-c", _PROBE, dst.address], timeout=30).returncode == 0
    sleeper = b.popen(["sleep", "300"])
    deadline = time.monotonic() + 10
    while b.pids() != [sleeper.pid] and time.monotonic() < deadline:  # `ip netns exec` enters, then execs
        time.sleep(0.05)
    assert b.pids() == [sleeper.pid]
    c.vanish()
    assert a.run([sys.executable, "-c", _PROBE, c.address], timeout=30).returncode == 1
    made.close()
    assert sleeper.wait(timeout=10) != 0
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in listed for name in names)
