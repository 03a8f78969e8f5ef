"""The control link: a socket from rank 0 to each worker (a star), beside MLX's transport
(ring, JACCL or NCCL).

Beats go both ways every BEAT_S, in either mode: a cut link, a stopped rank or a dead one is named
by its host within LOST_S. The workers' beats carry the count of steps done, so a worker whose
beats come while its steps don't is named after STEP_TIMEOUT. In tensor mode each step's
descriptor, its header and small payload (token ids, a table), goes from rank 0 to every worker on
it at once, numbered, so a lost or doubled step is a named error.

Why a socket and not MLX: MLX evaluates send and recv on its CPU stream, which on CUDA waits for
the GPU work queued before it, so a descriptor through MLX would wait behind the last step. A
socket touches neither MLX nor the GPU, and it can be timed, where a wait inside an all_sum
cannot.
"""

import logging
import queue
import select
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import mlx.core as mx
import numpy as np

from mlx_ring.platform import keep_alive
from mlx_ring.ring.deadline import leave
from mlx_ring.ring.protocol import DTYPES, HEADER_LEN, Header, ProtocolError
from mlx_ring.ring.transport import PeerSilent

log = logging.getLogger(__name__)

MESSAGE = struct.Struct("<Bq")  # kind, then a step's number (HELLO: the rank)
HEADER = struct.Struct(f"<{HEADER_LEN}i")
STEP, BEAT, HELLO = 1, 2, 3
TOKEN = struct.Struct("<Q")  # this launch's own: a rank of another launch is turned away
BEAT_S = 0.5
LOST_S = 10.0  # twenty beats missed: the host is gone, not slow
SILENT_S = 4 * BEAT_S  # beats missed for this long: not a worker that beats
SEND_S = 10.0  # a send the peer does not take within this is a lost peer
CONNECT_S = 60.0  # workers connect once they have rank 0's port, after loading
BUFFER = 1 << 20  # a prefill chunk's ids and every beat fit without a wait


def payload_bytes(payload: mx.array) -> bytes:
    """The payload as raw bytes (16-bit floats as their bits: numpy has no bfloat16)."""
    wide = payload.dtype.size == 2 and payload.dtype != mx.int16
    return np.asarray(payload.view(mx.uint16) if wide else payload).tobytes()


def payload_array(header: Header, data: bytes) -> mx.array:
    """The payload `header` says, from its raw bytes."""
    dtype = DTYPES[header.dtype]
    wide = dtype.size == 2
    arr = np.frombuffer(data, np.uint16 if wide else _NUMPY[dtype]).reshape(header.shape)
    return mx.array(arr).view(dtype) if wide else mx.array(arr)


_NUMPY = {mx.float32: np.float32, mx.int32: np.int32}


def payload_size(header: Header) -> int:
    return int(np.prod(header.shape)) * DTYPES[header.dtype].size if header.carried else 0


@dataclass
class Peer:
    """One end of the star as the other end sees it: its socket, and its last beat."""

    sock: socket.socket
    rank: int
    host: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    heard: float = field(default_factory=time.monotonic)  # its last message
    done: int = 0  # the last step it said it completed

    def who(self) -> str:
        return f"rank {self.rank} ({self.host})"

    def send(self, data: bytes) -> None:
        """All of `data`, within SEND_S (the socket's timeout); RuntimeError naming the peer."""
        with self.lock:
            try:
                self.sock.sendall(data)
            except OSError as e:
                raise RuntimeError(
                    f"{self.who()} took nothing from its control link for {SEND_S:.0f} s, or "
                    f"closed it ({e}): its host is gone, stopped or cut off"
                ) from e


def silence(p: Peer, now: float) -> str:
    """A worker heard from last at `p.heard`, named as silent."""
    return (
        f"{p.who()} sent nothing for {now - p.heard:.0f} s (its beats come every {BEAT_S} s): "
        "the rank is stopped, or its host is off, asleep or cut off"
    )


def read_exact(sock: socket.socket, n: int, who: str) -> bytes:
    data = b""
    while len(data) < n:
        try:
            part = sock.recv(n - len(data))
        except ConnectionResetError:  # closed with our beats unread: gone all the same
            part = b""
        except OSError as e:
            raise RuntimeError(f"{who}'s control link failed: {e}") from e
        if not part:
            raise RuntimeError(f"{who} closed its control link (the rank is gone)")
        data += part
    return data


def tune(sock: socket.socket) -> socket.socket:
    sock.settimeout(SEND_S)  # reads wait in select first: this bounds the sends
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a descriptor is one write
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER)
    keep_alive(sock, LOST_S)  # a backstop only: the beats name a lost peer first
    return sock


