"""Tensor mode's control link, both ends in process over real sockets: steps cross whole, in order
and numbered, with their payloads; beats carry each worker's steps done; a worker that goes
silent, one that is stuck, one whose socket closes, and a rank 0 that goes silent are each named
by host; a rank of another launch is turned away."""

import socket
import struct
import threading
import time

import mlx.core as mx
import pytest

from mlx_ring.platform import keepalive_options
from mlx_ring.ring import control, rendezvous
from mlx_ring.ring.control import HEADER, HELLO, MESSAGE, STEP, TOKEN, Peer, Spoke, Star
from mlx_ring.ring.protocol import Header, Kind, ProtocolError
from mlx_ring.ring.rendezvous import address_ints, address_of, rank0_addresses
from mlx_ring.ring.transport import Ring


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Two ends of a TCP connection on loopback (the link's options are TCP's)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        b = socket.create_connection(listener.getsockname())
        a, _ = listener.accept()
    return a, b


def pair(lost=None, step_timeout=60.0, hosts=("mini-a", "mini-b")):
    """Rank 0's end and rank 1's, joined by a socket pair."""
    a, b = tcp_pair()
    star = Star([Peer(control.tune(a), 1, hosts[1])], step_timeout)
    spoke = Spoke(Peer(control.tune(b), 0, hosts[0]), 1, lost=lost or (lambda why: None))
    return star, spoke


def no_term():
    return None


def wait_for(check, within=10.0):
    end = time.monotonic() + within
    while not check():
        assert time.monotonic() < end, "not within the time"
        time.sleep(0.02)


def test_steps_cross_whole_in_order_with_their_payloads():
    star, spoke = pair()
    ids = mx.array([[5, 17, 42]], dtype=mx.int32)
    table = mx.arange(12, dtype=mx.int32).reshape(3, 4)
    states = mx.array([[[0.5, -1.25]]], dtype=mx.bfloat16)
    sent = [
        (Header.for_payload(Kind.PREFILL, ids, batch=2), ids),
        (Header(Kind.DECODE, shape=(4, 1), dtype=3, group=1, summed=1), None),
        (Header.for_payload(Kind.STATUS, table), table),
        (Header.for_payload(Kind.PREFILL, states), states),
        (Header(Kind.PING), None),
    ]
    for h, p in sent:
        star.send(h, p)
    for h, p in sent:
        got, payload = spoke.recv(no_term)
        assert got == h
        if p is None:
            assert payload is None
        else:
            assert payload.dtype == p.dtype and mx.array_equal(payload, p)


def test_the_ring_sends_and_takes_its_steps_on_the_link():
    star, spoke = pair()
    world = mx.distributed.init()
    ids = mx.array([[7, 8]], dtype=mx.int32)
    Ring(world, link=star).send(Header(Kind.PREFILL), ids)  # the header takes the payload's shape
    header, payload = Ring(world, link=spoke).recv()
    assert header == Header.for_payload(Kind.PREFILL, ids) and payload.tolist() == [[7, 8]]


def test_a_step_out_of_order_is_a_named_protocol_error():
    a, b = tcp_pair()
    spoke = Spoke(Peer(b, 0, "mini-a"), 1, lost=lambda why: None)
    a.sendall(MESSAGE.pack(STEP, 2) + HEADER.pack(*Header(Kind.PING).ints()))
    with pytest.raises(ProtocolError, match="rank 1 got step 2 where step 1 was due"):
        spoke.recv(no_term)


def test_garbage_on_the_link_is_refused():
    a, b = tcp_pair()
    spoke = Spoke(Peer(b, 0, "mini-a"), 1, lost=lambda why: None)
    a.sendall(MESSAGE.pack(STEP, 1) + HEADER.pack(99, *[0] * 9))
    with pytest.raises(ProtocolError, match="a step header that no rank sends"):
        spoke.recv(no_term)


def test_beats_carry_the_steps_a_worker_did():
    star, spoke = pair()
    for _ in range(3):
        star.send(Header(Kind.PING), None)
        spoke.recv(no_term)
        spoke.completed()
    wait_for(lambda: star.peers[0].done == 3)
    assert star.overdue(time.monotonic()) is None and not star.issued


