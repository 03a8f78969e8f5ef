"""What the launcher needs to know about a host before it starts a rank there, read by one small
POSIX sh script (run over ssh, or here for this machine's own ranks): name, OS, addresses,
memory, the macOS firewall and power settings, its RDMA devices, whether the checkout and its
environment exist, their versions, and which weight pieces it holds. The script prints the
system's own commands' output raw; mlx_ring.platform parses it."""

from dataclasses import dataclass, field
from pathlib import Path

from mlx_ring import macos_settings, platform
from mlx_ring.hosts import ssh

# $1 project path, $2 cache folder (empty: the default under that host's home); stdin: the project's
# tracked files, one per line (hashed there).
SCRIPT = r"""
root=$1; cache=${2:-$HOME/.cache/mlx-ring}
PATH=$PATH:/usr/sbin:/sbin  # ip, ifconfig and sysctl live there; a non-interactive ssh PATH may lack them
echo "hostname=$(hostname)"
echo "system=$(uname -s) $(uname -m)"
# Raw outputs in NAME<< ... >> sections, parsed in Python by mlx_ring.platform.
if [ "$(uname -s)" = Darwin ]; then
  echo "memsize<<"; sysctl -n hw.memsize 2>/dev/null; echo ">>"
  echo "vm_stat<<"; vm_stat 2>/dev/null; echo ">>"
  echo "ifconfig<<"; ifconfig 2>/dev/null; echo ">>"
  echo "pmset<<"; pmset -g 2>/dev/null; echo ">>"
  echo "sw_vers<<"; sw_vers -productVersion 2>/dev/null; echo ">>"
  # RDMA over Thunderbolt (macOS 26.2+): its devices, and whether each port is up (JACCL).
  echo "ibv_devices<<"; ibv_devices 2>/dev/null; echo ">>"
  echo "ibv_devinfo<<"; ibv_devinfo 2>/dev/null; echo ">>"
  fw=/usr/libexec/ApplicationFirewall/socketfilterfw
  if [ -x "$fw" ]; then
    echo "firewall<<"; "$fw" --getglobalstate 2>/dev/null; echo ">>"
    echo "blockall<<"; "$fw" --getblockall 2>/dev/null; echo ">>"
    echo "stealth<<"; "$fw" --getstealthmode 2>/dev/null; echo ">>"
  fi
else
  if [ -r /proc/meminfo ]; then echo "meminfo<<"; cat /proc/meminfo; echo ">>"; fi
  if command -v ip >/dev/null 2>&1; then
    echo "ip_addr<<"; ip -o -4 addr show 2>/dev/null; echo ">>"
  else
    echo "ifconfig<<"; ifconfig 2>/dev/null; echo ">>"
  fi
fi
u=$(command -v uv 2>/dev/null || { [ -x "$HOME/.local/bin/uv" ] && echo "$HOME/.local/bin/uv"; })
echo "uv=$u"
[ -f /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 ] || [ -f /usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3 ] && echo "openblas=yes"
if [ -f "$root/launch.sh" ]; then
  echo "checkout=yes"
  if [ -x "$root/.venv/bin/python" ]; then
    # The real binary behind the environment's python: what a Mac's firewall must be told to allow.
    info=$("$root/.venv/bin/python" -c 'import importlib.metadata as m, os, sys
print("python=" + os.path.realpath(sys.executable)); print("versions=%s %s" % (m.version("mlx"), m.version("mlx-lm")))' 2>/dev/null)
    echo "$info"
    py=$(echo "$info" | sed -n 's/^python=//p')
    if [ -n "$py" ] && [ -x "${fw:-}" ]; then echo "appblocked<<"; "$fw" --getappblocked "$py" 2>/dev/null; echo ">>"; fi
  fi
  echo "sums<<"
  cd "$root" && tr '\n' '\0' | xargs -0 sh -c 'for f; do [ -f "$f" ] && echo "$f"; done' sh | tr '\n' '\0' | xargs -0 sh -c '(sha256sum "$@" 2>/dev/null || shasum -a 256 "$@")' sh
  echo ">>"
fi
echo "blobs=$(ls "$cache/blobs" 2>/dev/null | tr '\n' ' ')"
for m in "$cache"/hosted/*/ring-manifest.json; do
  [ -f "$m" ] && echo "hosted=$(basename "$(dirname "$m")") $( (sha256sum "$m" 2>/dev/null || shasum -a 256 "$m") | cut -d' ' -f1)"
done
"""


