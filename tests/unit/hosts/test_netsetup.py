"""The Thunderbolt setup that lasts across restarts (mlx_ring/hosts/netsetup.py) on recorded
macOS outputs: networksetup's service list read, the commands reusing what an earlier run made,
subnets that overlap no network a Mac is on, and --apply run detached under sudo through the
macOS commands' shims."""

import ipaddress
import sys
from pathlib import Path

import pytest

from mlx_ring.hosts import netsetup
from mlx_ring.hosts import thunderbolt as tb
from tests.stockmac import BASH_32
from tests.unit.hosts.test_thunderbolt import DATA, THREE, entries_for, facts

MACOS = DATA.parent


def test_service_order_is_read_with_disabled_services():
    services = netsetup.parse_service_order((MACOS / "networksetup_service_order.txt").read_text())
    assert [(s.name, s.device, s.enabled) for s in services] == [
        ("Thunderbolt Ethernet", "en1", True),
        ("Wi-Fi", "en0", True),
        ("Bluetooth DUN", "Bluetooth-Modem", True),
        ("USB Ethernet", "en5", False),
        ("Bluetooth PAN", "en2", True),
        ("Thunderbolt Bridge", "bridge0", True),
    ]
    assert services[-1].port == "Thunderbolt Bridge" and services[3].port == "USB-Ethernet"
    # Other spellings of a disabled service seen in the wild; a VPN's service has no device.
    other = (
        "(3) *Thunderbolt Bridge\n(Hardware Port: Thunderbolt Bridge, Device: bridge0)\n"
        "(4) (*) Tailscale\n(Hardware Port: io.tailscale.ipn.macsys, Device: )\n"
    )
    assert netsetup.parse_service_order(other) == [
        netsetup.Service("Thunderbolt Bridge", "Thunderbolt Bridge", "bridge0", False),
        netsetup.Service("Tailscale", "io.tailscale.ipn.macsys", "", False),
    ]


def test_a_second_run_reuses_the_services_and_keeps_the_addresses():
    first = tb.propose(entries_for(THREE), [facts(n, s) for n, s in THREE.items()])
    done = {
        n: facts(
            n,
            s,
            "ifconfig-applied",
            services="services-applied" if n == "mini-b.local" else "services",
        )
        for n, s in THREE.items()
    }
    again = tb.propose(entries_for(THREE), list(done.values()))
    # Its own /30s on the Thunderbolt ports do not push the ring to another range.
    assert again.entries == first.entries and again.addresses == first.addresses
    # mini-b's bridge service is off already, and its ports have their services: only
    # the addresses are set.
    assert again.commands["mini-b.local"] == [
        "ifconfig bridge0 down",
        "networksetup -setmanual 'mlx-ring Thunderbolt 2' 192.168.0.2 255.255.255.252",
        "networksetup -setmanual 'mlx-ring Thunderbolt 1' 192.168.0.9 255.255.255.252",
    ]


def test_without_a_service_list_the_bridge_service_is_still_turned_off():
    ports = {
        "Ethernet": "en0",
        "Wi-Fi": "en1",
        "Thunderbolt Bridge": "bridge0",
        "Thunderbolt 1": "en2",
    }
    assert netsetup.setup_commands(ports, [], True, [("en2", "192.168.0.1")]) == [
        "networksetup -setnetworkserviceenabled 'Thunderbolt Bridge' off",
        "ifconfig bridge0 down",
        "networksetup -createnetworkservice 'mlx-ring Thunderbolt 1' 'Thunderbolt 1'",
        "networksetup -setmanual 'mlx-ring Thunderbolt 1' 192.168.0.1 255.255.255.252",
    ]


def test_a_home_network_on_192_168_0_0_keeps_its_router():
    def home(text):
        return text.replace(
            "inet 192.168.1.40 netmask 0xffffff00 broadcast 192.168.1.255",
            "inet 192.168.0.40 netmask 0xffffff00 broadcast 192.168.0.255",
        )

    macs = [facts(n, s, edit=home if n == "127.0.0.1" else lambda t: t) for n, s in THREE.items()]
    p = tb.propose(entries_for(THREE), macs)
    # 192.168.0.0/24 (mini-a's LAN, the router at .1) and 192.168.1.0/24 (the others') are taken.
    assert [e["ips"] for e in p.entries] == [["192.168.2.5"], ["192.168.2.2"], ["192.168.2.10"]]
    cables = {
        ipaddress.ip_interface(f"{a}/30").network
        for pairs in p.addresses.values()
        for _, a in pairs
    }
    assert len(cables) == 3 and not any(
        c.overlaps(t) for c in cables for t in tb.taken_networks(macs)
    )


def test_no_free_private_range_is_said():
    everything = [ipaddress.IPv4Network("192.168.0.0/16"), ipaddress.IPv4Network("172.16.0.0/12")]
    with pytest.raises(
        ValueError,
        match=r"overlaps a network one of the Macs is on; set the cables' addresses by hand",
    ):
        tb.subnet_base(3, everything)
    assert tb.subnet_base(3, everything[:1]) == ipaddress.IPv4Address("172.16.0.0")


SUDO = (
    'while [ $# -gt 0 ]; do case $1 in -n) shift;; -p) shift 2;; *) break;; esac; done\nexec "$@"'
)