def test_a_silent_worker_is_named_by_its_host(monkeypatch):
    monkeypatch.setattr(control, "LOST_S", 1.0)
    a, b = tcp_pair()  # rank 1's end says nothing: a cut link, a stopped host
    star, said = Star([Peer(control.tune(a), 1, "mini-b")], 60.0), []
    star.watch(said.append)
    wait_for(lambda: said, 10)
    assert said[0].startswith("rank 1 (mini-b) sent nothing for 1 s") and len(said) == 1
    b.close()


def test_a_worker_whose_beats_come_but_not_its_steps_is_named_as_stuck():
    said = []
    star, spoke = pair(step_timeout=1.0)
    star.watch(said.append)
    star.send(Header(Kind.PING), None)  # taken, never done
    spoke.recv(no_term)
    wait_for(lambda: said, 10)
    assert "rank 1 (mini-b) did no step for 1 s while its beats came" in said[0]


def test_a_pipeline_worker_that_does_its_steps_is_not_named_and_one_that_stops_is():
    """A pipeline's steps go round MLX's ring: rank 0 notes each one sent (`issue`), the workers
    count those they passed on."""
    said = []
    star, spoke = pair(step_timeout=5.0)
    star.watch(said.append)
    for _ in range(3):  # each done at once: its beat comes well inside STEP_TIMEOUT
        star.issue()
        spoke.completed()
    wait_for(lambda: not star.issued, 10)
    assert not said
    star.issue()  # never done, while the beats go on
    wait_for(lambda: said, 20)
    assert "rank 1 (mini-b) did no step for 5 s while its beats came" in said[0]


def test_a_worker_silent_past_step_timeout_but_not_yet_lost_is_named_as_silent():
    """STEP_TIMEOUT shorter than LOST_S: a stopped worker is named when its step is overdue, as
    one whose beats stopped too."""
    a, _b = tcp_pair()  # nobody beats from the far end
    star, said = Star([Peer(control.tune(a), 1, "mini-b")], 3.0), []
    star.watch(said.append)
    star.issue()
    wait_for(lambda: said, 10)
    assert said[0].startswith("rank 1 (mini-b) sent nothing for 3 s"), said
    assert "did no step for 3 s: the rank is stopped" in said[0], said


def test_a_worker_that_closes_its_link_is_named():
    a, b = tcp_pair()
    star, said = Star([Peer(control.tune(a), 2, "mini-c")], 60.0), []
    star.watch(said.append)
    b.close()  # the rank died
    wait_for(lambda: said, 10)
    assert said == ["rank 2 (mini-c) closed its control link (the rank is gone)"]


def test_a_link_closed_after_another_worker_went_silent_names_the_silent_one_first(monkeypatch):
    """A cut link stops that worker's beats; ssh gives up on its host after its keepalives, and
    mlx.launch then stops the other ranks, whose links close: the cut host is the cause."""
    monkeypatch.setattr(control, "SILENT_S", 0.5)
    cut, cut_far = tcp_pair()  # rank 1's end says nothing
    a, b = tcp_pair()
    star = Star([Peer(control.tune(cut), 1, "mini-b"), Peer(control.tune(a), 2, "mini-c")], 60.0)
    said = []
    star.watch(said.append)
    spoke = Spoke(Peer(control.tune(b), 0, "mini-a"), 2)  # rank 2 beats until it is stopped
    time.sleep(1.2)
    spoke.stop()
    b.close()
    wait_for(lambda: said, 10)
    assert said[0].startswith("rank 1 (mini-b) sent nothing for "), said
    assert said[0].endswith("then rank 2 (mini-c) closed its control link (the rank is gone)")
    cut_far.close()


def test_a_silent_rank_0_ends_the_worker_naming_its_host(monkeypatch):
    monkeypatch.setattr(control, "LOST_S", 1.0)
    a, b = tcp_pair()
    said = []
    Spoke(Peer(control.tune(b), 0, "mini-a"), 1, lost=said.append)
    wait_for(lambda: said, 10)
    assert said[0].startswith("rank 0 (mini-a) sent nothing for 1 s")
    a.close()


def test_after_shutdown_a_silence_is_no_fault(monkeypatch):
    monkeypatch.setattr(control, "LOST_S", 0.5)
    said = []
    star, spoke = pair(lost=said.append)
    star.watch(said.append)
    star.stop()
    spoke.stop()
    star.close()
    time.sleep(1.5)
    assert said == []