class Star:
    """Rank 0's end: a socket to every worker. The engine's thread sends the steps; a thread of
    its own reads the workers' beats, sends rank 0's, and (once `watch` is called) calls
    `lost(why)` once a worker is gone or stuck."""

    def __init__(self, peers: list[Peer], step_timeout: float):
        self.peers, self.step_timeout = peers, step_timeout
        self.seq = 0
        # steps some worker has not done: (seq, when); the engine's thread appends, the link's pops
        self.issued: deque[tuple[int, float]] = deque()
        self.lost: Callable[[str], None] | None = None
        self.stopped = False
        self.broken: str | None = None  # why the link's thread ended
        threading.Thread(target=self._run, name="control-star", daemon=True).start()

    def send(self, header: Header, payload: mx.array | None) -> None:
        """One step's descriptor to every worker (tensor mode)."""
        body = payload_bytes(payload) if header.carried and payload is not None else b""
        if len(body) != payload_size(header):
            raise ValueError(f"a step's payload of {len(body)} bytes where {header} says other")
        data = MESSAGE.pack(STEP, self.issue()) + HEADER.pack(*header.ints()) + body
        for p in self.peers:
            p.send(data)

    def issue(self) -> int:
        """A step went to the workers (here, or round the pipeline's ring): its number; each
        worker's beats say when it has done it."""
        self.seq += 1
        self.issued.append((self.seq, time.monotonic()))
        return self.seq

    def watch(self, lost: Callable[[str], None]) -> None:
        """From now, `lost(why)` is called (once, from the link's thread) when a worker is gone
        or stuck."""
        for p in self.peers:
            p.heard = time.monotonic()
        self.lost, self.stopped = lost, False
        if self.broken is not None:
            self.stopped = True
            lost(self.broken)

    def stop(self) -> None:
        """The ring is shutting down: its ranks leave, and that is no fault."""
        self.stopped = True

    def _run(self) -> None:
        socks = {p.sock: p for p in self.peers}
        beat, p = 0.0, None
        while socks:
            now = time.monotonic()
            try:
                if now - beat >= BEAT_S:
                    beat = now
                    for p in self.peers:  # lets each worker know rank 0 is there
                        p.send(MESSAGE.pack(BEAT, self.seq))
                for s in select.select(list(socks), [], [], BEAT_S)[0]:
                    p, ready = socks[s], True
                    # every beat queued: after a while without this thread (rank 0's own compute
                    # on a busy machine) the first is old, its count of steps done too
                    while ready:
                        kind, p.done = MESSAGE.unpack(read_exact(s, MESSAGE.size, p.who()))
                        ready = bool(select.select([s], [], [], 0)[0])
                    p.heard = time.monotonic()
                why = self.overdue(time.monotonic())
            except (RuntimeError, ValueError) as e:  # ValueError: a socket closed here
                why = self.first_silent(time.monotonic(), p, str(e))
                socks, self.broken = {}, why  # for a `watch` still to come
            if why is not None and self.lost is not None and not self.stopped:
                self.stopped = True
                self.lost(why)

    def first_silent(self, now: float, failed: Peer | None, why: str) -> str:
        """`why` `failed`'s link broke, unless another worker had gone silent before: once one
        rank's ssh session ends (a cut link's, after ssh's keepalives) mlx.launch stops the
        others, so a link that closes then is the fault's echo, and the silent host its cause."""
        for p in self.peers:  # beats waiting unread: that worker is there
            if p is not failed and select.select([p.sock], [], [], 0)[0]:
                p.heard = now
        silent = [p for p in self.peers if p is not failed and now - p.heard > SILENT_S]
        if not silent:
            return why
        return f"{silence(min(silent, key=lambda p: p.heard), now)}; then {why}"

    def overdue(self, now: float) -> str | None:
        """Why the ring is broken at `now`: a worker silent for LOST_S, or one whose beats come
        while it has not done a step sent STEP_TIMEOUT ago; None if neither."""
        for p in self.peers:
            if now - p.heard > LOST_S:
                return silence(p, now)
        least = min(p.done for p in self.peers)
        while self.issued and self.issued[0][0] <= least:
            self.issued.popleft()
        return self.stuck(now)

    def stuck(self, now: float) -> str | None:
        """The workers that have not done a step sent STEP_TIMEOUT ago, named, those gone silent
        first; None if none. (Any thread may ask: it only reads.)"""
        try:
            seq, sent = self.issued[0]
        except IndexError:
            return None
        behind = [p for p in self.peers if p.done < seq]
        if now - sent <= self.step_timeout or not behind:
            return None
        # a STEP_TIMEOUT shorter than LOST_S comes before a silent worker is called lost
        if silent := [p for p in behind if now - p.heard > SILENT_S]:
            return (
                f"{', '.join(p.who() for p in silent)} sent nothing for "
                f"{now - max(p.heard for p in silent):.0f} s (its beats come every {BEAT_S} s) "
                f"and did no step for {self.step_timeout:.0f} s: the rank is stopped, or its "
                "host is off, asleep or cut off"
            )
        return (
            f"{', '.join(p.who() for p in behind)} did no step for {self.step_timeout:.0f} s "
            "while its beats came: it is stuck (or waits on another rank)"
        )

    def close(self) -> None:
        self.stopped = True
        for p in self.peers:
            p.sock.close()


