"""hosts.json: one entry per rank, in ring order, checked for shape before anything starts.

An entry names the machine to ssh into (`ssh`) and the address its ring sockets use (`ips`, the
first one is used), plus optional planning keys (`memory_gb`, `max_memory_gb`, `layers`, ...).
Names in `ips` (`mac-b.local`) are resolved here, once, and the address is what mlx.launch gets:
ring sockets given an mDNS name fail in ways that are hard to read.
"""

import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path

from mlx_ring.planning.entries import host_keys, load_entries

LOCAL = ("127.0.0.1", "localhost")  # mlx.launch starts a rank itself, without ssh, when its entry says 127.0.0.1


@dataclass(frozen=True)
class Host:
    rank: int
    ssh: str  # the name ssh is given ("127.0.0.1": started locally)
    address: str  # the ring address, resolved
    named: str  # the address as hosts.json spells it
    port: int  # this rank's ring port (mlx.launch: the starting port plus one per rank)
    keys: dict  # the entry's planning keys

    @property
    def local(self) -> bool:
        return self.ssh in LOCAL


def resolve(name: str) -> str:
    """An IPv4 address for `name` (itself if it is an address)."""
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError as e:
        raise ValueError(f"cannot resolve {name!r} ({e.strerror or e}); put its IP address in hosts.json "
                         "(on macOS: System Settings > Network > the interface > Details)") from None
    return infos[0][4][0]


def owned_here(address: str) -> bool:
    """Whether this machine owns `address` (binding it is the portable test: no ip or ifconfig to read)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((address, 0))
        return True
    except OSError:
        return False


def this_machine(name: str, address: str, resolver=resolve, owns=owned_here, hostname: str | None = None) -> bool:
    """Whether the entry naming `name` to ssh, with ring address `address`, is this machine: its rank is
    started here, without ssh (a Mac's own Remote Login may be off), whatever name or address it is given."""
    me = (hostname or socket.gethostname()).lower()
    short, n = me.split(".")[0], name.strip().lower().rstrip(".")
    if n in LOCAL or n in (me, short, f"{short}.local") or owns(address):
        return True
    try:
        return owns(resolver(name))
    except ValueError:
        return False  # a name only ssh's config knows: another machine, as far as we can tell


def load_hosts(path: Path, starting_port: int, resolver=resolve, here=this_machine) -> list[Host]:
    """Every rank's host, its resolved ring address and port; ValueError naming the entry if wrong."""
    entries = load_entries(path)
    hosts, port, owner = [], starting_port, {}
    for i, e in enumerate(entries):
        named = e["ips"][0].strip()
        try:
            address = resolver(named)
        except ValueError as err:
            raise ValueError(f"{path}: entry {i} ({e['ssh']}): {err}") from None
        ssh = "127.0.0.1" if here(e["ssh"], address, resolver) else e["ssh"].strip()
        # Two machines cannot own one address: the second one's ring sockets could not bind it.
        if owner.setdefault(address, ssh) != ssh:
            raise ValueError(f"{path}: entries name ring address {address} for two hosts ({owner[address]} and "
                             f"{ssh}); give entry {i} its own machine's address")
        hosts.append(Host(i, ssh, address, named, port, host_keys(e)))
        port += 1  # mlx.launch is given one address per rank (mlx_hostfile)
    local = [h for h in hosts if h.local]
    if local and len(local) != len(hosts) and any(h.address.startswith("127.") for h in local):
        raise ValueError(f"{path}: rank {local[0].rank} uses ring address {local[0].address}, which other machines "
                         "cannot reach; give it this machine's address on the network the others are on")
    return hosts


def mlx_hostfile(hosts: list[Host]) -> list[dict]:
    """What mlx.launch reads: ssh names and resolved addresses, nothing else."""
    return [{"ssh": h.ssh, "ips": [h.address]} for h in hosts]
