"""hosts.json, the ring in order, rank 0 first: read, checked for shape and resolved, in one place
for the planner, the launcher and the hosts' tools.

The file is a JSON list with one object per rank, or the object MLX's `mlx.distributed_config
--output-hostfile` writes (the list under "hosts", with "backend" and "envs", the variables every
rank gets). An entry names the machine to ssh into (`ssh`) and the address its ring sockets use
(`ips`, the first one is used), plus optional planning keys (`memory_gb`, `max_memory_gb`, `layers`,
...). Names in `ips` (`mac-b.local`) are resolved here, once, and the address is what mlx.launch
gets: ring sockets given an mDNS name fail in ways that are hard to read.

Entries may carry `rdma`, as `mlx.distributed_config --backend jaccl|jaccl-ring` writes them: per
rank, its RDMA device (Thunderbolt 5) to every other rank, null to itself and to ranks it has no
cable to. `ring_backend` alone decides from them which of MLX's backends carries the ring.
"""

import ipaddress
import json
import socket
from dataclasses import dataclass
from pathlib import Path

from mlx_ring.config import check_objects, read_json

# The planning keys an entry may carry (planning/capabilities.py reads them).
HOST_KEYS = (
    "memory_gb",
    "usable_gb",
    "max_memory_gb",
    "tflops",
    "bandwidth_gbs",
    "device",
    "layers",
    "weight",
)
KNOWN_KEYS = ("ssh", "ips", "rdma", "control", *HOST_KEYS)
EXAMPLE = (
    '[{"ssh": "mac-a.local", "ips": ["192.168.1.10"]}, {"ssh": "mac-b.local", '
    '"ips": ["192.168.1.11"]}]'
)


def read_hostfile(path: Path) -> tuple[list[dict], list[str]]:
    """The hostfile's entries (one per rank, ring order), checked for shape, and its "envs"
    (MLX's form: "NAME=value" strings, for every rank; none in a plain list)."""
    data, envs, named = read_json(path, "the hostfile", EXAMPLE), [], ""
    if isinstance(data, dict) and "hosts" in data:  # as mlx.distributed_config writes it
        unknown = sorted(set(data) - {"backend", "envs", "hosts"})
        if unknown:
            raise ValueError(
                f"the hostfile {path} has unknown key(s) {', '.join(unknown)}; MLX's hostfile has "
                "backend, envs and hosts"
            )
        if data.get("backend") not in ("", None, *BACKENDS):
            raise ValueError(
                f"the hostfile {path} is for MLX's {data['backend']!r} backend, but this ring runs "
                f"on MLX's {', '.join(BACKENDS)} backends; write it with "
                "`mlx.distributed_config --backend ring` "
                '(or jaccl, jaccl-ring), or drop "backend"'
            )
        envs = data.get("envs") or []
        if not isinstance(envs, list) or not all(
            isinstance(e, str) and "=" in e.strip("=") for e in envs
        ):
            raise ValueError(
                f'the hostfile {path}: "envs" must be a list of "NAME=value" strings, e.g. '
                '["MLX_METAL_FAST_SYNCH=1"]'
            )
        data, named = data["hosts"], data.get("backend") or ""
    entries = _check_entries(path, check_objects(data, path, "the hostfile", EXAMPLE, KNOWN_KEYS))
    # a JACCL matrix MLX would refuse is refused here, before any start
    ring_backend(entries, named, str(path))
    return entries, envs


def named_backend(path: Path) -> str:
    """The hostfile's own "backend" (MLX's form), "" if it names none."""
    data = read_json(path, "the hostfile", EXAMPLE)
    return (data.get("backend") or "") if isinstance(data, dict) else ""


def hostfile_backend(path: Path) -> str:
    """MLX's backend for the ring `path` describes (`ring_backend`)."""
    return ring_backend(load_entries(path), named_backend(path), str(path))


def format_hostfile(entries: list[dict], envs: list[str] | None = None, backend: str = "") -> str:
    """hosts.json's text: one entry a line (under "hosts", with the "envs" and "backend" of MLX's
    form, if any)."""
    text = "[\n" + ",\n".join("  " + json.dumps(e) for e in entries) + "\n]\n"
    head = (f'"backend": {json.dumps(backend)}, ' if backend else "") + (
        f'"envs": {json.dumps(envs)}, ' if envs else ""
    )
    return text if not head else f'{{{head}"hosts": {text.rstrip()}}}\n'


