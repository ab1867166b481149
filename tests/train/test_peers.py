"""What a rank says when a peer is gone: one line naming the rank, its host and the step."""

from __future__ import annotations

from llmtools.train.peers import PeerLost, Peers, is_distributed_failure, peer_loss

PEERS = Peers(hostnames=["node-a", "node-b", "node-b"], addresses=["10.0.0.1", "10.0.0.2", "10.0.0.2"])
GLOO_CLOSED = RuntimeError(
    "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:33498"
)


def test_a_closed_connection_names_the_ranks_of_that_host_and_the_step():
    lost = peer_loss(GLOO_CLOSED, 19, PEERS, timeout_s=600)
    assert isinstance(lost, PeerLost) and lost.lost_ranks == [1, 2]
    message = str(lost)
    assert "\n" not in message
    assert "lost ranks 1, 2 on node-b (10.0.0.2) at step 19" in message
    assert "its connection closed" in message and "--resume auto" in message


def test_other_errors_are_not_a_lost_peer():
    assert peer_loss(ValueError("bad value"), 3, PEERS, 600) is None
    assert peer_loss(RuntimeError("CUDA out of memory"), 3, PEERS, 600) is None
    assert not is_distributed_failure(KeyError("x"))
    assert is_distributed_failure(GLOO_CLOSED)


def test_a_timeout_without_a_group_reports_the_timeout():
    # No process group here: the roll call at the store cannot run, which is said as such.
    error = RuntimeError(
        "[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 30000ms for recv operation"
    )
    message = str(peer_loss(error, 7, PEERS, timeout_s=30))
    assert "at step 7" in message and "distributed.timeout_s=30" in message
