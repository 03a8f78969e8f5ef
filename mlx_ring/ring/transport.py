"""The ring's transport: the world of ranks MLX's ring backend joins, and the links to the ring
neighbours that carry the step protocol, with the socket care MLX's ring backend needs (it
busy-polls a pending receive, and a stopped peer blocks it forever).

"World" is MLX's distributed group of all ranks; "group" in this project is a decode micro-batch.
"""

import ctypes
import errno
import json
import os
import select
import socket
import stat
import time
import zlib
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import mlx.core as mx

from mlx_ring import settings
from mlx_ring.gpu import APART_STEPS, on_metal, receive_apart_setting
from mlx_ring.platform import boot_id, ephemeral_ports, in_ephemeral, port_holders, usable_cores
from mlx_ring.ring.deadline import Deadlines
from mlx_ring.ring.frames import frame_count, header_of, pack, payload_of
from mlx_ring.ring.protocol import DTYPES, HEADER_LEN, Header, Kind


def init_world(socket_buffer: int = 0, verbose: bool = False) -> mx.distributed.Group:
    """The ranks mlx.launch started; a world of one when started alone. `socket_buffer`: if set,
    the kernel send and receive buffers of the ring's sockets, in bytes (small ones model a real
    link's, for tests). `verbose` (RING_VERBOSE): MLX's ring backend logs, on stderr, each rank's
    accepts and connection attempts while the ring forms."""
    if verbose:
        os.environ["MLX_RING_VERBOSE"] = "1"  # MLX asks only whether it is set, when the ring forms
    # mlx.launch's output threads spin on a rank's stdin pipe while it is writable (a core per rank on
    # a small machine); with our end closed, its next write fails and it stops watching the pipe.
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    before = _socket_fds()
    hostfile = settings.text("MLX_HOSTFILE")
    if hostfile and os.path.isfile(hostfile) and not Path(hostfile).read_text().strip():
        # mlx.launch writes an empty ring description for a one-host hostfile: nothing to join.
        del os.environ["MLX_HOSTFILE"]
    if world_backend() == "jaccl":  # RDMA: no sockets of MLX's to hold, find or watch (ring/deadline.py)
        try:
            world = mx.distributed.init(backend="jaccl", strict=True)
        except RuntimeError as e:  # which rank, its devices, and where the ranks meet (launcher/failures.py)
            raise RuntimeError(f"rank {settings.text('MLX_RANK')} could not join the JACCL ring (its RDMA devices "
                               f"{_own_devices()}, coordinator {settings.text('MLX_JACCL_COORDINATOR')}): {e}") from e
        _share_cores(world)
        return world
    held = _hold_own_ports()
    try:
        world = mx.distributed.init(backend="ring")
    except RuntimeError as e:  # "[ring] Couldn't connect (error: 65)": which rank, to what (launcher/failures.py)
        rank = settings.text("MLX_RANK")
        if rank is None or not settings.text("MLX_HOSTFILE"):
            raise
        ranks = len(json.loads(Path(settings.text("MLX_HOSTFILE")).read_text()))
        after = (int(rank) + 1) % ranks
        raise RuntimeError(f"rank {rank} could not join the ring (its next rank, {after}, at "
                           f"{', '.join(f'{ip}:{port}' for ip, port in _ring_addresses(after))}): {e}") from e
    finally:
        for s in held:
            s.close()
    rank, size = world.rank(), world.size()
    # The sockets to the previous rank: those it connected to this rank's own ring ports and, in a
    # ring of two, where it is the next rank too, those this rank connected to it (MLX's ring
    # backend may use either direction's sockets between the same two ranks).
    mine = _ring_ports(rank) if size > 1 else set()
    theirs = _ring_ports((rank + 1) % size) if size == 2 else set()
    links = _ring_sockets(_socket_fds() - before, socket_buffer)
    _PREV_FDS[:] = [fd for fd, local, peer in links if local in mine or peer in theirs]
    _PEER_FDS.clear()
    _PEER_FDS.update({fd: (rank - 1) % size if fd in _PREV_FDS else (rank + 1) % size for fd, _, _ in links})
    _share_cores(world)
    return world


def _own_devices() -> str:
    try:
        row = json.loads(Path(settings.text("MLX_IBV_DEVICES")).read_text())[int(settings.text("MLX_RANK") or 0)]
    except (OSError, ValueError, IndexError):
        return "unknown"
    return ", ".join(str(d) for d in row if d is not None) or "none"


def world_backend() -> str:
    """MLX's backend mlx.launch set this rank up for: "jaccl" (its RDMA devices file given, for
    --backend jaccl and jaccl-ring alike), else "ring"."""
    return "jaccl" if settings.text("MLX_IBV_DEVICES") else "ring"