# MLX's backends a ring may run on: TCP sockets, and RDMA over Thunderbolt 5 (JACCL) between every
# pair of ranks (a full mesh) or between neighbours only.
BACKENDS = ("ring", "jaccl", "jaccl-ring")
RDMA_FIX = (
    "`mlx.distributed_config --over thunderbolt --backend jaccl` (or jaccl-ring) "
    "writes a hostfile with "
    'them, or drop "rdma" from every entry to run over TCP'
)


def ring_backend(entries: list[dict], named: str = "", where: str = "hosts.json") -> str:
    """MLX's backend for the ring: "jaccl" where every pair of ranks has an RDMA device (a full
    mesh), "jaccl-ring" where only ring neighbours do, "ring" (TCP) where no entry lists one or
    the hostfile names "ring". `named`: the hostfile's own "backend". The one place the choice is
    made: pipeline and tensor mode alike run on it. ValueError("what; how to fix") for a matrix
    MLX would refuse."""
    if named == "ring" or not any(_lists_devices(e.get("rdma")) for e in entries):
        if named in ("jaccl", "jaccl-ring"):
            raise ValueError(
                f"{where} is for MLX's {named!r} backend but no entry lists its RDMA devices "
                f'("rdma"); {RDMA_FIX}'
            )
        return "ring"
    n = len(entries)
    for i, e in enumerate(entries):
        rdma = e.get("rdma")
        if not isinstance(rdma, list) or len(rdma) != n:
            raise ValueError(
                f'{where}: entry {i} ({e.get("ssh")}) needs "rdma", a list of {n} '
                "devices, one for each rank in order (null for itself and for ranks it has no "
                f"cable to), as every other entry has; {RDMA_FIX}"
            )
        if rdma[i] is not None:
            raise ValueError(
                f"{where}: entry {i} ({e['ssh']}) names RDMA device {rdma[i]!r} to "
                "itself; its own place "
                f'in "rdma" (position {i}) must be null'
            )
        for j, d in enumerate(rdma):
            if d is not None and not _device(d):
                raise ValueError(
                    f"{where}: entry {i} ({e['ssh']}) has {d!r} as its RDMA device to "
                    f"rank {j}; each is a "
                    'device name such as "rdma_en3" (`ibv_devices` lists them), '
                    "a list of such names (several cables), or null"
                )
    mesh = _missing(entries, lambda i: range(n))
    ring = _missing(entries, lambda i: ((i - 1) % n, (i + 1) % n))
    if named == "jaccl" or (not named and not ring and not mesh):
        if mesh:
            raise ValueError(
                f"{where} is for JACCL's full mesh (every Mac cabled to every other), but "
                f"{_pairs(entries, mesh)}; "
                'cable them, or use "backend": "jaccl-ring" where each Mac '
                "is cabled to the next"
            )
        return "jaccl"
    if ring:
        raise ValueError(
            f"{where}: {_pairs(entries, ring)}, so the ring's neighbours cannot use RDMA; cable "
            "each Mac to the next in hosts.json's order (and the last to the first) and run "
            "`mlx.distributed_config --over thunderbolt --backend jaccl-ring` again"
        )
    return "jaccl-ring"


def _lists_devices(rdma) -> bool:
    # `--backend ring` writes "rdma": [] for every host; a list of nulls names no device either.
    return any(d is not None for d in rdma) if isinstance(rdma, list) else rdma is not None


def _device(d) -> bool:
    names = d if isinstance(d, list) else [d]
    return bool(names) and all(isinstance(x, str) and x.strip() for x in names)


def _missing(entries: list[dict], peers) -> list[tuple[int, int]]:
    return [
        (i, j) for i, e in enumerate(entries) for j in peers(i) if i != j and e["rdma"][j] is None
    ]


def _pairs(entries: list[dict], missing: list[tuple[int, int]]) -> str:
    named = ", ".join(
        f"{entries[i]['ssh']} (rank {i}) to {entries[j]['ssh']} (rank {j})" for i, j in missing[:3]
    )
    more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
    return f"no RDMA device is listed from {named}{more}"


def without_ranks(entries: list[dict], keep: list[int]) -> list[dict]:
    """The entries at `keep`, each one's "rdma" cut to the ranks kept (a
    ring without some hosts)."""
    out = []
    for i in keep:
        e = dict(entries[i])
        if e.get("rdma"):
            e["rdma"] = [e["rdma"][j] for j in keep]
        out.append(e)
    return out


def load_entries(path: Path) -> list[dict]:
    """The hostfile's entries (one per rank, ring order), checked for shape."""
    return read_hostfile(path)[0]