@dataclass
class Facts:
    host: str  # as ssh names it
    hostname: str = ""
    system: str = ""
    memory_gb: float = 0.0
    free_gb: float = 0.0
    addresses: tuple[str, ...] = ()  # every IPv4 address it holds, sorted
    # interface name -> platform.Interface (IPv4 addresses, UP, members)
    interfaces: dict = field(default_factory=dict)
    # macOS Application Firewall on; None: no such firewall, or unknown
    firewall: bool | None = None
    # its settings, as far as it said
    fw: macos_settings.Firewall = field(default_factory=macos_settings.Firewall)
    power: dict = field(default_factory=dict)  # macOS `pmset -g` settings by name; empty elsewhere
    macos: tuple = ()  # macOS's version, (26, 2); () elsewhere
    # macOS: RDMA device -> its port's state (ibv_devices, ibv_devinfo)
    rdma: dict = field(default_factory=dict)
    uv: str = ""
    openblas: bool = False
    checkout: bool = False
    versions: str = ""  # "mlx mlx-lm", empty without an environment
    python: str = ""  # the environment's Python binary, symlinks resolved
    sums: dict = field(default_factory=dict)  # tracked file -> sha256 there
    blobs: set = field(default_factory=set)  # weight pieces it holds, by file name
    # model id -> sha256 of the manifest of the slice it holds
    hosted: dict = field(default_factory=dict)


def sections(out: str) -> tuple[list[str], dict[str, str]]:
    """The script's KEY=value lines, and its NAME<< ... >> sections by name."""
    plain, raw, lines = [], {}, iter(out.splitlines())
    for line in lines:
        if line.endswith("<<") and "=" not in line:
            body = []
            for s in lines:
                if s == ">>":
                    break
                body.append(s)
            raw[line[:-2]] = "\n".join(body) + "\n"
        else:
            plain.append(line)
    return plain, raw


def parse(host: str, out: str) -> Facts:
    f = Facts(host)
    plain, raw = sections(out)
    for line in raw.get("sums", "").splitlines():
        digest, _, name = line.partition("  ")
        f.sums[name.strip()] = digest
    try:
        if "meminfo" in raw:
            total, free = platform.parse_meminfo(raw["meminfo"])
        elif "memsize" in raw and "vm_stat" in raw:
            total, free = platform.parse_macos_memory(raw["memsize"], raw["vm_stat"])
        else:
            total = free = 0
        f.memory_gb, f.free_gb = total / 2**30, free / 2**30
    except (ValueError, IndexError):
        pass  # left at 0: the table shows it, and planning measures memory on the rank itself
    if "ip_addr" in raw:
        for name, address in platform.parse_ip_addr(raw["ip_addr"]):
            f.interfaces.setdefault(name, platform.Interface(name, True)).addresses.append(address)
    else:
        f.interfaces = platform.parse_ifconfig_interfaces(raw.get("ifconfig", ""))
    f.addresses = tuple(sorted({a for i in f.interfaces.values() for a in i.addresses}))
    f.firewall = macos_settings.parse_firewall(raw["firewall"]) if "firewall" in raw else None
    switch = {
        k: macos_settings.parse_switch(raw[k]) if k in raw else None
        for k in ("blockall", "stealth")
    }
    f.fw = macos_settings.Firewall(
        f.firewall,
        switch["blockall"],
        switch["stealth"],
        macos_settings.parse_app_allowed(raw["appblocked"]) if "appblocked" in raw else None,
    )
    f.power = macos_settings.parse_pmset(raw.get("pmset", ""))
    f.macos = macos_settings.parse_macos_version(raw.get("sw_vers", ""))
    f.rdma = macos_settings.rdma_devices(raw.get("ibv_devices", ""), raw.get("ibv_devinfo", ""))
    for line in plain:
        key, _, value = line.partition("=")
        if key == "hosted" and len(value.split()) == 2:
            f.hosted[value.split()[0]] = value.split()[1]
        elif key == "blobs":
            f.blobs = set(value.split())
        elif key in ("hostname", "system", "uv", "versions", "python"):
            setattr(f, key, value.strip())
        elif key in ("openblas", "checkout"):
            setattr(f, key, value == "yes")
    return f


def read_facts(
    conf: Path, host: str, local: bool, root: Path, cache_dir: str, files: list[str]
) -> Facts:
    """The facts of `host` (this machine when `local`); ssh.SshError if it cannot be reached."""
    p = ssh.run_on(
        conf, host, local, SCRIPT, (root, cache_dir), input="\n".join(files) + "\n", timeout=60
    )
    return parse(host, p.stdout)