PORT_WAIT_S = 10  # a rank of a ring that just stopped may hold its port a moment longer


def _hold_own_ports() -> list[socket.socket]:
    """Bind this rank's ring addresses (not listening) until MLX's ring backend listens on them, where
    they lie in the ephemeral port range. The last rank connects out before it listens, and the kernel
    may give that outgoing connection the rank's own port as its ephemeral one: the listen then fails,
    and for a minute (TIME_WAIT) so does every restart. A bound port is never handed out; MLX binds
    beside ours (SO_REUSEPORT). A port outside the range (the default ring ports, 32323 and up, with
    macOS's range and with Linux's default one) is never handed out: it is only checked, then let go."""
    hostfile, rank = settings.text("MLX_HOSTFILE"), settings.text("MLX_RANK")
    if not hostfile or rank is None:
        return []
    held, ephemeral = [], ephemeral_ports()
    for ip, port in _ring_addresses(int(rank)):
        s = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        deadline = time.monotonic() + PORT_WAIT_S
        while True:
            try:
                s.bind((ip.strip("[]"), port))
                break
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    s.close()
                    raise ValueError(f"this host cannot listen on its ring address {ip}:{port} ({e.strerror}); "
                                     "put one of its own addresses in its hosts.json entry") from None
                if time.monotonic() > deadline:
                    s.close()
                    raise ValueError(f"ring port {port} on {ip} is in use ({e.strerror}); stop what holds it "
                                     f"(`{port_holders(port)}` shows it) or choose another RING_PORT") from None
                time.sleep(0.5)
        if in_ephemeral(port, ephemeral):
            held.append(s)
        else:
            s.close()
    return held


def _ring_sockets(fds: set[int], buffer: int) -> list[tuple[int, int, int]]:
    """(fd, local port, peer port) of each connected socket among `fds`; sets its buffers if `buffer`."""
    out = []
    for fd in sorted(fds):
        with socket.socket(fileno=os.dup(fd)) as s:  # a duplicate: closing it leaves `fd` open
            try:
                peer = s.getpeername()[1]
            except OSError:
                continue  # the listening socket
            if buffer:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
            out.append((fd, s.getsockname()[1], peer))
    return out


def _ring_addresses(rank: int) -> list[tuple[str, int]]:
    # mlx.launch's ring description: per rank, the "ip:port" addresses it listens on.
    with open(settings.text("MLX_HOSTFILE")) as f:
        return [(ip, int(port)) for ip, port in (address.rsplit(":", 1) for address in json.load(f)[rank])]


def _ring_ports(rank: int) -> set[int]:
    return {port for _, port in _ring_addresses(rank)}


EXCHANGE_BYTES = 16384  # fixed row width of the startup exchange; plenty for a hostfile's overrides


def exchange(mine: dict, world: mx.distributed.Group) -> list[dict]:
    """Every rank's `mine` (plain JSON data), on every rank: one all_gather of fixed-width byte rows."""
    data = json.dumps(mine, sort_keys=True).encode()
    if len(data) > EXCHANGE_BYTES:
        raise ValueError(f"the startup exchange is {len(data)} bytes, over {EXCHANGE_BYTES}; shorten hosts.json")
    row = mx.array([list(data.ljust(EXCHANGE_BYTES, b"\0"))], dtype=mx.int32)
    rows = mx.distributed.all_gather(row, group=world).tolist() if world.size() > 1 else row.tolist()
    return [json.loads(bytes(r).rstrip(b"\0")) for r in rows]


def machine() -> str:
    """What names the cores this rank runs on: its machine's boot id (one per running kernel, so
    containers and network namespaces that share the cores share it), else the host name; and the
    cores it is pinned to, if it is (ranks pinned apart do not share their cores)."""
    pinned = usable_cores()
    return (boot_id() or socket.gethostname()) + (f" cores {sorted(pinned)}" if pinned else "")