def _check_entries(path: Path, entries: list[dict]) -> list[dict]:
    for i, e in enumerate(entries):
        where = f"{path}: entry {i}"
        if not isinstance(e.get("ssh"), str) or not e["ssh"].strip():
            raise ValueError(
                (
                    f'{where} lacks "ssh", the name to ssh into ("127.0.0.1" for this '
                    f"machine), e.g. {EXAMPLE}"
                )
            )
        ips = e.get("ips")
        if (
            not isinstance(ips, list)
            or not ips
            or not all(isinstance(a, str) and a.strip() for a in ips)
        ):
            raise ValueError(
                f'{where} ({e["ssh"]}) lacks "ips", a list with the address its ring sockets use '
                "(Macs cabled with Thunderbolt: its end of the cable from the rank before it, "
                f"which `./launch.sh hosts --over thunderbolt` proposes), e.g. {EXAMPLE}"
            )
        control = e.get("control")
        if control is not None and (
            not isinstance(control, str) or not control.strip() or len(control.encode()) > 64
        ):
            raise ValueError(
                f'{where} ({e["ssh"]}) has "control" {control!r}; it must be the address (an IP '
                "or a name, at most 64 bytes) at which the other hosts reach this one's control "
                'link when it is rank 0, e.g. "control": "192.168.1.10"'
            )
    return entries


def control_address(path: Path) -> str | None:
    """Where the workers reach rank 0's control link, if the first entry says (its "control"):
    on a Thunderbolt ring of 3 or more Macs, rank 0's own ring addresses are its neighbours'
    alone."""
    if not path.is_file():
        return None
    control = load_entries(path)[0].get("control")
    return control.strip() if control else None


def host_keys(entry: dict) -> dict:
    """An entry's planning keys (memory_gb, max_memory_gb, layers, ...)."""
    return {k: entry[k] for k in HOST_KEYS if k in entry}


# mlx.launch starts a rank itself, without ssh, when its entry says 127.0.0.1
LOCAL = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class Host:
    rank: int
    ssh: str  # the name ssh is given ("127.0.0.1": started locally)
    address: str  # the ring address, resolved
    named: str  # the address as hosts.json spells it
    port: int  # this rank's ring port (mlx.launch: the starting port plus one per rank)
    keys: dict  # the entry's planning keys
    # JACCL: its RDMA device to each rank (None: itself, or no cable), as hosts.json lists them
    rdma: tuple = ()

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
        raise ValueError(
            f"cannot resolve {name!r} ({e.strerror or e}); put its IP address in hosts.json (on "
            "macOS: System Settings > Network > the interface > Details)"
        ) from None
    return infos[0][4][0]


def owned_here(address: str) -> bool:
    """Whether this machine owns `address` (binding it is the portable test: no ip
    or ifconfig to read)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((address, 0))
        return True
    except OSError:
        return False


def this_machine(
    name: str, address: str, resolver=resolve, owns=owned_here, hostname: str | None = None
) -> bool:
    """Whether the entry naming `name` to ssh, with ring address `address`, is this machine: its
    rank is started here, without ssh (a Mac's own Remote Login may be off), whatever name or
    address it is given."""
    me = (hostname or socket.gethostname()).lower()
    short, n = me.split(".")[0], name.strip().lower().rstrip(".")
    if n in LOCAL or n in (me, short, f"{short}.local") or owns(address):
        return True
    try:
        return owns(resolver(name))
    except ValueError:
        return False  # a name only ssh's config knows: another machine, as far as we can tell


def load_hosts(path: Path, starting_port: int, resolver=resolve, here=this_machine) -> list[Host]:
    """Every rank's host, its resolved ring address and port; ValueError naming
    the entry if wrong."""
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
            raise ValueError(
                f"{path}: entries name ring address {address} for two hosts ({owner[address]} and "
                f"{ssh}); give entry {i} its own machine's address"
            )
        hosts.append(Host(i, ssh, address, named, port, host_keys(e), tuple(e.get("rdma") or ())))
        port += 1  # mlx.launch is given one address per rank (mlx_hostfile)
    local = [h for h in hosts if h.local]
    if local and len(local) != len(hosts) and any(h.address.startswith("127.") for h in local):
        raise ValueError(
            f"{path}: rank {local[0].rank} uses ring address {local[0].address}, which other "
            "machines cannot reach; give it this machine's address on the "
            "network the others are on"
        )
    return hosts


def mlx_hostfile(hosts: list[Host], backend: str = "ring") -> list[dict]:
    """What mlx.launch reads: ssh names and resolved addresses, and for JACCL each rank's RDMA
    devices (rank 0's address is then the coordinator's)."""
    return [
        {"ssh": h.ssh, "ips": [h.address], **({"rdma": list(h.rdma)} if backend != "ring" else {})}
        for h in hosts
    ]
