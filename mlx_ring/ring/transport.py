"""The ring's transport: the links to the ring neighbours that carry the step protocol, with the
socket care MLX's ring backend needs (it busy-polls a pending receive, and a stopped peer blocks it
forever). The world those links belong to is joined in `world.py`."""

import select
import time
from contextlib import nullcontext
from dataclasses import replace
from typing import TYPE_CHECKING

import mlx.core as mx

from mlx_ring.gpu import APART_STEPS, on_metal, receive_apart_setting
from mlx_ring.ring.deadline import Deadlines
from mlx_ring.ring.frames import frame_count, header_of, pack, payload_of
from mlx_ring.ring.protocol import DTYPES, HEADER_LEN, Header, Kind
from mlx_ring.ring.world import prev_fds

if TYPE_CHECKING:  # tensor mode opens the link and hands it in
    from mlx_ring.ring.control import Spoke, Star


def receives_apart(metal: bool, setting: frozenset[str] | None = None) -> frozenset[Kind]:
    """The forward step kinds whose payloads a rank receives apart, before it builds the stage on
    them: RECEIVE_APART's `setting` (step names), else prefill and decode on Metal and none
    elsewhere (the watchdog is Metal's)."""
    if setting is None:
        setting = APART_STEPS if metal else frozenset()
    return frozenset(Kind[name] for name in setting)


def in_graph(kind: int, lazy: bool, apart: frozenset[Kind]) -> bool:
    """Whether a `kind` step's payload stays unread inside the graph of the stage built on it (for a
    caller that asked for `lazy`), rather than being received and evaluated on its own first.

    On Metal, a receive runs on MLX's CPU stream and a GPU command buffer built on it waits for
    it; Metal kills one that waits about 5 s (ml-explore/mlx#1849, #3830). A prefill payload
    comes after every earlier rank's stage of its chunk, seconds on a Mac mini: it is received on
    the host first, as exo does in its pipeline (exo-explore/exo#1429). A decode payload follows
    milliseconds of compute, and no command buffer is built on a payload before its first bytes
    arrive (`wait_payload`), yet the rest may still be in flight on a link that stalls; exo's Mac
    minis still met the watchdog until it received every payload apart, decode too (#1620:
    `PipelineFirstLayer` evaluates its `recv_like` on its own). So on Metal both are apart by
    default; RECEIVE_APART=prefill keeps decode payloads in the graph, which saves a sync a
    token. Other steps' payloads are read on the host anyway."""
    return lazy and kind in (Kind.DECODE, Kind.PREFILL) and kind not in apart


class PeerSilent(Exception):
    """A SIGTERM came and the previous rank has sent nothing since: the worker leaves."""


def wait_readable(fds: list[int], term, prev: int) -> None:
    """Block until one of `fds` has data (or is closed). Woken every second to see whether a SIGTERM
    came (`term()`: None, or its monotonic time and the seconds of silence allowed since): past
    those seconds, PeerSilent."""
    while not select.select(fds, [], [], 1.0)[0]:
        if (came := term()) is not None and time.monotonic() - came[0] > came[1]:
            raise PeerSilent(
                (
                    f"asked to stop (SIGTERM) and rank {prev} has sent nothing for "
                    f"{came[1]:.0f} s since"
                )
            )


