"""Thunderbolt addressing for Macs cabled in a ring: read each Mac's Thunderbolt ports and their
peers (system_profiler, networksetup), give every cable its own /30 subnet as MLX's
`mlx.distributed_config --over thunderbolt --backend ring` does, in a range none of the Macs'
networks overlaps, and write hosts.json in ring order.

The setup lasts across restarts, as exo's helper makes it: the "Thunderbolt Bridge" service is
turned off (its bridge joins every port, a layer-2 loop on three Macs) and each cabled port gets a
network service of its own with its static address.

`python -m mlx_ring.hosts.thunderbolt` prints the commands for each Mac and the hosts.json;
`--apply` runs the commands (sudo, asking in this terminal), `--write` saves hosts.json.
"""

import argparse
import ipaddress
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from mlx_ring import settings
from mlx_ring.config import ROOT
from mlx_ring.hostfile import (
    LOCAL,
    format_hostfile,
    hostfile_backend,
    read_hostfile,
    this_machine,
)
from mlx_ring.hosts import netsetup, ssh
from mlx_ring.hosts.mac_facts import SCRIPT, MacFacts, parse_facts
from mlx_ring.platform import Interface, parse_ifconfig_interfaces
from mlx_ring.rundir import RunDir

try:  # MLX's own tool; private, so an MLX without it is told to upgrade rather than crash
    from mlx._distributed_utils import config as mlx_config
except ImportError:
    mlx_config = None

# where MLX's IPConfigurator numbers the cables from
MLX_BASE = ipaddress.IPv4Address("192.168.0.0")


@dataclass
class Proposal:
    ring: list[int]  # hosts.json entry indices in ring order, starting with rank 0's
    entries: list[dict]  # the hosts.json to write
    # ssh name -> commands to run there as root (netsetup.setup_commands)
    commands: dict[str, list[str]]
    # (host, iface, peer host, peer iface) per ring neighbour pair
    cables: list[tuple[str, str, str, str]]
    # ssh name -> (iface, address) of each of its cabled ports
    addresses: dict[str, list[tuple[str, str]]]


def _mlx():
    if mlx_config is None:
        import mlx.core as mx

        raise ValueError(
            f"this MLX ({mx.__version__}) lacks mlx._distributed_utils.config, the code behind "
            "`mlx.distributed_config --over thunderbolt` that this command reuses; run "
            "`./launch.sh setup` for the locked MLX, or set the addresses by hand "
            "as docs/mac.md shows"
        )
    return mlx_config


def thunderbolt_host(mac: MacFacts):
    """MLX's ThunderboltHost for one Mac: its Thunderbolt ports (network interface, domain UUID,
    and the UUID of the Mac at the other end of the cable, if any)."""
    cfg = _mlx()
    if mac.system != "Darwin":
        raise ValueError(
            f"{mac.host} is not a Mac ({mac.system or 'no uname'}): Thunderbolt addressing is for "
            "Macs cabled together; put its Ethernet address in hosts.json instead"
        )
    if mac.thunderbolt is None:
        raise ValueError(
            f"{mac.host}: system_profiler printed nothing; run `system_profiler "
            "SPThunderboltDataType -json` there to see why"
        )
    iface = cfg.parse_hardware_ports(mac.ports.encode())
    # extract_connectivity's parse, which MLX does not offer apart from its own ssh calls.
    name, ports = "", []
    for t in mac.thunderbolt.get("SPThunderboltDataType", []):
        uuid = t.get("domain_uuid_key")
        if uuid is None:
            continue
        name, tag = t["device_name_key"], t["receptacle_1_tag"]["receptacle_id_key"]
        peers = [i["domain_uuid_key"] for i in t.get("_items", []) if "domain_uuid_key" in i]
        if f"Thunderbolt {tag}" not in iface:
            raise ValueError(
                f'{mac.host}: networksetup lists no "Thunderbolt {tag}" port for '
                f"Thunderbolt receptacle {tag}; check `networksetup -listallhardwareports` there"
            )
        ports.append(
            cfg.ThunderboltPort(iface[f"Thunderbolt {tag}"], uuid, peers[0] if peers else None)
        )
    return cfg.ThunderboltHost(name, sorted(ports, key=lambda p: p.iface))