def _share_cores(world: mx.distributed.Group) -> None:
    """Ranks on one machine split its cores between their BLAS thread pools: oversubscribed pools spin
    against each other (2 ranks on 2 cores decoded 1.5x slower with a pool of 2 each)."""
    me = zlib.crc32(machine().encode()) & 0x7FFFFFFF
    hosts = mx.distributed.all_gather(mx.array([me], dtype=mx.int32), group=world).tolist()
    local = hosts.count(me)
    set_threads = getattr(ctypes.CDLL(None), "openblas_set_num_threads", None)  # OpenBLAS, when preloaded
    if local > 1 and set_threads is not None:
        set_threads(max(1, len(usable_cores() or range(os.cpu_count() or 1)) // local))


# The sockets the ring backend opened from the previous rank (see Ring.recv). Filled by init_world.
_PREV_FDS: list[int] = []
# Every socket to a ring neighbour, and that neighbour's rank (see `closed_peer`). Filled by init_world.
_PEER_FDS: dict[int, int] = {}


def closed_peer() -> int | None:
    """A ring neighbour whose end of a socket is closed (its process is gone), or None. Peeks, so the
    ring backend's own reads lose nothing."""
    for fd, rank in _PEER_FDS.items():
        with socket.socket(fileno=os.dup(fd)) as s:
            try:
                if s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                    return rank
            except BlockingIOError:
                continue  # open, nothing to read now
            except OSError:  # reset by the peer
                return rank
    return None


def _socket_fds() -> set[int]:
    fds = set()
    for name in os.listdir("/dev/fd"):
        try:
            if stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                fds.add(int(name))
        except OSError:
            pass
    return fds



def receives_apart(metal: bool, setting: frozenset[str] | None = None) -> frozenset[Kind]:
    """The forward step kinds whose payloads a rank receives apart, before it builds the stage on them:
    RECEIVE_APART's `setting` (step names), else prefill and decode on Metal and none elsewhere (the
    watchdog is Metal's)."""
    if setting is None:
        setting = APART_STEPS if metal else frozenset()
    return frozenset(Kind[name] for name in setting)


def in_graph(kind: int, lazy: bool, apart: frozenset[Kind]) -> bool:
    """Whether a `kind` step's payload stays unread inside the graph of the stage built on it (for a
    caller that asked for `lazy`), rather than being received and evaluated on its own first.

    On Metal, a receive runs on MLX's CPU stream and a GPU command buffer built on it waits for it;
    Metal kills one that waits about 5 s (ml-explore/mlx#1849, #3830). A prefill payload comes after
    every earlier rank's stage of its chunk, seconds on a Mac mini: it is received on the host first, as
    exo does in its pipeline (exo-explore/exo#1429). A decode payload follows milliseconds of compute,
    and no command buffer is built on a payload before its first bytes arrive (`wait_payload`), yet the
    rest may still be in flight on a link that stalls; exo's Mac minis still met the watchdog until it
    received every payload apart, decode too (#1620: `PipelineFirstLayer` evaluates its `recv_like`
    on its own). So on Metal both are apart by default; RECEIVE_APART=prefill keeps decode payloads in
    the graph, which saves a sync a token. Other steps' payloads are read on the host anyway."""
    return lazy and kind in (Kind.DECODE, Kind.PREFILL) and kind not in apart


class PeerSilent(Exception):
    """A SIGTERM came and the previous rank has sent nothing since: the worker leaves."""


def wait_readable(fds: list[int], term, prev: int) -> None:
    """Block until one of `fds` has data (or is closed). Woken every second to see whether a SIGTERM
    came (`term()`: None, or its monotonic time and the seconds of silence allowed since): past
    those seconds, PeerSilent."""
    while not select.select(fds, [], [], 1.0)[0]:
        if (came := term()) is not None and time.monotonic() - came[0] > came[1]:
            raise PeerSilent(f"asked to stop (SIGTERM) and rank {prev} has sent nothing for {came[1]:.0f} s since")


class Ring:
    """Point-to-point links to the ring neighbours: receive from rank-1, send to rank+1 (mod size).
    `receive_apart`: see `receives_apart` (None: RECEIVE_APART, else by device)."""

    def __init__(self, world: mx.distributed.Group, receive_apart: frozenset[str] | None = None,
                 deadlines: Deadlines | None = None, frame: int = 0, hosts: list[str] | None = None):
        self.world = world
        # Where MLX's transport has no sockets to wait on (JACCL), a worker's waits are timed instead,
        # each naming the rank (and its host, `hosts`) waited on.
        self.deadlines, self.hosts = deadlines, hosts
        # JACCL: every message the same size (ring/frames.py); its payloads arrive on the host, frame by frame.
        self.frame = frame
        self.rank, self.size = world.rank(), world.size()
        self.next, self.prev = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        self.unread = False  # a payload's recv was handed out lazily and its data not yet waited for
        metal = on_metal()
        self.apart = receives_apart(metal, receive_apart if receive_apart is not None else receive_apart_setting())
        # Wait for a payload in the kernel on a CPU device, where MLX's polling thread takes a core
        # from the stage itself, and on Metal, where a command buffer must never wait on a payload
        # that has not started to arrive (a stopped peer would abort the rank after ~5 s instead of
        # rank 0 timing the wait, STEP_TIMEOUT). On other GPUs, evaluating at once queues the stage's
        # kernels while the data is on its way (waiting first cost 1 ms a token on 2 x H200), at the
        # price of a polling core while a peer computes, or when it stopped mid-step.
        self.wait_in_kernel = mx.default_device() == mx.cpu or metal
        # On CUDA, a send that waits on the GPU polls an atomic with sleeps that grow to a quarter of
        # the wait so far (libcu++'s backoff): this thread computes the payload first, waiting on a
        # CUDA event, then sends it (a hop after a 1.4 ms stage cost 0.3 ms less on 2 x H100 and on
        # 2 x H200: tools/probe_hop.py).
        self.compute_before_send = mx.default_device() == mx.gpu and not metal
        # With tracing on (bench_steps --trace): (event, kind, group, seconds) as each step's header comes
        # in ("in"), its stage's graph is built ("built", marked by the caller) and its payload leaves ("out").
        self.trace: list[tuple[str, int, int, float]] | None = None
        self.term: tuple[float, float] | None = None  # when a SIGTERM came, and the silence allowed since

    def mark(self, event: str, header: Header) -> None:
        """Note the moment `event` happens to `header`'s step, when tracing."""
        if self.trace is not None:
            self.trace.append((event, int(header.kind), header.group, time.perf_counter()))

    def send(self, header: Header, payload: mx.array | None) -> None:
        """Pass a step on: its header, then its payload (computed within the send's graph)."""
        self.send_header(header, payload)
        self.send_payload(header, payload)

    def send_header(self, header: Header, payload: mx.array | None) -> None:
        if self.frame:
            return  # framed: the header leaves in its payload's first frame
        if payload is not None:  # the header tells the payload actually sent (the last rank trims a prefill's)
            header = replace(header, shape=tuple(payload.shape), dtype=DTYPES.index(payload.dtype))
        # Evaluated on its own, before the payload: two independent sends in one graph have no order.
        with self.timed(lambda: f"{self._who(self.next)} to take a step's header"):
            mx.eval(mx.distributed.send(header.encode(), self.next, group=self.world))

    def send_payload(self, header: Header, payload: mx.array | None) -> None:
        if self.frame:
            self._send_frames(header, payload)
        elif payload is not None and payload.ndim:
            # A payload still to arrive is received within this graph: either neighbour may be the one waited on.
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
        with self.timed(lambda: f"the payload of a {Kind(header.kind).name} step from {self._who(self.prev)}"):
            for _ in range(frame_count(header, self.frame) - 1):
                frames.append(mx.distributed.recv((self.frame,), mx.uint8, self.prev, group=self.world))
                mx.eval(frames[-1])
        return header, payload_of(header, frames)

    def recv(self, lazy: bool = False) -> tuple[Header, mx.array | None]:
        """The next step from the previous rank. `lazy`: the payload of a forward step (hidden
        states) may be left in the graph (`in_graph` decides), for a caller that calls
        `wait_payload()` and then evaluates it (with what it computes from it) before the next recv;
        `send_payload` does both. Other payloads arrive here, on the host, before this returns.
        (Building a forward step's graph must not read its input: the wait would then find no data coming.)"""
        if self.frame:
            return self._recv_frames()
        with self.timed(lambda: f"the next step from {self._who(self.prev)}", bounded=False):  # an idle ring is silent
            self._wait_for_data()
            # The header tells the payload's shape and dtype, so it must arrive first.
            header = Header.decode(mx.distributed.recv((HEADER_LEN,), mx.int32, self.prev, group=self.world))
        self.mark("in", header)
        if not header.carried:
            return header, None
        payload = mx.distributed.recv(header.shape, DTYPES[header.dtype], self.prev, group=self.world)
        self.unread = True
        if not in_graph(header.kind, lazy, self.apart):
            with self.timed(lambda: f"the payload of a {Kind(header.kind).name} step from {self._who(self.prev)}"):
                self.wait_payload()  # on the host: a stopped peer blocks this thread here, not a command buffer
                mx.eval(payload)
        return header, payload

    def _who(self, rank: int) -> str:
        return f"rank {rank} ({self.hosts[rank]})" if self.hosts else f"rank {rank}"

    def timed(self, what, bounded: bool = True):
        """A wait on other ranks, timed where the transport cannot time it (JACCL's deadlines; nothing
        elsewhere): wrap every blocking evaluation that waits on a peer, a collective's too (an all_sum).
        `what`: a function giving the words ("an all_sum with every rank"), called only if it is overdue."""
        return self.deadlines.waiting(what, bounded) if self.deadlines is not None else nullcontext()

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
        # MLX's ring thread busy-polls its sockets while a recv is pending, a whole core per waiting
        # rank (for a whole stage of the previous rank, when a header came and its payload is still
        # being computed); wait for data, or a closed peer, in the kernel first, at no cost. Only the
        # previous rank's sockets: the next rank's, once that rank is gone, would wake this at once.
        if _PREV_FDS:
            wait_readable(_PREV_FDS, lambda: self.term, self.prev)
