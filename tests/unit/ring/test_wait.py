"""A worker's wait on its previous rank: woken by data or a closed peer, and, once a SIGTERM has
come, given up when the peer stays silent (one that vanished without closing its socket)."""

import socket
import threading
import time

import pytest

from mlx_ring.ring.transport import PeerSilent, wait_readable


def test_a_silent_predecessor_is_left_only_after_a_sigterm():
    mine, theirs = socket.socketpair()  # `theirs` stays open and says nothing: a peer that vanished
    with mine, theirs:
        term = [None]
        waiter = threading.Thread(
            target=lambda: pytest.raises(
                PeerSilent, wait_readable, [mine.fileno()], lambda: term[0], 3
            )
        )
        waiter.start()
        waiter.join(2.5)
        assert waiter.is_alive(), "no SIGTERM: it waits, however long the peer is silent"
        term[0] = (time.monotonic(), 0.5)
        waiter.join(10)
        assert not waiter.is_alive(), "SIGTERM and silence: it leaves"
        with pytest.raises(PeerSilent, match="rank 3 has sent nothing"):
            wait_readable([mine.fileno()], lambda: (time.monotonic() - 5, 0.5), 3)
        theirs.send(b"x")  # data: back at once, SIGTERM or not
        wait_readable([mine.fileno()], lambda: (time.monotonic() - 5, 0.5), 3)
