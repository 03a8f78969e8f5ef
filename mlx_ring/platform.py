"""The Linux/macOS differences the runtime and the host checks need: pure parsers over each
command's output (tested on recorded macOS outputs, tests/data/macos/), and thin readers that run
the command, or read the file, on this machine.

Memory, addresses per interface, a boot id, the ephemeral port range, resident memory, keeping a
Mac awake and Local Network privacy. Two siblings hold the rest: platform_disk.py the prompt cache's
disk (its folder, backups, open files), macos_settings.py a Mac's firewall and power settings.
"""

import ctypes
import ctypes.util
import ipaddress
import os
import platform
import re
import resource
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

MACOS = sys.platform == "darwin"
LINUX = sys.platform.startswith("linux")

# --- memory: (total, available) bytes ---------------------------------------------------------


def parse_meminfo(text: str) -> tuple[int, int]:
    """(total, available) bytes from /proc/meminfo (MemFree where a kernel lacks MemAvailable)."""
    info = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if rest.split():
            info[key.strip()] = int(rest.split()[0]) * 1024
    if "MemTotal" not in info:
        raise ValueError("no MemTotal in /proc/meminfo's text")
    return info["MemTotal"], info.get("MemAvailable", info.get("MemFree", 0))


def parse_vm_stat(text: str) -> tuple[int, dict[str, int]]:
    """(page size, {"free": pages, "inactive": pages, ...}) from macOS's `vm_stat`."""
    m = re.search(r"page size of (\d+) bytes", text)
    if not m:
        raise ValueError("no page size in vm_stat's header")
    pages = {
        k.strip().lower(): int(v)
        for k, v in re.findall(r"^Pages ([^:]+):\s+(\d+)\.?\s*$", text, re.MULTILINE)
    }
    return int(m.group(1)), pages


def parse_macos_memory(memsize: str, vm_stat: str) -> tuple[int, int]:
    """(total, available) bytes from `sysctl -n hw.memsize` and `vm_stat`: available counts free,
    inactive, speculative and purgeable pages (what the system hands back on demand)."""
    page, pages = parse_vm_stat(vm_stat)
    free = sum(pages.get(k, 0) for k in ("free", "inactive", "speculative", "purgeable"))
    return int(memsize.split()[0]), free * page


def memory() -> tuple[int, int]:
    """(total, available) bytes of this machine."""
    if Path("/proc/meminfo").exists():
        return parse_meminfo(Path("/proc/meminfo").read_text())
    if MACOS:
        return parse_macos_memory(_run(["sysctl", "-n", "hw.memsize"]), _run(["vm_stat"]))
    raise ValueError(
        "cannot read this machine's memory (neither /proc/meminfo nor macOS sysctl); "
        "declare memory_gb for it in hosts.json or MLX_RING_CAPS"
    )


# --- IPv4 addresses per interface -------------------------------------------------------------


def parse_ip_addr(text: str) -> list[tuple[str, str]]:
    """(interface, address) pairs from Linux's `ip -o -4 addr show`."""
    pairs = []
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 4 and f[2] == "inet":
            pairs.append((f[1].split("@")[0], f[3].split("/")[0]))
    return pairs


@dataclass
class Interface:
    name: str
    up: bool = False  # UP among its flags (bridge0 after `ifconfig bridge0 down` is not)
    addresses: list[str] = field(default_factory=list)  # IPv4
    # a bridge's member ports (macOS bridge0: Thunderbolt)
    members: list[str] = field(default_factory=list)
    # each address's subnet, "192.168.1.0/24" (/32 without a mask)
    networks: list[str] = field(default_factory=list)


def parse_ifconfig_interfaces(text: str) -> dict[str, Interface]:
    """`ifconfig` by interface (macOS and BSD, `-v` too; net-tools' `inet addr:` too): UP flag, IPv4
    addresses and their subnets, bridge members."""
    out, cur = {}, None
    for line in text.splitlines():
        # an interface's first line: "en0: flags=8863<UP,...>" or "eth0  Link encap"
        if line and not line[0].isspace():
            name = line.split()[0].rstrip(":")
            flags = (
                line.partition("<")[2].partition(">")[0].split(",") if ": flags=" in line else []
            )
            cur = out[name] = Interface(name, "UP" in flags)
            continue
        f = line.split()
        if cur and len(f) >= 2 and f[0] == "inet":
            address = f[1].removeprefix("addr:")
            cur.addresses.append(address)
            cur.networks.append(str(ipaddress.ip_interface(f"{address}/{_netmask(f)}").network))
        elif cur and len(f) >= 2 and f[0] == "member:":
            cur.members.append(f[1])
    return out


def _netmask(fields: list[str]) -> str:
    """An `inet` line's mask as ipaddress takes it: macOS prints `netmask 0xffffff00`, Linux's
    ifconfig `netmask 255.255.255.0` or `Mask:255.255.255.0`; 32 where there is none."""
    for i, f in enumerate(fields):
        if f == "netmask" and i + 1 < len(fields):
            mask = fields[i + 1]
            return str(ipaddress.IPv4Address(int(mask, 16))) if mask.startswith("0x") else mask
        if f.startswith("Mask:"):
            return f[5:]
    return "32"


