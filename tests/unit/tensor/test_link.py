"""Tensor mode's header link: headers cross it whole and in order, the ring reads them from it,
and a neighbour that closed it is an error that names the rank, never a hang or a half header."""

import socket

import mlx.core as mx
import pytest

from mlx_ring.ring.protocol import Header, Kind, ProtocolError
from mlx_ring.ring.transport import Ring
from mlx_ring.tensor.link import FORMAT, HeaderLink


@pytest.fixture
def link():
    # A world of one: the rank's next and previous rank are itself, so its link loops back to it.
    link = HeaderLink.open(mx.distributed.init(), [["127.0.0.1:0"]])
    yield link
    link.close()


def test_headers_cross_whole_and_in_order(link):
    sent = [
        Header(Kind.DECODE, shape=(4, 1), dtype=3, group=1, summed=1),
        Header(Kind.PING),
        Header(Kind.PREFILL, batch=2, offset=512, shape=(1, 64, 2048), dtype=2),
    ]
    for h in sent:
        link.send(h.ints())
    assert [Header.parse(link.recv()) for _ in sent] == sent


def test_a_header_split_across_writes_is_read_whole(link):
    data = FORMAT.pack(*Header(Kind.STATUS, shape=(3, 9), dtype=3).ints())
    link.to_next.sendall(data[:7])  # a slow link: the rest comes in a later segment
    link.to_next.sendall(data[7:])
    assert Header.parse(link.recv()) == Header(Kind.STATUS, shape=(3, 9), dtype=3)


def test_the_ring_sends_and_takes_headers_on_its_link(link):
    ring = Ring(mx.distributed.init(), link=link)
    ring.send(Header(Kind.PING), None)
    ring.send(Header(Kind.DECODE, shape=(1, 1), dtype=3, summed=1), None)
    assert ring.recv() == (Header(Kind.PING), None)
    assert ring.recv() == (Header(Kind.DECODE, shape=(1, 1), dtype=3, summed=1), None)


def test_garbage_on_the_link_is_refused(link):
    link.to_next.sendall(FORMAT.pack(99, *[0] * 9))
    with pytest.raises(ProtocolError, match="a step header that no rank sends"):
        Ring(mx.distributed.init(), link=link).recv()


def test_a_closed_link_names_the_rank(link):
    link.to_next.sendall(FORMAT.pack(*Header(Kind.PING).ints())[:10])
    link.to_next.shutdown(socket.SHUT_WR)  # the previous rank is gone halfway through a header
    with pytest.raises(RuntimeError, match="rank 0 closed its header link"):
        link.recv()
    link.from_prev.close()  # the next rank is gone
    with pytest.raises(RuntimeError, match="the next rank closed its header link"):
        for _ in range(64):  # the first writes may still land in the kernel's buffer
            link.send(Header(Kind.PING).ints())