def shims(tmp_path: Path, sudo: str = SUDO) -> Path:
    """macOS's commands as shell scripts: ssh runs its command here (as that host), networksetup and
    ifconfig answer from each host's recordings and log every change to `calls`."""
    stems = {"": THREE["127.0.0.1"], **{h: s for h, s in THREE.items() if h != "127.0.0.1"}}

    def pick(suffix):
        return (
            "case ${FAKE_HOST:-} in "
            + " ".join(
                f"{h or '*'}) cat '{DATA / s}.{suffix}';;"
                for h, s in sorted(stems.items(), key=lambda kv: not kv[0])
            )
            + " esac"
        )

    calls = tmp_path / "calls"
    bodies = {
        # ssh [-F conf] [-t] HOST COMMAND: the command as sshd runs it, in a shell, on that host.
        "ssh": f'log() {{ line=$(echo "$*" | tr "\\n" " "); echo "$line" >> {calls}; }}\nlog ssh '
        '"$@"\nwhile [ $# -gt 1 ]; do case $1 in -F|-o) shift 2;; '
        "-t|-T) shift;; *) break;; esac; done\nFAKE_HOST=$1; export FAKE_HOST; "
        'shift; exec sh -c "$*"',
        "sudo": f'echo "sudo ${{FAKE_HOST:-here}} $1 $2" >> {calls}\n' + sudo,
        "networksetup": f"case $1 in -listallhardwareports) {pick('networksetup.txt')};; "
        f"-listnetworkserviceorder) {pick('services.txt')};; "
        f'*) echo "networksetup ${{FAKE_HOST:-here}} $*" >> {calls};; esac',
        "ifconfig": f'if [ $# -gt 0 ]; then echo "ifconfig ${{FAKE_HOST:-here}} $*" >> {calls}; '
        f"elif [ -f {tmp_path}/applied ]; then {pick('ifconfig-applied.txt')}; else "
        f"{pick('ifconfig.txt')}; fi",
        "uname": "echo Darwin",
        "system_profiler": pick("system_profiler.json"),
    }
    for name, body in bodies.items():
        (tmp_path / name).write_text(f"#!/bin/sh\n{body}\n")
        (tmp_path / name).chmod(0o755)
    return calls


def fake_macs(tmp_path, monkeypatch, sudo: str = SUDO):
    """Three Macs behind the shims, and the proposal for them; ifconfig then
    shows the addresses set."""
    shims(tmp_path, sudo)
    # macOS's sh, which runs the launcher and the change there: bash 3.2 in POSIX mode
    if BASH_32.exists():
        (tmp_path / "sh").symlink_to(BASH_32)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setattr(netsetup, "LOG", str(tmp_path / "change.log"))
    monkeypatch.setattr(tb, "this_machine", lambda name, address, *a, **k: name == "127.0.0.1")
    entries = entries_for(THREE)
    p = tb.propose(entries, tb.gather(tmp_path / "ssh_config", entries))
    (tmp_path / "applied").touch()  # from now on ifconfig shows the addresses set
    return p


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "no-terminal"])
def test_apply_runs_each_macs_commands_under_sudo_detached(tmp_path, monkeypatch, terminal):
    p = fake_macs(tmp_path, monkeypatch)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: terminal)
    assert tb.apply(tmp_path / "ssh_config", p) == []
    calls = (tmp_path / "calls").read_text().splitlines()
    # The other Macs first, over `ssh -t` where there is a terminal for sudo's
    # prompt; this Mac last.
    started = [c.rstrip() for c in calls if c.startswith("sudo ")]

    def prompt(h):
        return f"-p [sudo] password for %u on {h}:" if terminal else "-n sh"

    assert started == [
        f"sudo mini-b.local {prompt('mini-b.local')}",
        f"sudo mini-c.local {prompt('mini-c.local')}",
        f"sudo here {prompt('this Mac')}",
    ]
    assert all((" -t " in c) == terminal for c in calls if c.startswith("ssh ") and "sudo" in c)
    made = [c.split(" ", 2)[1:] for c in calls if c.startswith(("networksetup ", "ifconfig "))]
    # shlex'd
    assert [
        "mini-b.local",
        "-setmanual 'mlx-ring Thunderbolt 1' 192.168.0.9 255.255.255.252",
    ] not in made
    assert ["mini-b.local", "-setmanual mlx-ring Thunderbolt 1 192.168.0.9 255.255.255.252"] in made
    assert made[:4] == [
        ["mini-b.local", "-setnetworkserviceenabled Thunderbolt Bridge off"],
        ["mini-b.local", "bridge0 down"],
        ["mini-b.local", "-createnetworkservice mlx-ring Thunderbolt 2 Thunderbolt 2"],
        ["mini-b.local", "-setmanual mlx-ring Thunderbolt 2 192.168.0.2 255.255.255.252"],
    ]
    assert made[-1] == ["here", "-setmanual mlx-ring Thunderbolt 2 192.168.0.5 255.255.255.252"]


def test_apply_names_the_mac_where_sudo_wants_a_password_and_the_one_where_a_command_failed(
    tmp_path, monkeypatch
):
    sudo = (
        '[ "$1" = -n ] && [ "${FAKE_HOST:-}" = mini-b.local ] && { echo "sudo: a password is '
        'required" >&2; exit 1; }\n'
    ) + SUDO
    p = fake_macs(tmp_path, monkeypatch, sudo)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    p.commands["mini-c.local"].insert(1, "networksetup-missing -x")  # a command that fails there
    b, c = tb.apply(tmp_path / "ssh_config", p)
    assert b.startswith(
        "mini-b.local: sudo needs a password there and this is no terminal to type it in; run "
        "`./launch.sh hosts --over thunderbolt --apply` in a terminal"
    )
    assert (
        c.startswith("mini-c.local: the network change failed (exit 127: ")
        and "networksetup-missing" in c
    )
    # The rest of mini-c's commands still ran: one failing does not leave the Mac half set up.
    assert (
        "networksetup mini-c.local -setmanual mlx-ring Thunderbolt 2 192.168.0.10 255.255.255.252"
        in (tmp_path / "calls").read_text()
    )