def parse_ifconfig(text: str) -> list[tuple[str, str]]:
    """(interface, address) pairs from `ifconfig`."""
    return [(i.name, a) for i in parse_ifconfig_interfaces(text).values() for a in i.addresses]


def interface_addresses() -> list[tuple[str, str]]:
    """This machine's (interface, IPv4 address) pairs."""
    if LINUX:
        try:
            return parse_ip_addr(_run(["ip", "-o", "-4", "addr", "show"]))
        except (OSError, subprocess.CalledProcessError):
            pass  # no iproute2 (a minimal container): ifconfig below, if any
    return parse_ifconfig(_run(["ifconfig"]))


def link_local(address: str) -> bool:
    """Whether `address` is self-assigned (169.254/16): what cabled Macs get
    without a DHCP server."""
    return address.startswith("169.254.")


# --- boot id: one per running kernel --------------------------------------------------------

UUID = re.compile(r"^[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")


def parse_boot_id(text: str) -> str:
    """The boot id in lower case, from Linux's boot_id file or `sysctl -n kern.bootsessionuuid`."""
    value = text.strip()
    if not UUID.match(value):
        raise ValueError(f"not a boot id: {value[:60]!r}")
    return value.lower()


def boot_id() -> str | None:
    """This machine's boot id (shared by its containers and network
    namespaces), None where unknown."""
    try:
        if LINUX:
            return parse_boot_id(Path("/proc/sys/kernel/random/boot_id").read_text())
        if MACOS:
            return parse_boot_id(_run(["sysctl", "-n", "kern.bootsessionuuid"]))
    except (OSError, ValueError, subprocess.CalledProcessError):
        pass
    return None


def usable_cores() -> frozenset[int] | None:
    """The cores this process may run on, where the system restricts it to some (Linux's
    affinity, as `taskset` sets it); None where it may use every core (and always on
    macOS, which has none)."""
    get = getattr(os, "sched_getaffinity", None)
    if get is None:
        return None
    cores = frozenset(get(0))
    return cores if len(cores) < (os.cpu_count() or len(cores)) else None


# --- ephemeral ports --------------------------------------------------------------------------

DEFAULT_EPHEMERAL = (49152, 65535)  # IANA's dynamic ports: macOS's default


def parse_port_range(text: str) -> tuple[int, int]:
    """(first, last) from Linux's ip_local_port_range or macOS's two portrange sysctls."""
    f = text.split()
    if len(f) != 2 or not all(x.isdigit() for x in f):
        raise ValueError(f"not a port range: {text.strip()[:60]!r}")
    return int(f[0]), int(f[1])


def ephemeral_ports() -> tuple[int, int]:
    """The ports the kernel hands to outgoing connections on this machine."""
    try:
        if LINUX:
            return parse_port_range(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text())
        if MACOS:
            return parse_port_range(
                _run(["sysctl", "-n", "net.inet.ip.portrange.first", "net.inet.ip.portrange.last"])
            )
    except (OSError, ValueError, subprocess.CalledProcessError):
        pass
    return DEFAULT_EPHEMERAL


def in_ephemeral(port: int, ephemeral: tuple[int, int]) -> bool:
    """Whether the kernel may hand `port` to an outgoing connection (`ephemeral`:
    ephemeral_ports()). Only such a ring port needs holding until MLX listens on it: macOS's
    range starts at 49152, far above the ring's 32323+; Linux's at 32768 by default, and wherever
    a machine's sysctl puts it."""
    return ephemeral[0] <= port <= ephemeral[1]


def port_holders(port: int, system: str | None = None) -> str:
    """The command that shows what listens on TCP `port`: macOS has no `ss`. `system`:
    platform.system(), this machine's unless given."""
    if (system or platform.system()) == "Darwin":
        return f"lsof -nP -iTCP:{port} -sTCP:LISTEN"
    return f"ss -tanp | grep {port}"


# --- resident memory --------------------------------------------------------------------------

MACH_TASK_BASIC_INFO = 20  # <mach/task_info.h>


class MachTaskBasicInfo(ctypes.Structure):
    """struct mach_task_basic_info of <mach/task_info.h> (declared under #pragma pack(4))."""

    _pack_ = 4
    _fields_ = [
        ("virtual_size", ctypes.c_uint64),
        ("resident_size", ctypes.c_uint64),
        ("resident_size_max", ctypes.c_uint64),
        ("user_time", ctypes.c_int32 * 2),
        ("system_time", ctypes.c_int32 * 2),
        ("policy", ctypes.c_int32),
        ("suspend_count", ctypes.c_int32),
    ]


# in natural_t units, as the header defines it
MACH_TASK_BASIC_INFO_COUNT = ctypes.sizeof(MachTaskBasicInfo) // 4


def parse_statm(text: str, page_size: int) -> int:
    """Resident bytes from /proc/<pid>/statm (its second field, in pages)."""
    return int(text.split()[1]) * page_size


def maxrss_bytes(ru_maxrss: int, system: str) -> int:
    """getrusage's ru_maxrss in bytes: Linux counts KiB, macOS bytes."""
    return ru_maxrss if system == "Darwin" else ru_maxrss * 1024


