"""The world of ranks MLX's ring backend joins: this rank's start in it (its ports held until MLX
listens, its ring sockets found and sized, its cores shared), the startup exchange of facts between
ranks, and the sockets to its neighbours that `closed_peer` and the transport's waits watch.

"World" is MLX's distributed group of all ranks; "group" in this project is a decode micro-batch.
"""

import ctypes
import errno
import json
import os
import socket
import stat
import time
import zlib
from pathlib import Path

import mlx.core as mx

from mlx_ring import settings
from mlx_ring.platform import boot_id, ephemeral_ports, in_ephemeral, port_holders, usable_cores


def init_world(socket_buffer: int = 0, verbose: bool = False) -> mx.distributed.Group:
    """The ranks mlx.launch started; a world of one when started alone. `socket_buffer`: if set,
    the kernel send and receive buffers of the ring's sockets, in bytes (small ones model a real
    link's, for tests). `verbose` (RING_VERBOSE): MLX's ring backend logs, on stderr, each rank's
    accepts and connection attempts while the ring forms."""
    if verbose:
        os.environ["MLX_RING_VERBOSE"] = "1"  # MLX asks only whether it is set, when the ring forms
    # mlx.launch's output threads spin on a rank's stdin pipe while it is writable (a core per rank
    # on a small machine); with our end closed, its next write fails and it stops watching the pipe.
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    before = _socket_fds()
    hostfile = settings.text("MLX_HOSTFILE")
    if hostfile and os.path.isfile(hostfile) and not Path(hostfile).read_text().strip():
        # mlx.launch writes an empty ring description for a one-host hostfile: nothing to join.
        del os.environ["MLX_HOSTFILE"]
    # RDMA: no sockets of MLX's to hold, find or watch (ring/deadline.py)
    if world_backend() == "jaccl":
        try:
            world = mx.distributed.init(backend="jaccl", strict=True)
        # which rank, its devices, and where the ranks meet (launcher/failures.py)
        except RuntimeError as e:
            raise RuntimeError(
                f"rank {settings.text('MLX_RANK')} could not join the JACCL ring (its RDMA devices "
                f"{_own_devices()}, coordinator {settings.text('MLX_JACCL_COORDINATOR')}): {e}"
            ) from e
        _share_cores(world)
        return world
    held = _hold_own_ports()
    try:
        world = mx.distributed.init(backend="ring")
    # "[ring] Couldn't connect (error: 65)": which rank, to what (launcher/failures.py)
    except RuntimeError as e:
        rank = settings.text("MLX_RANK")
        if rank is None or not settings.text("MLX_HOSTFILE"):
            raise
        after = (int(rank) + 1) % len(ring_description())
        raise RuntimeError(
            f"rank {rank} could not join the ring (its next rank, {after}, at "
            f"{', '.join(f'{ip}:{port}' for ip, port in _ring_addresses(after))}): {e}"
        ) from e
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
    _PEER_FDS.update(
        {fd: (rank - 1) % size if fd in _PREV_FDS else (rank + 1) % size for fd, _, _ in links}
    )
    _share_cores(world)
    return world


def _own_devices() -> str:
    try:
        row = json.loads(Path(settings.text("MLX_IBV_DEVICES")).read_text())[
            int(settings.text("MLX_RANK") or 0)
        ]
    except (OSError, ValueError, IndexError):
        return "unknown"
    return ", ".join(str(d) for d in row if d is not None) or "none"


def world_backend() -> str:
    """MLX's backend mlx.launch set this rank up for: "jaccl" (its RDMA devices file given, for
    --backend jaccl and jaccl-ring alike), else "ring"."""
    return "jaccl" if settings.text("MLX_IBV_DEVICES") else "ring"


PORT_WAIT_S = 10  # a rank of a ring that just stopped may hold its port a moment longer


def _hold_own_ports() -> list[socket.socket]:
    """Bind this rank's ring addresses (not listening) until MLX's ring backend listens on them,
    where they lie in the ephemeral port range. The last rank connects out before it listens, and
    the kernel may give that outgoing connection the rank's own port as its ephemeral one: the
    listen then fails, and for a minute (TIME_WAIT) so does every restart. A bound port is never
    handed out; MLX binds beside ours (SO_REUSEPORT). A port outside the range (the default ring
    ports, 32323 and up, with macOS's range and with Linux's default one) is never handed out: it
    is only checked, then let go."""
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
                    raise ValueError(
                        f"this host cannot listen on its ring address {ip}:{port} ({e.strerror}); "
                        "put one of its own addresses in its hosts.json entry"
                    ) from None
                if time.monotonic() > deadline:
                    s.close()
                    raise ValueError(
                        f"ring port {port} on {ip} is in use ({e.strerror}); stop what holds it "
                        f"(`{port_holders(port)}` shows it) or choose another RING_PORT"
                    ) from None
                time.sleep(0.5)
        if in_ephemeral(port, ephemeral):
            held.append(s)
        else:
            s.close()
    return held