class Spoke:
    """A worker's end: the socket to rank 0. A thread of its own reads it (steps go to a queue,
    beats mark rank 0 alive), sends this worker's beats, and ends the rank with `lost(why)` once
    rank 0 is silent for LOST_S."""

    def __init__(self, peer: Peer, rank: int, lost: Callable[[str], None] | None = None):
        self.peer, self.rank = peer, rank
        self.steps: queue.Queue = queue.Queue()
        self.held = None  # a step `coming` took from the queue, for `recv`
        self.expected = 1
        self.done = 0  # steps completed here, in order (`completed`)
        self.stopped = False
        self.lost = lost or leave
        threading.Thread(target=self._run, name="control-spoke", daemon=True).start()

    def completed(self) -> None:
        """The oldest step not yet done is done (the next beat says so)."""
        self.done += 1

    def coming(self, within: float) -> bool:
        """Whether a step comes within `within` seconds (it waits for the next `recv`)."""
        if self.held is None:
            try:
                self.held = self.steps.get(timeout=within)
            except queue.Empty:
                return False
        return True

    def recv(self, term: Callable) -> tuple[Header, mx.array | None]:
        """The next step; PeerSilent once a SIGTERM came and rank 0 stayed quiet (`term()`, as
        `transport.wait_readable`), ProtocolError for a step out of order, RuntimeError for a
        lost link."""
        while not self.coming(1.0):
            came = term()
            if came is not None and time.monotonic() - came[0] > came[1]:
                raise PeerSilent(
                    f"asked to stop (SIGTERM) and rank 0 has sent no step for {came[1]:.0f} s since"
                )
        item, self.held = self.held, None
        if isinstance(item, Exception):
            raise item
        seq, header, data = item
        if seq != self.expected:
            raise ProtocolError(
                f"rank {self.rank} got step {seq} where step {self.expected} was due: a step was "
                "lost or sent twice (the ranks are out of step)"
            )
        self.expected += 1
        return header, payload_array(header, data) if data else None

    def stop(self) -> None:
        """Rank 0 shuts the ring down: its silence, or its socket closing, is no fault now (the
        steps of a later ring on the same link still come)."""
        self.stopped = True

    def _run(self) -> None:
        p, beat = self.peer, 0.0
        while True:
            try:
                now = time.monotonic()
                if now - beat >= BEAT_S:
                    beat = now
                    p.send(MESSAGE.pack(BEAT, self.done))
                if select.select([p.sock], [], [], BEAT_S)[0]:
                    self._read()
                    p.heard = time.monotonic()
                elif time.monotonic() - p.heard > LOST_S and not self.stopped:
                    self.lost(
                        f"rank 0 ({p.host}) sent nothing for {time.monotonic() - p.heard:.0f} s "
                        f"(its beats come every {BEAT_S} s): its host is gone or the link is cut"
                    )
                    return
            except (RuntimeError, ProtocolError) as e:
                self.steps.put(e)  # the rank's thread raises it at its next step
                return

    def _read(self) -> None:
        p = self.peer
        kind, seq = MESSAGE.unpack(read_exact(p.sock, MESSAGE.size, p.who()))
        if kind == BEAT:
            return
        if kind != STEP:
            raise ProtocolError(f"rank {self.rank}: a control message no rank sends ({kind})")
        header = Header.parse(HEADER.unpack(read_exact(p.sock, HEADER.size, p.who())))
        size = payload_size(header)
        data = read_exact(p.sock, size, p.who()) if size else b""
        self.steps.put((seq, header, data))  # bytes: only the rank's own thread calls MLX

    def close(self) -> None:
        self.stopped = True
        self.peer.sock.close()
