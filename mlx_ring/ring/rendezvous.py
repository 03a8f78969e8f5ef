"""How the ranks meet on the control link (control.py): rank 0 listens on every address, on a
port the system picks, and tells the workers that port, this launch's token and, where hosts.json
gives one, the address to reach it at (`control`), in one all_gather, which every transport has;
each worker connects at the first address that answers and says who it is.
"""

import logging
import os
import secrets
import socket
import struct
import time

import mlx.core as mx

from mlx_ring.platform import local_network_hint
from mlx_ring.ring.control import (
    CONNECT_S,
    HELLO,
    MESSAGE,
    TOKEN,
    Peer,
    Spoke,
    Star,
    read_exact,
    tune,
)

log = logging.getLogger(__name__)

ADDRESS_MAX = 64  # bytes of a `control` address that the all_gather carries (a name or an IP)


def rank0_addresses(description: list | None, control: str | None = None) -> list[str]:
    """Where a worker may reach rank 0, in order: the address hosts.json gives (`control`), rank
    0's first ring address (a LAN, or this machine), the address rank 0's ssh came from (the one
    that reached this host, on a Thunderbolt ring where rank 0's ring addresses are a neighbour's
    alone), JACCL's coordinator."""
    out = [control] if control else []
    if description and isinstance(description[0], list) and description[0]:
        out.append(description[0][0].rsplit(":", 1)[0].strip("[]"))
    if ssh := os.environ.get("SSH_CONNECTION", "").split():
        out.append(ssh[0])
    if coordinator := os.environ.get("MLX_JACCL_COORDINATOR", ""):
        out.append(coordinator.rsplit(":", 1)[0].strip("[]"))
    return list(dict.fromkeys(out)) or ["127.0.0.1"]


def open_control(
    world: mx.distributed.Group,
    description: list | None,
    hosts: list[str],
    step_timeout: float,
    control: str | None = None,
) -> Star | Spoke:
    """Every rank of `world` calls this at the same point of its start (the module's doc);
    `control`: on rank 0, the address hosts.json gives for it (its entry's `control`)."""
    rank, size = world.rank(), world.size()
    listener = None
    if rank == 0:
        listener = _listener()
        mine = [listener.getsockname()[1], secrets.randbits(31), secrets.randbits(31)]
        mine += address_ints(control)
    else:
        mine = [0] * (3 + ADDRESS_MAX)
    rows = mx.distributed.all_gather(mx.array([mine], dtype=mx.int32), group=world)
    port, high, low, *said = rows[0].tolist()
    token = (high << 31) | low
    if rank == 0:
        with listener:
            return Star(_accept(listener, size - 1, token, hosts), step_timeout)
    addresses = rank0_addresses(description, address_of(said))
    return Spoke(_connect(addresses, port, rank, token, hosts[0]), rank)


def address_ints(address: str | None) -> list[int]:
    """`address` as ADDRESS_MAX ints (a byte each, 0 after it), for the all_gather."""
    data = (address or "").encode()
    if len(data) > ADDRESS_MAX:
        raise ValueError(
            f"the control address {address!r} is longer than {ADDRESS_MAX} bytes; give an IP"
        )
    return list(data) + [0] * (ADDRESS_MAX - len(data))


def address_of(ints: list[int]) -> str | None:
    """What `address_ints` made, back (None where it carried none)."""
    data = bytes(b for b in ints if b)
    return data.decode() if data else None


def _listener() -> socket.socket:
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("", 0))


def _accept(listener: socket.socket, n: int, token: int, hosts: list[str]) -> list[Peer]:
    """The `n` workers' sockets, by rank; one of another launch, or that says nothing, is
    closed and the wait goes on."""
    peers: dict[int, Peer] = {}
    end = time.monotonic() + CONNECT_S
    while len(peers) < n:
        listener.settimeout(max(0.1, end - time.monotonic()))
        try:
            sock, _ = listener.accept()
        except OSError as e:
            missing = sorted(set(range(1, n + 1)) - set(peers))
            raise RuntimeError(
                f"rank(s) {missing} ({', '.join(hosts[r] for r in missing)}) opened no control "
                f"link to rank 0 within {CONNECT_S:.0f} s ({e}): a firewall, or no route to "
                "rank 0's address from there"
            ) from e
        sock.settimeout(5.0)
        try:
            kind, rank = MESSAGE.unpack(read_exact(sock, MESSAGE.size, "a worker"))
            (said,) = TOKEN.unpack(read_exact(sock, TOKEN.size, "a worker"))
        except (RuntimeError, struct.error):
            sock.close()
            continue
        if kind != HELLO or said != token or not 0 < rank <= n or rank in peers:
            sock.close()  # not this launch's
            continue
        peers[rank] = Peer(tune(sock), rank, hosts[rank])
    return [peers[r] for r in sorted(peers)]


def _connect(addresses: list[str], port: int, rank: int, token: int, host0: str) -> Peer:
    """The socket to rank 0, at the first of `addresses` that answers."""
    errors = []
    end = time.monotonic() + CONNECT_S
    while time.monotonic() < end:
        for address in addresses:
            try:
                sock = socket.create_connection((address, port), timeout=3.0)
            except OSError as e:
                errors.append(f"{address}: {e}")
                continue
            sock.sendall(MESSAGE.pack(HELLO, rank) + TOKEN.pack(token))
            log.info("control link to rank 0 (%s) at %s, port %d", host0, address, port)
            return Peer(tune(sock), 0, host0)
        time.sleep(0.5)
    said = "; ".join(errors[-len(addresses) :])
    if "No route to host" in said and (hint := local_network_hint()):
        said += f" ({hint})"
    raise RuntimeError(
        f"rank {rank} could not open its control link to rank 0 ({host0}) on port {port}: {said}"
    )
