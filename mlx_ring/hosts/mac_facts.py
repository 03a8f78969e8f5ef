"""What Thunderbolt addressing reads on each Mac (uname, system_profiler, networksetup,
ifconfig) in one script, and its output parsed."""

import json
from dataclasses import dataclass, field

from mlx_ring.hosts import netsetup
from mlx_ring.platform import Interface, parse_ifconfig_interfaces

# What MLX's extract_connectivity reads on each Mac, plus ifconfig for the warnings and
# the check after --apply.
SCRIPT = r"""
PATH=$PATH:/usr/sbin:/sbin
echo "system=$(uname -s)"
if command -v system_profiler >/dev/null 2>&1; then
  echo "--- thunderbolt"; system_profiler SPThunderboltDataType -json
  echo "--- ports"; networksetup -listallhardwareports
  echo "--- services"; networksetup -listnetworkserviceorder
fi
echo "--- ifconfig"; ifconfig 2>/dev/null
"""


@dataclass
class MacFacts:
    host: str  # as ssh names it
    system: str  # uname -s
    thunderbolt: dict | None  # system_profiler SPThunderboltDataType -json, parsed
    ports: str  # networksetup -listallhardwareports
    interfaces: dict[str, Interface]
    # networksetup -listnetworkserviceorder
    services: list[netsetup.Service] = field(default_factory=list)


def parse_facts(host: str, out: str) -> MacFacts:
    """SCRIPT's output from `host`."""
    sections, key = {"": []}, ""
    for line in out.splitlines():
        if line.startswith("--- "):
            key = line[4:].strip()
            sections[key] = []
        else:
            sections[key].append(line)
    head = dict(line.partition("=")[::2] for line in sections[""] if "=" in line)
    tb = "\n".join(sections.get("thunderbolt", [])).strip()
    try:
        profile = json.loads(tb) if tb else None
    except json.JSONDecodeError:
        raise ValueError(
            f"{host}: system_profiler SPThunderboltDataType -json printed no JSON; run it there "
            "by hand to see why"
        ) from None
    return MacFacts(
        host,
        head.get("system", "").strip(),
        profile,
        "\n".join(sections.get("ports", [])),
        parse_ifconfig_interfaces("\n".join(sections.get("ifconfig", []))),
        netsetup.parse_service_order("\n".join(sections.get("services", []))),
    )