def test_a_rank_of_another_launch_is_turned_away():
    listener = socket.create_server(("127.0.0.1", 0))
    port, got = listener.getsockname()[1], {}

    def accept():
        with listener:
            got["peers"] = rendezvous._accept(listener, 1, 1234, ["mini-a", "mini-b"])

    thread = threading.Thread(target=accept)
    thread.start()
    stale = socket.create_connection(("127.0.0.1", port))
    stale.sendall(MESSAGE.pack(HELLO, 1) + TOKEN.pack(999))  # an earlier launch's rank
    peer = rendezvous._connect(["127.0.0.1"], port, 1, 1234, "mini-a")
    thread.join(10)
    [accepted] = got["peers"]
    assert (accepted.rank, accepted.host) == (1, "mini-b")
    assert stale.recv(1) == b""  # closed on it
    peer.sock.sendall(b"x")
    assert accepted.sock.recv(1) == b"x"


def test_a_worker_reaches_rank_0_where_the_ring_or_its_ssh_says(monkeypatch):
    monkeypatch.delenv("MLX_JACCL_COORDINATOR", raising=False)
    monkeypatch.setenv("SSH_CONNECTION", "10.0.0.1 51000 10.0.0.2 22")
    assert rank0_addresses([["[fe80::1]:5000"], ["10.0.0.2:5001"]]) == ["fe80::1", "10.0.0.1"]
    monkeypatch.delenv("SSH_CONNECTION")
    monkeypatch.setenv("MLX_JACCL_COORDINATOR", "192.168.1.4:32323")
    assert rank0_addresses(None) == ["192.168.1.4"]
    monkeypatch.delenv("MLX_JACCL_COORDINATOR")
    assert rank0_addresses([["127.0.0.1:5000"]]) == ["127.0.0.1"]
    # hosts.json's `control` first, as the all_gather carries it
    said = address_of(address_ints("mini-a.local"))
    assert said == "mini-a.local" and address_of(address_ints(None)) is None
    assert rank0_addresses([["192.168.0.1:5000"]], said) == ["mini-a.local", "192.168.0.1"]
    with pytest.raises(ValueError, match="longer than 64 bytes"):
        address_ints("a" * 65)


def test_keepalive_options_as_the_systems_headers_name_them():
    # macOS's <netinet/tcp.h>: TCP_KEEPALIVE 0x10, TCP_KEEPINTVL 0x101, TCP_KEEPCNT 0x102
    assert keepalive_options(10, "Darwin") == [(0x10, 10), (0x101, 1), (0x102, 3)]
    assert keepalive_options(10.0, "Linux") == [
        (socket.TCP_KEEPIDLE, 10),
        (socket.TCP_KEEPINTVL, 1),
        (socket.TCP_KEEPCNT, 3),
    ]
    assert keepalive_options(10, "Plan9") == []
    with socket.socket() as s:
        control.tune(s)
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == int(control.LOST_S)
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) >= control.BUFFER


def test_a_header_split_across_writes_is_read_whole():
    a, b = tcp_pair()
    spoke = Spoke(Peer(b, 0, "mini-a"), 1, lost=lambda why: None)
    data = MESSAGE.pack(STEP, 1) + HEADER.pack(*Header(Kind.STATUS, shape=(3, 9), dtype=3).ints())
    data += struct.pack("<27i", *range(27))
    a.sendall(data[:7])  # a slow link: the rest comes in later segments
    time.sleep(0.1)
    a.sendall(data[7:40])
    time.sleep(0.1)
    a.sendall(data[40:])
    header, payload = spoke.recv(no_term)
    assert header == Header(Kind.STATUS, shape=(3, 9), dtype=3)
    assert payload.reshape(-1).tolist() == list(range(27))


def test_beats_queued_while_rank_0_was_busy_count_by_the_latest():
    """A worker's beats that queued up while rank 0's thread did not run: the newest count of
    steps done is the one that counts, so a step done meanwhile is no stuck worker."""
    a, b = tcp_pair()
    star, said = Star([Peer(control.tune(a), 1, "mini-b")], 1.0), []
    star.issue()
    star.issue()
    time.sleep(1.2)  # both now older than STEP_TIMEOUT
    star.watch(said.append)
    # arrived together, the newest last: the worker did both steps meanwhile
    b.sendall(b"".join(MESSAGE.pack(control.BEAT, done) for done in (0, 0, 1, 2)))
    wait_for(lambda: not star.issued, 5)
    time.sleep(0.5)
    assert not said, said
