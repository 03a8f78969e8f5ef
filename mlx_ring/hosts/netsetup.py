"""A Mac's Thunderbolt network setup that lasts across restarts, as exo's helper makes it: the
bridge service ("Thunderbolt Bridge") off, and one network service per cabled Thunderbolt port with
its static address (`networksetup`, which writes the Mac's saved network settings, where `ifconfig`
lasts until the next restart). Also: reading `networksetup -listnetworkserviceorder`, and running
the commands with sudo, detached from the ssh session that starts them.
"""

import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from mlx_ring.hosts import ssh

NETMASK = "255.255.255.252"  # IPConfigurator.setup's: one /30 per cable
# our services are named "mlx-ring Thunderbolt 1" (exo's: "EXO Thunderbolt 1")
SERVICE_PREFIX = "mlx-ring "
# where the detached change writes; read back over a new ssh session
LOG = "/tmp/mlx-ring-thunderbolt.log"
DONE = "mlx-ring-thunderbolt-done"


@dataclass(frozen=True)
class Service:
    name: str
    port: str  # its hardware port ("Thunderbolt 1", "Thunderbolt Bridge")
    device: str  # en2, bridge0 ("" for a VPN's)
    enabled: bool


def parse_service_order(text: str) -> list[Service]:
    """`networksetup -listnetworkserviceorder`: each service's name, hardware port,
    device and whether it is enabled ("(*) Name", also printed "(3) *Name" by some
    macOS versions, is disabled)."""
    out, current = [], None
    for line in map(str.strip, text.splitlines()):
        if line.startswith("(Hardware Port: ") and current:
            port, _, device = (
                line.removeprefix("(Hardware Port: ").removesuffix(")").rpartition(", Device: ")
            )
            out.append(Service(current[0], port, device.strip(), current[1]))
            current = None
        elif m := re.match(r"^\((\d+|\*)\)\s*(\(\*\)\s*|\*)?(.+)$", line):
            current = (m[3].strip(), m[1] != "*" and not m[2])
    return out


def setup_commands(
    ports: dict[str, str], services: list[Service], bridge0: bool, addresses: list[tuple[str, str]]
) -> list[str]:
    """The commands (to run as root) that give each (interface, address) of `addresses` its own
    network service with that static address, and turn every bridge service over Thunderbolt
    ports off. `ports`: hardware port -> device (`networksetup -listallhardwareports`);
    `bridge0`: whether it exists now."""
    port_of = {device: port for port, device in ports.items()}
    bridges = [
        s.name
        for s in services
        if s.enabled and (s.port == "Thunderbolt Bridge" or s.device.startswith("bridge"))
    ]
    if not services and bridge0:  # no service list read: macOS's own name for the bridge's service
        bridges = ["Thunderbolt Bridge"]
    cmds = [f"networksetup -setnetworkserviceenabled {shlex.quote(name)} off" for name in bridges]
    # the service off stops its configuration; down stops its forwarding now, as MLX's setup does
    if bridge0:
        cmds.append("ifconfig bridge0 down")
    for iface, address in addresses:
        port = port_of[iface]
        # A service already on this port (ours from an earlier run, or the user's) is reused: two
        # services on one port would both configure it.
        mine = [s for s in services if s.device == iface]
        name = mine[0].name if mine else SERVICE_PREFIX + port
        if not mine:
            cmds.append(
                f"networksetup -createnetworkservice {shlex.quote(name)} {shlex.quote(port)}"
            )
        cmds.append(f"networksetup -setmanual {shlex.quote(name)} {address} {NETMASK}")
        if mine and not mine[0].enabled:
            cmds.append(f"networksetup -setnetworkserviceenabled {shlex.quote(name)} on")
    return cmds


def detached(cmds: list[str], host: str, interactive: bool) -> str:
    """A sh command that runs `cmds` as root, detached (nohup, in the background) so that
    taking bridge0 down cannot end it with the ssh session that started it; they write LOG,
    ending with DONE and the status of the first that failed. `interactive`: sudo may ask for
    the password on the terminal."""
    body = (
        "st=0\n"
        + "".join(f"{c} || {{ s=$?; [ $st = 0 ] && st=$s; }}\n" for c in cmds)
        + f'echo "{DONE} $st"\n'
    )
    sudo = ["sudo", "-p", f"[sudo] password for %u on {host}: "] if interactive else ["sudo", "-n"]
    inner = f'rm -f {LOG}; PATH=$PATH:/usr/sbin:/sbin nohup sh -c "$1" sh >{LOG} 2>&1 </dev/null &'
    return shlex.join([*sudo, "sh", "-c", inner, "sh", body])


def start(conf: Path, host: str, local: bool, cmds: list[str]) -> str | None:
    """Start `cmds` on `host` as root, detached (remote: over `ssh -t`, so sudo asks in this
    terminal); a sentence if they could not be started."""
    interactive = sys.stdin.isatty()
    command = detached(cmds, "this Mac" if local else host, interactive)
    if local:
        argv = ["sh", "-c", command]
    # -t: a terminal there, for sudo's prompt; without one here, sudo -n (no password to type)
    else:
        argv = [
            "ssh",
            "-F",
            str(conf),
            *(["-t"] if interactive else []),
            host,
            shlex.join(["sh", "-c", command]),
        ]
    try:
        p = subprocess.run(
            argv,
            stdin=None if interactive else subprocess.DEVNULL,
            timeout=300,
            **({} if interactive else {"capture_output": True, "text": True}),
        )
    except subprocess.TimeoutExpired:
        return (
            f"{host}: sudo did not finish within 300 s; run the commands printed for "
            f"{host} there by hand"
        )
    if p.returncode == 255 and not local:
        raise ssh.SshError(ssh.explain(host, p.stderr or ""))
    if p.returncode:
        if not interactive and "password is required" in (p.stderr or ""):
            return (
                f"{host}: sudo needs a password there and this is no terminal to type it in; run "
                "`./launch.sh hosts --over thunderbolt --apply` in a terminal, or the commands "
                f"printed for {host} on that Mac"
            )
        return (
            f"{host}: sudo failed (exit {p.returncode}); run the commands printed for "
            f"{host} there by hand"
        )
    return None


def finished(
    conf: Path, host: str, local: bool, timeout: float = 90, poll: float = 1
) -> str | None:
    """Wait for the detached change on `host` to write DONE; a sentence if it failed or never
    finished. Each look is a new ssh session: the one that started it may have gone with bridge0."""
    t0, text = time.monotonic(), ""
    while time.monotonic() - t0 < timeout:
        try:
            text = ssh.run_on(conf, host, local, f"cat {LOG} 2>/dev/null", timeout=30).stdout
        except ValueError:  # ssh may drop while the Mac's network changes: look again
            text = ""
        done = [line for line in text.splitlines() if line.startswith(DONE)]
        if done:
            status = done[-1].split()[-1]
            if status == "0":
                return None
            said = "; ".join(
                line for line in text.splitlines() if line and not line.startswith(DONE)
            )[-400:]
            return (
                f"{host}: the network change failed (exit {status}: "
                f"{said or 'no message'}; log: {LOG} there)"
            )
        time.sleep(poll)
    return f"{host}: the network change did not finish within {timeout:.0f} s (log: {LOG} there)"