def _mach_resident() -> int:
    # What psutil does (task_info(mach_task_self(), MACH_TASK_BASIC_INFO, ...)), through ctypes.
    lib = ctypes.CDLL(ctypes.util.find_library("System") or "/usr/lib/libSystem.B.dylib")
    # mach_task_self() is a macro reading this
    task = ctypes.c_uint.in_dll(lib, "mach_task_self_").value
    info, count = MachTaskBasicInfo(), ctypes.c_uint(MACH_TASK_BASIC_INFO_COUNT)
    kr = lib.task_info(task, MACH_TASK_BASIC_INFO, ctypes.byref(info), ctypes.byref(count))
    if kr != 0:
        raise OSError(f"task_info failed: kern_return {kr}")
    return info.resident_size


def resident_bytes() -> int:
    """Memory this process holds resident now (Linux /proc/self/statm, macOS Mach task info)."""
    if MACOS:
        return _mach_resident()
    return parse_statm(Path("/proc/self/statm").read_text(), resource.getpagesize())


def peak_resident_bytes() -> int:
    """The most memory this process has held resident (ru_maxrss, in bytes on every system)."""
    return maxrss_bytes(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, platform.system())


# --- TCP keepalive -----------------------------------------------------------------------------


# <netinet/tcp.h>'s idle, interval and count options: macOS names the idle one TCP_KEEPALIVE
# (Linux: TCP_KEEPIDLE), and Python defines only the names of the system it runs on
KEEPALIVE_OPTIONS = {"Darwin": (0x10, 0x101, 0x102), "Linux": (4, 5, 6)}


def keepalive_options(idle: float, system: str | None = None) -> list[tuple[int, int]]:
    """(option, value) at IPPROTO_TCP that probe a connection idle for `idle` seconds, three
    times a second apart; none on a system not listed (its defaults: macOS's idle is 2 h)."""
    names = KEEPALIVE_OPTIONS.get(system or platform.system())
    return list(zip(names, (max(1, int(idle)), 1, 3))) if names else []


def keep_alive(sock: socket.socket, idle: float) -> None:
    """TCP keepalive on `sock` after `idle` seconds. An accepted socket does not inherit it:
    set it on each."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in keepalive_options(idle):
        sock.setsockopt(socket.IPPROTO_TCP, option, value)


# --- keeping a Mac awake, Local Network privacy ----------------------------------------------


def keep_awake(pid: int) -> subprocess.Popen | None:
    """On macOS, hold an idle-sleep power assertion until process `pid` exits (`caffeinate -i -w`),
    so a host on default settings does not sleep under the ring; nothing elsewhere."""
    if not MACOS:
        return None
    try:
        return subprocess.Popen(
            ["caffeinate", "-i", "-w", str(pid)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except OSError:
        return None


def local_network_hint(system: str | None = None, mac_version: str | None = None) -> str | None:
    """What to check when this Mac gets "No route to host" from a machine on its network:
    macOS 15's Local Network privacy can deny a terminal app's programs the local network.
    None elsewhere. `system` and `mac_version` (platform.system(), platform.mac_ver()[0])
    default to this machine's."""
    system = system or platform.system()
    version = mac_version if mac_version is not None else platform.mac_ver()[0]
    if system != "Darwin" or not version or int(version.split(".")[0]) < 15:
        return None
    return (
        "macOS's Local Network privacy may be denying the terminal app on this Mac: allow it in "
        "System Settings > Privacy & Security > Local Network"
    )


def ranks_local_network_hint() -> str:
    """What to check when a rank on a Mac finds no route to a machine on its network: macOS 15's
    Local Network privacy. Programs started from Terminal or over ssh are exempt (Apple's
    TN3179); those of another terminal app are not, and reports say the exemption can lapse for
    programs that outlive Terminal (the ring runs on after its Terminal quits)."""
    return (
        "macOS's Local Network privacy (macOS 15 and later) may be denying the rank: start the "
        "ring from Terminal and keep Terminal running while it serves (`./launch.sh restart` there "
        "after Terminal quit), or allow the terminal app you use in System Settings > Privacy & "
        "Security > Local Network"
    )


# connect(2)'s errno values, which MLX's ring prints as numbers. The numbers differ between the two
# systems, so each also tells on which system the rank that failed runs.
CONNECT_ERRORS = {
    61: ("Darwin", "connection refused"),
    111: ("Linux", "connection refused"),
    65: ("Darwin", "no route to host"),
    113: ("Linux", "no route to host"),
    60: ("Darwin", "timed out"),
    110: ("Linux", "timed out"),
    51: ("Darwin", "network is unreachable"),
    101: ("Linux", "network is unreachable"),
    64: ("Darwin", "host is down"),
    112: ("Linux", "host is down"),
}


def connect_error(number: int) -> tuple[str | None, str]:
    """(system, meaning) of connect(2)'s errno `number` as macOS or Linux numbers it; (None,
    "errno N") for one neither names here."""
    return CONNECT_ERRORS.get(number, (None, f"errno {number}"))


def _run(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=10).stdout
