"""Fixtures of the multi-host tests: hosts made of network namespaces (``tests/multihost/netns.py``).

``hosts`` yields two hosts joined by a private link; ``cluster`` makes clusters of any size. Both skip with
the reason when namespaces cannot be made here (not root, no ``ip``); CI has both.
"""

from __future__ import annotations

import pytest

from tests.multihost import netns
from tests.train.conftest import byte_data  # noqa: F401 - the real byte-level corpus, as in tests/train


@pytest.fixture
def cluster():
    """``cluster(n)`` -> a :class:`netns.Cluster` of n hosts, removed (with every process in it) afterwards."""
    why = netns.unavailable()
    if why:
        pytest.skip(why)
    made: list[netns.Cluster] = []

    def make(n: int = 2) -> netns.Cluster:
        made.append(netns.Cluster(n).__enter__())
        return made[-1]

    yield make
    for each in made:
        each.close()


@pytest.fixture
def hosts(cluster):
    """Two hosts on one link: ``hosts[i].popen(argv)``, ``.run(argv)``, ``.address``, ``.vanish()``."""
    return cluster(2).hosts
