"""RDMA over Thunderbolt 5 (JACCL) on the hosts before a start: the devices hosts.json gives each
Mac against those its `ibv_devices` lists (macos_settings parses them), and, for `check` on a TCP
ring of Macs, whether JACCL could carry it and how a Mac turns it on."""

from mlx_ring.hostfile import Host
from mlx_ring.macos_settings import rdma_advice


def where(name: str) -> str:
    return "this machine" if name == "127.0.0.1" else name


def rdma_problems(hosts: list[Host], facts: dict) -> tuple[list[str], list[str]]:
    """(problems, warnings): a device hosts.json gives a Mac that it does not have is a problem
    (JACCL could not open it), with what to do; a port that is down is a warning."""
    problems, warn = [], []
    for h in hosts:
        f = facts.get(h.ssh)
        wanted = sorted(
            {d for x in h.rdma if x is not None for d in ([x] if isinstance(x, str) else x)}
        )
        if not wanted or f is None:
            continue
        name = f"{where(h.ssh)} (rank {h.rank})"
        if not f.system.startswith("Darwin"):
            problems.append(
                f"{name} is not a Mac ({f.system}), but hosts.json gives it RDMA "
                "devices: JACCL runs "
                'over Thunderbolt 5 between Macs; drop "rdma" from '
                "hosts.json to run over TCP"
            )
            continue
        missing = [d for d in wanted if d not in f.rdma]
        if missing:
            have = f"lists {', '.join(f.rdma)}" if f.rdma else "lists none"
            fix = rdma_advice(f.macos, f.rdma) or (
                "a cable may have moved to another port: run `mlx.distributed_config --over "
                "thunderbolt --backend jaccl` (or jaccl-ring) again"
            )
            problems.append(
                f"{name}: hosts.json gives it RDMA device(s) {', '.join(missing)}, but "
                f"`ibv_devices` there {have}; {fix}"
            )
        warn += [
            f"{name}: RDMA device {d}'s port is {f.rdma[d]} (its cable is out, or the Mac at the "
            "other end has not turned RDMA on)"
            for d in wanted
            if f.rdma.get(d) not in (None, "", "PORT_ACTIVE")
        ]
    return problems, warn


def rdma_notes(hosts: list[Host], facts: dict, backend: str) -> list[str]:
    """On a TCP ring (`backend` "ring") of several Macs: whether JACCL could carry it, and what a
    Mac without RDMA devices needs to turn it on."""
    macs = {
        h.ssh: facts[h.ssh]
        for h in hosts
        if h.ssh in facts and facts[h.ssh].system.startswith("Darwin")
    }
    # as its ssh reaches each
    names = [(f.hostname or n) if n == "127.0.0.1" else n for n, f in macs.items()]
    if len(macs) < 2 or backend != "ring":
        return []
    lacking = [
        f"  {where(n)}: {rdma_advice(f.macos, f.rdma)}"
        for n, f in sorted(macs.items())
        if not f.rdma
    ]
    if lacking:
        return [
            "RDMA over Thunderbolt 5 (JACCL) links Macs cabled to each other faster than TCP:",
            *lacking,
        ]
    return [
        "every Mac has RDMA over Thunderbolt devices: `mlx.distributed_config --over thunderbolt "
        f"--backend jaccl --hosts {','.join(names)} --output-hostfile hosts.json` writes a "
        "hostfile that runs the ring over it (JACCL; --backend jaccl-ring where each Mac is "
        "cabled only to its neighbours)"
    ]
