"""A hostfile's ring addresses checked against cabled Macs: the warnings where they misroute or
loop, and whether a Mac lost its Thunderbolt address (as a restart loses it)."""

import ipaddress

from mlx_ring.hostfile import Host
from mlx_ring.platform import Interface

FIX = (
    "give each cable its own subnet as MLX does: `./launch.sh hosts --over thunderbolt` prints the "
    "commands and the hosts.json (then `--apply` and `--write`)"
)


def hostfile_warnings(
    hosts: list[Host], interfaces: dict[str, dict[str, Interface]] | None = None
) -> list[str]:
    """Sentences about ring addresses that misbehave on cabled Macs, each with the fix.
    `interfaces`: per ssh name, `parse_ifconfig` of that host (optional; without it the bridge0
    check is skipped)."""
    warnings, interfaces = [], interfaces or {}
    link_local = [
        h
        for h in hosts
        if ipaddress.ip_address(h.address) in ipaddress.ip_network("169.254.0.0/16")
    ]
    if link_local:
        which = ", ".join(f"rank {h.rank} ({h.ssh}) {h.address}" for h in link_local)
        # Self-assigned addresses all share 169.254/16, and macOS routes that subnet out of one
        # interface (usually Wi-Fi), so ring traffic can leave by the wrong port and be lost.
        warnings.append(
            f"link-local ring address(es) {which}: macOS keeps one route for 169.254/16, usually "
            f"on Wi-Fi, so ring traffic can leave by the wrong port; {FIX}"
        )
    if len(hosts) >= 3 and interfaces:
        # Every Thunderbolt port is a bridge0 member and macOS's bridge has no loop
        # protection: three or more Macs cabled in a ring with bridge0 up forward broadcasts
        # round forever (a broadcast storm).
        bridge = {h.ssh: interfaces.get(h.ssh, {}).get("bridge0") for h in hosts}
        on_bridge = [h for h in hosts if bridge[h.ssh] and h.address in bridge[h.ssh].addresses]
        looped = all(b and b.up and len(b.members) > 1 for b in bridge.values())
        if on_bridge or looped:
            ranks = ", ".join(f"{h.rank} ({h.ssh})" for h in on_bridge)
            why = (
                f"rank(s) {ranks} use Thunderbolt Bridge (bridge0) addresses"
                if on_bridge
                else "Thunderbolt Bridge (bridge0) is up with its Thunderbolt ports on every host"
            )
            warnings.append(
                f"{why} in a ring of {len(hosts)} Macs: bridge0 joins every Thunderbolt port, so a "
                f"cabled ring of three or more is a layer-2 loop (a broadcast storm); {FIX}"
            )
    return warnings


def addresses_reset(system: str, interfaces: dict[str, Interface], address: str) -> bool:
    """Whether a Mac that does not hold its ring `address` lost it as Thunderbolt addresses are
    lost (set by `ifconfig`, which a restart undoes, or on a port whose cable moved): a private
    address on none of the subnets it is on now. An address on one of them is rather a changed
    one (DHCP), or a typo."""
    ip = ipaddress.IPv4Address(address)
    nets = [ipaddress.IPv4Network(n) for i in interfaces.values() for n in i.networks]
    return (
        system.startswith("Darwin")
        and ip.is_private
        and not ip.is_loopback
        and not ip.is_link_local
        and not any(ip in n for n in nets if not (n.is_loopback or n.is_link_local))
    )