def _ring_order(connectivity: list[list[int]], names: list[str]) -> list[int]:
    n = len(connectivity)
    as_listed = list(range(n))
    if all(connectivity[i][(i + 1) % n] > 0 for i in range(n)):
        return as_listed  # hosts.json's order is already cabled as a ring: keep it (and its rank 0)
    rings = [r for r, _ in _mlx().extract_rings(connectivity) if len(r) == n]
    if not rings:
        cables = [
            f"{names[i]}-{names[j]}"
            for i in range(n)
            for j in range(i + 1, n)
            if connectivity[i][j]
        ]
        raise ValueError(
            f"no Thunderbolt ring runs through all {n} Macs (cables found: "
            f"{', '.join(cables) or 'none'}); cable each Mac to the next and the "
            "last back to the first"
        )
    ring = rings[0]
    start = ring.index(0)
    return ring[start:] + ring[:start]  # rank 0 stays hosts.json's first entry (it serves the API)


def thunderbolt_devices(mac: MacFacts) -> set[str]:
    """The devices of a Mac's Thunderbolt ports ("Thunderbolt 1" -> en2), and bridges over them."""
    ports = _mlx().parse_hardware_ports(mac.ports.encode())
    devices = {d for p, d in ports.items() if p.startswith("Thunderbolt ")}
    return devices | {n for n, i in mac.interfaces.items() if set(i.members) & devices}


def taken_networks(macs: list[MacFacts]) -> list[ipaddress.IPv4Network]:
    """Every subnet a Mac is on now, less those of its Thunderbolt ports (the ring's own, from an
    earlier setup), loopback and self-assigned 169.254/16."""
    taken = []
    for mac in macs:
        ours = thunderbolt_devices(mac)
        for name, iface in mac.interfaces.items():
            for net in map(ipaddress.IPv4Network, iface.networks):
                if name not in ours and not (net.is_loopback or net.is_link_local):
                    taken.append(net)
    return taken


def subnet_base(cables: int, taken: list[ipaddress.IPv4Network]) -> ipaddress.IPv4Address:
    """Where to number the cables' /30s from (4 addresses each, as MLX lays them out from
    192.168.0.0): MLX's own start when no Mac is on a network there, else the first /24 step
    that overlaps none (a home network on 192.168.0.0/24 would otherwise lose its router's
    address to a cable)."""
    starts = [ipaddress.IPv4Address(f"192.168.{k}.0") for k in range(256)]
    starts += [ipaddress.IPv4Address(f"172.{16 + k // 256}.{k % 256}.0") for k in range(16 * 256)]
    for base in starts:
        nets = [ipaddress.IPv4Network(f"{base + 4 * c}/30") for c in range(cables)]
        if nets[-1].broadcast_address.is_private and not any(
            n.overlaps(t) for n in nets for t in taken
        ):
            return base
    raise ValueError(
        "every private range this tries (192.168.0.0/16, 172.16.0.0/12) overlaps a network one of "
        "the Macs is on; set the cables' addresses by hand as docs/mac.md shows"
    )