class Ring:
    """Point-to-point links to the ring neighbours: receive from rank-1, send to rank+1 (mod size).
    `receive_apart`: see `receives_apart` (None: RECEIVE_APART, else by device)."""

    def __init__(
        self,
        world: mx.distributed.Group,
        receive_apart: frozenset[str] | None = None,
        deadlines: Deadlines | None = None,
        frame: int = 0,
        hosts: list[str] | None = None,
        link: "Star | Spoke | None" = None,
        control: "Star | Spoke | None" = None,
    ):
        self.world = world
        # tensor mode's steps go on sockets of their own from rank 0, not MLX's
        # (ring/control.py)
        self.link = link
        # the same sockets' beats, which name a silent host in either mode
        self.control = control if control is not None else link
        # Where MLX's transport has no sockets to wait on (JACCL), a worker's waits are timed
        # instead, each naming the rank (and its host, `hosts`) waited on.
        self.deadlines, self.hosts = deadlines, hosts
        # JACCL: every message the same size (ring/frames.py); its payloads arrive on the host,
        # frame by frame.
        self.frame = frame
        self.rank, self.size = world.rank(), world.size()
        self.next, self.prev = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        # a payload's recv was handed out lazily and its data not yet waited for
        self.unread = False
        metal = on_metal()
        self.apart = receives_apart(
            metal, receive_apart if receive_apart is not None else receive_apart_setting()
        )
        # Wait for a payload in the kernel on a CPU device, where MLX's polling thread takes a core
        # from the stage itself, and on Metal, where a command buffer must never wait on a payload
        # that has not started to arrive (a stopped peer would trip Metal's watchdog instead of rank
        # 0 timing the wait, STEP_TIMEOUT). On other GPUs, evaluating at once queues the stage's
        # kernels while the data is on its way (waiting first cost time every token), at the price
        # of a polling core while a peer computes, or when it stopped mid-step.
        self.wait_in_kernel = mx.default_device() == mx.cpu or metal
        # On CUDA, a send that waits on the GPU polls an atomic with sleeps that grow to a quarter
        # of the wait so far (libcu++'s backoff): this thread computes the payload first, waiting on
        # a CUDA event, then sends it (faster hops on 2 x H100 and 2 x H200: docs/benchmarks.md).
        self.compute_before_send = mx.default_device() == mx.gpu and not metal
        # With tracing on (bench_steps --trace): (event, kind, group, seconds) as each step's header
        # comes in ("in"), its stage's graph is built ("built", marked by the caller) and its
        # payload leaves ("out").
        self.trace: list[tuple[str, int, int, float]] | None = None
        # when a SIGTERM came, and the silence allowed since
        self.term: tuple[float, float] | None = None

    def mark(self, event: str, header: Header) -> None:
        """Note the moment `event` happens to `header`'s step, when tracing."""
        if self.trace is not None:
            self.trace.append((event, int(header.kind), header.group, time.perf_counter()))

    def send(self, header: Header, payload: mx.array | None) -> None:
        """Pass a step on: its header, then its payload (computed within the send's graph); in
        tensor mode, rank 0 sends both to every worker on the control link."""
        if self.link is not None:
            if payload is not None:
                header = replace(
                    header, shape=tuple(payload.shape), dtype=DTYPES.index(payload.dtype)
                )
            self.link.send(header, payload)
            self.mark("out", header)
            return
        self.send_header(header, payload)
        self.send_payload(header, payload)

    def send_header(self, header: Header, payload: mx.array | None) -> None:
        if self.frame:
            return  # framed: the header leaves in its payload's first frame
        # the header tells the payload actually sent (the last rank trims a prefill's)
        if payload is not None:
            header = replace(header, shape=tuple(payload.shape), dtype=DTYPES.index(payload.dtype))
        # Evaluated on its own, before the payload: two independent sends in one
        # graph have no order.
        with self.timed(lambda: f"{self._who(self.next)} to take a step's header"):
            mx.eval(mx.distributed.send(header.encode(), self.next, group=self.world))

    def send_payload(self, header: Header, payload: mx.array | None) -> None:
        if self.frame:
            self._send_frames(header, payload)
        elif payload is not None and payload.ndim:
            # A payload still to arrive is received within this graph: either neighbour may be the
            # one waited on.
            unread = self.unread

            def waited():
                also = f" (and {self._who(self.prev)} to send it)" if unread else ""
                return f"{self._who(self.next)} to take a step's payload{also}"

            with self.timed(waited):
                self.wait_payload()  # this payload may be computed from one still to arrive
                if self.compute_before_send:
                    mx.eval(payload)
                mx.eval(mx.distributed.send(payload, self.next, group=self.world))
        self.mark("out", header)

    def _send_frames(self, header: Header, payload: mx.array | None) -> None:
        if payload is not None:
            header = replace(header, shape=tuple(payload.shape), dtype=DTYPES.index(payload.dtype))
        frames = pack(header, payload, self.frame)
        with self.timed(lambda: f"{self._who(self.next)} to take a step"):
            mx.eval(frames)
            for i in range(frames.shape[0]):  # one by one: sends within one graph have no order
                mx.eval(mx.distributed.send(frames[i], self.next, group=self.world))

    def _recv_frames(self) -> tuple[Header, mx.array | None]:
        with self.timed(lambda: f"the next step from {self._who(self.prev)}", bounded=False):
            self._wait_for_data()
            first = mx.distributed.recv((self.frame,), mx.uint8, self.prev, group=self.world)
            mx.eval(first)
        header = header_of(first)
        self.mark("in", header)
        if not header.carried:
            return header, None
        frames = [first]
        with self.timed(
            lambda: f"the payload of a {Kind(header.kind).name} step from {self._who(self.prev)}"
        ):
            for _ in range(frame_count(header, self.frame) - 1):
                frames.append(
                    mx.distributed.recv((self.frame,), mx.uint8, self.prev, group=self.world)
                )
                mx.eval(frames[-1])
        return header, payload_of(header, frames)

    def recv(self, lazy: bool = False) -> tuple[Header, mx.array | None]:
        """The next step from the previous rank. `lazy`: the payload of a forward step (hidden
        states) may be left in the graph (`in_graph` decides), for a caller that calls
        `wait_payload()` and then evaluates it (with what it computes from it) before the next
        recv; `send_payload` does both. Other payloads arrive here, on the host, before this
        returns. (Building a forward step's graph must not read its input: the wait would then
        find no data coming.)"""
        if self.link is not None:  # tensor mode: the step and its payload, from rank 0
            header, payload = self.link.recv(lambda: self.term)
            self.mark("in", header)
            return header, payload
        if self.frame:
            return self._recv_frames()
        header = self._recv_header()
        self.mark("in", header)
        if not header.carried:
            return header, None
        payload = mx.distributed.recv(
            header.shape, DTYPES[header.dtype], self.prev, group=self.world
        )
        self.unread = True
        if not in_graph(header.kind, lazy, self.apart):
            with self.timed(
                lambda: (
                    f"the payload of a {Kind(header.kind).name} step from {self._who(self.prev)}"
                )
            ):
                # on the host: a stopped peer blocks this thread here, not a command buffer
                self.wait_payload()
                mx.eval(payload)
        return header, payload

    def _recv_header(self) -> Header:
        # an idle ring is silent
        with self.timed(lambda: f"the next step from {self._who(self.prev)}", bounded=False):
            self._wait_for_data()
            # The header tells the payload's shape and dtype, so it must arrive first.
            return Header.decode(
                mx.distributed.recv((HEADER_LEN,), mx.int32, self.prev, group=self.world)
            )

    def _who(self, rank: int) -> str:
        return f"rank {rank} ({self.hosts[rank]})" if self.hosts else f"rank {rank}"

    def timed(self, what, bounded: bool = True):
        """A wait on other ranks, timed where the transport cannot time it (JACCL's deadlines;
        nothing elsewhere): wrap every blocking evaluation that waits on a peer, a collective's
        too (an all_sum). `what`: a function giving the words ("an all_sum with every rank"),
        called only if it is overdue."""
        return (
            self.deadlines.waiting(what, bounded) if self.deadlines is not None else nullcontext()
        )

    def wait_payload(self) -> None:
        """Block until the payload of the last lazy `recv` starts to arrive (at once if it has)."""
        if self.unread and self.wait_in_kernel:
            self._wait_for_data()
        self.unread = False

    def terminate(self, quiet: float) -> None:
        """A SIGTERM came: keep serving rank 0's drain, but leave once the previous rank goes quiet
        for `quiet` seconds (one that vanished without closing its sockets never wakes us)."""
        self.term = (time.monotonic(), quiet)
        if self.deadlines is not None:
            self.deadlines.terminate(quiet)

    def _wait_for_data(self) -> None:
        # MLX's ring thread busy-polls its sockets while a recv is pending, a whole core per
        # waiting rank (for a whole stage of the previous rank, when a header came and its payload
        # is still being computed); wait for data, or a closed peer, in the kernel first, at no
        # cost. Only the previous rank's sockets: the next rank's, once that rank is gone, would
        # wake this at once.
        if prev_fds():
            wait_readable(prev_fds(), lambda: self.term, self.prev)