def _ring_sockets(fds: set[int], buffer: int) -> list[tuple[int, int, int]]:
    """(fd, local port, peer port) of each connected socket among `fds`; sets
    its buffers if `buffer`."""
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


def ring_description() -> list[list[str]] | None:
    """mlx.launch's ring description (MLX_HOSTFILE): per rank, the "ip:port" addresses it listens
    on. Read before the rank drops that temporary file (server.main), for what needs it later."""
    hostfile = settings.text("MLX_HOSTFILE")
    if not hostfile:
        return None
    with open(hostfile) as f:
        return json.load(f)


def split_address(address: str) -> tuple[str, int]:
    """An "ip:port" address of mlx.launch's ring description as (ip, port), an IPv6
    address's brackets dropped."""
    ip, port = address.rsplit(":", 1)
    return ip.strip("[]"), int(port)


def _ring_addresses(rank: int) -> list[tuple[str, int]]:
    return [
        (ip, int(port))
        for ip, port in (address.rsplit(":", 1) for address in ring_description()[rank])
    ]


def _ring_ports(rank: int) -> set[int]:
    return {port for _, port in _ring_addresses(rank)}


EXCHANGE_BYTES = 16384  # fixed row width of the startup exchange; plenty for a hostfile's overrides


def exchange(mine: dict, world: mx.distributed.Group) -> list[dict]:
    """Every rank's `mine` (plain JSON data), on every rank: one all_gather
    of fixed-width byte rows."""
    data = json.dumps(mine, sort_keys=True).encode()
    if len(data) > EXCHANGE_BYTES:
        raise ValueError(
            f"the startup exchange is {len(data)} bytes, over {EXCHANGE_BYTES}; shorten hosts.json"
        )
    row = mx.array([list(data.ljust(EXCHANGE_BYTES, b"\0"))], dtype=mx.int32)
    rows = (
        mx.distributed.all_gather(row, group=world).tolist() if world.size() > 1 else row.tolist()
    )
    return [json.loads(bytes(r).rstrip(b"\0")) for r in rows]


def machine() -> str:
    """What names the cores this rank runs on: its machine's boot id (one per running kernel, so
    containers and network namespaces that share the cores share it), else the host name; and the
    cores it is pinned to, if it is (ranks pinned apart do not share their cores)."""
    pinned = usable_cores()
    return (boot_id() or socket.gethostname()) + (f" cores {sorted(pinned)}" if pinned else "")


def _share_cores(world: mx.distributed.Group) -> None:
    """Ranks on one machine split its cores between their BLAS thread pools: oversubscribed pools
    spin against each other (2 ranks on 2 cores decoded 1.5x slower with a pool of 2 each)."""
    me = zlib.crc32(machine().encode()) & 0x7FFFFFFF
    hosts = mx.distributed.all_gather(mx.array([me], dtype=mx.int32), group=world).tolist()
    local = hosts.count(me)
    _CORES[:] = [max(1, len(usable_cores() or range(os.cpu_count() or 1)) // local)]
    # OpenBLAS, when preloaded
    set_threads = getattr(ctypes.CDLL(None), "openblas_set_num_threads", None)
    if local > 1 and set_threads is not None:
        set_threads(_CORES[0])


_CORES: list[int] = []  # filled by init_world (`_share_cores`)


def cores_each() -> int:
    """The cores this rank has to itself: those it may run on, shared evenly with the other ranks on
    its machine (0 before `init_world`)."""
    return _CORES[0] if _CORES else 0


# The sockets the ring backend opened from the previous rank (see Ring.recv). Filled by init_world.
_PREV_FDS: list[int] = []
# Every socket to a ring neighbour, and that neighbour's rank (see
# `closed_peer`). Filled by init_world.
_PEER_FDS: dict[int, int] = {}


def closed_peer() -> int | None:
    """A ring neighbour whose end of a socket is closed (its process is gone), or None. Peeks, so
    the ring backend's own reads lose nothing."""
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


def prev_fds() -> list[int]:
    """The sockets the previous rank sends on (filled by init_world; empty before)."""
    return _PREV_FDS