def propose(entries: list[dict], macs: list[MacFacts]) -> Proposal:
    """Per-cable addresses, commands and hosts.json for the Macs of `entries` (hosts.json's, in
    order), as MLX's IPConfigurator and configure_ring compute them."""
    cfg = _mlx()
    names = [e["ssh"] for e in entries]
    if len(set(names)) != len(names):
        raise ValueError(
            "hosts.json names one machine twice; Thunderbolt addressing needs one entry per Mac"
        )
    if len(entries) < 2:
        raise ValueError("hosts.json has one host: there is no Thunderbolt cable to address")
    tb = [thunderbolt_host(m) for m in macs]
    index = {p.uuid: (i, j) for i, h in enumerate(tb) for j, p in enumerate(h.ports)}
    # (node, peer) -> [(iface, address)], one per cable
    ips = cfg.IPConfigurator(None, tb, index).ips
    # MLX numbers the cables from 192.168.0.0; the same layout moves to a range no Mac is on.
    base = subnet_base(sum(len(v) for v in ips.values()) // 2, taken_networks(macs))
    ips = {
        k: [(i, str(base + (int(ipaddress.IPv4Address(a)) - int(MLX_BASE)))) for i, a in v]
        for k, v in ips.items()
    }
    ring = _ring_order(cfg.make_connectivity_matrix(tb, index), names)
    # MLX's ring backend (ring.cpp, RingGroup): rank r listens on its own entry's addresses and
    # connects to rank r+1's. So an entry's address is where its predecessor reaches it: rank r's
    # end of the cable from rank r-1, which configure_ring picks (ips[node, ring[i - 1]]). A /30 on
    # that cable is reachable from r-1 alone, which is all the ring needs: it only talks to
    # neighbours. A second cable between the same two Macs is addressed too, but the ring uses one
    # address per rank (hostfile.mlx_hostfile).
    out = [dict(entries[node], ips=[ips[node, ring[i - 1]][0][1]]) for i, node in enumerate(ring)]
    commands, addresses = {}, {}
    # IPConfigurator.setup's addresses, set to last
    for i, (name, mac) in enumerate(zip(names, macs)):
        addresses[name] = [a for j in range(len(names)) for a in ips.get((i, j), [])]
        commands[name] = netsetup.setup_commands(
            cfg.parse_hardware_ports(mac.ports.encode()),
            mac.services,
            "bridge0" in mac.interfaces,
            addresses[name],
        )
    cables = [
        (names[a], ips[a, b][0][0], names[b], ips[b, a][0][0])
        for a, b in (
            (ring[i], ring[(i + 1) % len(ring)]) for i in range(len(ring) if len(ring) > 2 else 1)
        )
    ]
    return Proposal(ring, out, commands, cables, addresses)


def format_proposal(p: Proposal) -> str:
    """What the command prints: the ring, each Mac's commands, the hosts.json it would write."""
    order = [e["ssh"] for e in p.entries]
    lines = ["Thunderbolt ring (rank order): " + " -> ".join(order + order[:1])]
    lines += [f"  cable {a} {ia} <-> {b} {ib}" for a, ia, b, ib in p.cables]
    for host, cmds in p.commands.items():
        where = "this Mac" if host in LOCAL else host
        lines += [
            "",
            f"# on {where} (an administrator's sudo; lasts across restarts):",
            *(f"sudo {c}" for c in cmds),
        ]
    lines += [
        "",
        "hosts.json (ring order; each rank's ips: its end of the cable from the rank before it):",
        format_hostfile(p.entries).rstrip(),
    ]
    return "\n".join(lines)


def read_interfaces(conf: Path, host: str, local: bool) -> dict[str, Interface]:
    """`parse_ifconfig` of `host` (this machine when `local`); empty where there is no ifconfig."""
    return parse_ifconfig_interfaces(
        ssh.run_on(conf, host, local, "PATH=$PATH:/sbin; ifconfig 2>/dev/null", timeout=30).stdout
    )


def gather(conf: Path, entries: list[dict]) -> list[MacFacts]:
    """Every hosts.json entry's facts at once; ValueError naming each host that
    could not be read."""

    def one(e: dict) -> MacFacts:
        local = this_machine(e["ssh"], e["ips"][0])  # this Mac: read here, not over ssh
        return parse_facts(e["ssh"], ssh.run_on(conf, e["ssh"], local, SCRIPT, timeout=90).stdout)

    with ThreadPoolExecutor(len(entries)) as pool:
        futures = [pool.submit(one, e) for e in entries]
    # ssh.SshError too
    errors = [str(f.exception()) for f in futures if isinstance(f.exception(), ValueError)]
    if errors:
        raise ValueError("; ".join(errors))
    return [f.result() for f in futures]


def apply(conf: Path, p: Proposal) -> list[str]:
    """Run each Mac's commands as root, detached (netsetup.start: sudo asks in this
    terminal, over `ssh -t` for the other Macs), wait for each to finish, then read ifconfig
    back; problems as sentences."""
    problems = []
    # Other Macs first: a .local name may resolve to a bridge0 address, which this Mac's bridge0
    # going down would cut off.
    here = {e["ssh"] for e in p.entries if this_machine(e["ssh"], e["ips"][0])}
    for host, cmds in sorted(p.commands.items(), key=lambda hc: hc[0] in here):
        local = host in here
        try:
            problem = netsetup.start(conf, host, local, cmds) or netsetup.finished(
                conf, host, local
            )
        except ValueError as e:  # ssh could not reach it
            problem = str(e)
        if problem:
            problems.append(problem)
    if problems:
        return problems
    for mac, entry in zip(gather(conf, p.entries), p.entries):
        held = {a for i in mac.interfaces.values() for a in i.addresses}
        if entry["ips"][0] not in held:
            problems.append(
                f"{mac.host} does not hold {entry['ips'][0]} after --apply (it holds "
                f"{', '.join(sorted(held))}); is the cable in? else run the commands printed for "
                f"{mac.host} there by hand"
            )
    return problems


def main(argv: list[str] | None = None) -> int:
    a = argparse.ArgumentParser(prog="./launch.sh hosts", description=__doc__.split("\n\n")[0])
    a.add_argument("--over", choices=["thunderbolt"], default="thunderbolt")
    a.add_argument("--hostfile", type=Path, default=ROOT / settings.text("HOSTFILE"))
    a.add_argument(
        "--apply",
        action="store_true",
        help="run the commands on each Mac (sudo there, asking here)",
    )
    a.add_argument("--write", action="store_true", help="save the hosts.json (the old one as .bak)")
    args = a.parse_args(argv)
    try:
        entries, envs = read_hostfile(args.hostfile)
        if args.write and hostfile_backend(args.hostfile) != "ring":
            # Its ips are the Macs' LAN addresses (rank 0's is where every rank meets) and its rdma
            # lists follow hosts.json's order: a TCP ring's Thunderbolt addresses in ring order
            # would break both.
            raise ValueError(
                f"{args.hostfile} runs the ring over RDMA (JACCL), which --write would turn into a "
                "TCP ring; --apply alone saves each cable's addresses across restarts, and "
                "`mlx.distributed_config --over thunderbolt --backend jaccl` "
                "writes JACCL hostfiles"
            )
        conf = ssh.write_config(
            RunDir(ROOT / settings.text("LOG_DIR")).ssh_config, settings.text("RING_SSH_CONFIG")
        )
        proposal = propose(entries, gather(conf, entries))
        print(format_proposal(proposal))
        if args.apply:
            problems = apply(conf, proposal)
            for problem in problems:
                print(f"cannot apply: {problem}", file=sys.stderr)
            if problems:
                return 2
            print("\napplied on every Mac; they keep these addresses across restarts")
        if args.write:
            shutil.copyfile(args.hostfile, args.hostfile.with_name(args.hostfile.name + ".bak"))
            args.hostfile.write_text(format_hostfile(proposal.entries, envs))
            print(f"\nwrote {args.hostfile} (the old one is {args.hostfile.name}.bak)")
        elif not args.apply:
            print(
                (
                    "\nnothing changed: --apply sets these addresses on the Macs, --write "
                    "saves this hosts.json"
                )
            )
    except ValueError as e:
        print(f"cannot propose Thunderbolt addresses: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
