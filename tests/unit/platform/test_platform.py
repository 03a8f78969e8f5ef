"""mlx_ring.platform: each parser on recorded macOS outputs (tests/data/macos/README.md names their
sources) and on this Linux machine's own files, and the host facts script under dash and bash 3.2,
on this machine and with macOS's commands replaying the recordings; and the link probe, which runs
the host's environment Python and knows a busy port by errno.EADDRINUSE."""

import ctypes
import mmap
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mlx_ring import macos_settings, platform
from mlx_ring.hosts import ssh
from mlx_ring.hosts.facts import SCRIPT, parse
from mlx_ring.hosts.link import measure_pair
from mlx_ring.ring.launch import free_port

MAC = Path(__file__).resolve().parents[2] / "data" / "macos"
LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")
SHELLS = [s for s in ("dash", "/work/shared/mac/bash-3.2") if shutil.which(s) or Path(s).exists()]


def rec(name: str) -> str:
    return (MAC / name).read_text()


@pytest.mark.parametrize(
    "vm_stat, page, available_pages",
    [
        ("vm_stat_apple_silicon.txt", 16384, 3857 + 443760 + 1075 + 17340),
        ("vm_stat_intel.txt", 4096, 6127229 + 628646 + 430715 + 11820),
    ],
)
def test_macos_memory_counts_free_inactive_speculative_and_purgeable_pages(
    vm_stat, page, available_pages
):
    assert platform.parse_vm_stat(rec(vm_stat))[0] == page
    assert platform.parse_macos_memory(rec("hw_memsize_16gb.txt"), rec(vm_stat)) == (
        16 * 2**30,
        available_pages * page,
    )


def test_memory_text_without_its_numbers_is_refused():
    with pytest.raises(ValueError, match="page size"):
        platform.parse_vm_stat("Pages free: 12.\n")
    with pytest.raises(ValueError, match="MemTotal"):
        platform.parse_meminfo("MemFree: 10 kB\n")
    # before MemAvailable
    assert platform.parse_meminfo("MemTotal: 2048 kB\nMemFree: 1024 kB\n") == (2 << 20, 1 << 20)


@LINUX
def test_meminfo_of_this_machine_agrees_with_the_kernel_page_count():
    total, available = platform.parse_meminfo(Path("/proc/meminfo").read_text())
    assert total == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 0 < available <= total and platform.memory()[0] == total


@pytest.mark.parametrize(
    "ifconfig, pairs",
    [
        # Thunderbolt Bridge over en2, en3, en4
        ("ifconfig_mac_mini_bridge0.txt", [("bridge0", "10.25.0.1")]),
        # Thunderbolt ports en1..en4, no address yet
        ("ifconfig_apple_silicon_ports.txt", [("lo0", "127.0.0.1")]),
        # `ifconfig -v`
        ("ifconfig_v_link_local.txt", [("lo0", "127.0.0.1"), ("en1", "169.254.243.94")]),
        (
            "ifconfig_lo0_alias.txt",
            [("lo0", "127.0.0.1"), ("lo0", "10.254.254.254"), ("en0", "172.16.42.20")],
        ),
    ],
)
def test_ifconfig_gives_each_interface_its_ipv4_addresses(ifconfig, pairs):
    assert platform.parse_ifconfig(rec(ifconfig)) == pairs


def test_ifconfig_gives_each_address_its_subnet():
    # macOS prints the mask in hex (`netmask 0xffffff00`): what the Thunderbolt subnets must not
    # overlap.
    ifs = platform.parse_ifconfig_interfaces(rec("ifconfig_lo0_alias.txt"))
    assert ifs["lo0"].networks == ["127.0.0.0/8", "10.0.0.0/8"] and ifs["en0"].networks == [
        "172.16.42.0/24"
    ]
    assert platform.parse_ifconfig_interfaces(rec("ifconfig_v_link_local.txt"))["en1"].networks == [
        "169.254.0.0/16"
    ]
    linux = (
        "eth0      Link encap:Ethernet\n          inet addr:192.168.2.106  Bcast:192.168.2.255  "
        "Mask:255.255.255.0\n"
    )
    assert platform.parse_ifconfig_interfaces(linux)["eth0"].networks == ["192.168.2.0/24"]
    assert platform.parse_ifconfig_interfaces("wg0: flags=8051<UP>\n\tinet 10.9.0.2\n")[
        "wg0"
    ].networks == ["10.9.0.2/32"]


def test_self_assigned_addresses_are_told_apart():
    assert platform.link_local("169.254.243.94") and not platform.link_local("10.25.0.1")
    assert platform.parse_ifconfig(
        "eth0      Link encap:Ethernet\n          inet addr:192.168.2.106  Bcast:192.168.2.255\n"
    ) == [("eth0", "192.168.2.106")]  # Linux's old net-tools, where a host has no `ip`


@pytest.mark.skipif(not shutil.which("ip"), reason="needs iproute2's `ip` (Linux)")
def test_ip_addr_of_this_machine_names_addresses_it_can_bind():
    pairs = platform.parse_ip_addr(
        subprocess.run(
            ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True
        ).stdout
    )
    assert ("lo", "127.0.0.1") in pairs and pairs == platform.interface_addresses()
    for _, address in pairs:
        with socket.socket() as s:
            s.bind((address, 0))  # OSError if this machine did not hold it


def test_boot_ids_are_read_alike_on_both_systems():
    assert (
        platform.parse_boot_id(rec("bootsessionuuid.txt")) == "40962879-b7ee-4f13-af6e-e7266ef5e732"
    )
    with pytest.raises(ValueError, match="not a boot id"):
        # without -n
        platform.parse_boot_id("kern.bootsessionuuid: 40962879-B7EE-4F13-AF6E-E7266EF5E732")


@LINUX
def test_boot_id_of_this_machine():
    assert platform.boot_id() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def test_port_ranges_are_read_alike_on_both_systems():
    assert platform.parse_port_range(rec("portrange.txt")) == (49152, 65535)
    # Linux's file: one line, a tab
    assert platform.parse_port_range("32768\t60999\n") == (32768, 60999)
    with pytest.raises(ValueError, match="not a port range"):
        platform.parse_port_range("49152\n")


def test_only_ring_ports_in_the_ephemeral_range_need_a_hold():
    mac, linux = (
        platform.parse_port_range(rec("portrange.txt")),
        platform.parse_port_range("32768\t60999\n"),
    )
    assert not platform.in_ephemeral(32323, mac) and not platform.in_ephemeral(32330, linux)
    assert platform.in_ephemeral(49152, mac) and platform.in_ephemeral(40000, linux)
    assert not platform.in_ephemeral(65536, mac) and not platform.in_ephemeral(61000, linux)


def test_what_holds_a_port_is_asked_with_each_system_own_command():
    # macOS has no ss
    assert platform.port_holders(32323, "Darwin") == "lsof -nP -iTCP:32323 -sTCP:LISTEN"
    assert platform.port_holders(32323, "Linux") == "ss -tanp | grep 32323"


@LINUX
def test_port_range_of_this_machine():
    first, last = platform.ephemeral_ports()
    assert f"{first}\t{last}" == Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().strip()


def test_resident_memory_is_current_and_peak_is_apart():
    # Mapped apart from malloc, whose heap may keep freed memory resident (and did, after other
    # tests).
    before, block = platform.resident_bytes(), mmap.mmap(-1, 96 << 20)
    for i in range(0, len(block), mmap.PAGESIZE):
        block[i] = 1  # written, so resident
    during = platform.resident_bytes()
    block.close()
    after = platform.resident_bytes()
    assert during - before > 80 << 20 and during - after > 80 << 20, (before, during, after)
    assert platform.peak_resident_bytes() >= during - (1 << 20)
    assert (
        platform.maxrss_bytes(1000, "Darwin") == 1000
        and platform.maxrss_bytes(1000, "Linux") == 1024000
    )


def test_mach_task_basic_info_has_the_layout_of_the_header():
    # <mach/task_info.h>: three 64-bit sizes, two time_value_t, policy, suspend_count, under
    # pack(4).
    assert (
        ctypes.sizeof(platform.MachTaskBasicInfo) == 48
        and platform.MACH_TASK_BASIC_INFO_COUNT == 12
    )
    assert platform.MachTaskBasicInfo.resident_size.offset == 8


@pytest.mark.parametrize(
    "recording, on",
    [
        ("firewall_enabled.txt", True),
        ("firewall_disabled.txt", False),
        ("firewall_state2.txt", True),
        ("firewall_blocking_all.txt", True),
    ],
)
def test_firewall_state(recording, on):
    assert macos_settings.parse_firewall(rec(recording)) is on


def test_firewall_advice_names_the_environment_python_only_when_on():
    py = "/Users/Shared/mlx-ring/.venv/bin/python"
    text = macos_settings.firewall_advice(True, py)
    assert (
        f"sudo /usr/libexec/ApplicationFirewall/socketfilterfw --add {py} --unblockapp {py}" in text
    )
    assert (
        macos_settings.firewall_advice(False, py) is None
        and macos_settings.firewall_advice(None, py) is None
    )
    assert (
        macos_settings.parse_firewall(
            "Firewall settings cannot be modified from command line on managed Mac computers."
        )
        is None
    )


@pytest.mark.parametrize(
    "recording, value",
    [
        ("firewall_blockall_enabled.txt", True),
        ("firewall_blockall_disabled.txt", False),
        ("firewall_stealth_on.txt", True),
        ("firewall_stealth_off.txt", False),
    ],
)
def test_firewall_switches(recording, value):
    assert macos_settings.parse_switch(rec(recording)) is value
    assert (
        macos_settings.parse_switch(
            "Firewall settings cannot be modified from command line on managed Mac computers."
        )
        is None
    )


@pytest.mark.parametrize(
    "recording, allowed",
    [
        ("appblocked_blocked.txt", False),
        ("appblocked_permitted.txt", True),
        ("appblocked_not_listed.txt", False),
        ("appblocked_not_blocked_path.txt", True),
    ],
)
def test_firewall_standing_of_a_program(recording, allowed):
    assert macos_settings.parse_app_allowed(rec(recording)) is allowed
    assert (
        macos_settings.parse_app_allowed("") is None
        and macos_settings.parse_app_allowed("usage: socketfilterfw ...") is None
    )


def test_a_firewall_that_drops_the_ring_is_named_with_the_lines_that_let_it_in():
    py = "/Users/me/.local/share/uv/python/cpython-3.11.11-macos-aarch64-none/bin/python3.11"
    allow = f"sudo /usr/libexec/ApplicationFirewall/socketfilterfw --add {py} --unblockapp {py}"
    on = macos_settings.parse_firewall(rec("firewall_enabled.txt"))
    blocked = macos_settings.Firewall(
        on, False, False, macos_settings.parse_app_allowed(rec("appblocked_not_listed.txt"))
    )
    assert allow in macos_settings.firewall_blocks(
        blocked, py
    ) and "does not let" in macos_settings.firewall_blocks(blocked, py)
    all_in = macos_settings.Firewall(
        on, macos_settings.parse_switch(rec("firewall_blockall_enabled.txt")), False, True
    )
    said = macos_settings.firewall_blocks(all_in, py)
    assert (
        "blocks all incoming connections" in said and "--setblockall off" in said and allow in said
    )
    # allowed
    assert (
        macos_settings.firewall_blocks(macos_settings.Firewall(on, False, False, True), py) is None
    )
    # unknown: a warning
    assert (
        macos_settings.firewall_blocks(macos_settings.Firewall(on, False, False, None), py) is None
    )
    # off
    assert (
        macos_settings.firewall_blocks(macos_settings.Firewall(False, True, True, False), py)
        is None
    )
    assert "stealth mode" in macos_settings.stealth_note(
        macos_settings.Firewall(on, False, True, True)
    )
    assert macos_settings.stealth_note(macos_settings.Firewall(False, False, True, None)) is None


def test_power_settings_that_take_a_mac_away_are_named_with_their_fix():
    desktop = macos_settings.parse_pmset(rec("pmset_g_desktop.txt"))
    assert (
        desktop["sleep"] == "1"
        and desktop["Sleep On Power Button"] == "1"
        and desktop["SleepDisabled"] == "0"
    )
    said = macos_settings.power_advice(desktop)
    assert (
        "goes to sleep after 1 idle minute(s)" in said and "stays off after a power failure" in said
    )
    assert (
        "sudo pmset -a sleep 0 autorestart 1" in said
        and "Prevent automatic sleeping when the display is off" in said
    )
    laptop = macos_settings.parse_pmset(rec("pmset_g_macbook.txt"))
    assert "autorestart" not in laptop and "sudo pmset -a sleep 0 (" in macos_settings.power_advice(
        laptop
    )
    womp = macos_settings.parse_pmset(rec("pmset_g_womp_off.txt"))
    assert womp[
        "displaysleep"
    ] == "10" and "sleep 0 womp 1 autorestart 1" in macos_settings.power_advice(womp)
    ready = dict(desktop, sleep="0", autorestart="1")
    # Linux: nothing read
    assert macos_settings.power_advice(ready) is None and macos_settings.power_advice({}) is None
    # pmset disablesleep 1
    assert macos_settings.power_advice(dict(desktop, SleepDisabled="1", autorestart="1")) is None


def test_no_route_on_macos_15_names_local_network_privacy():
    err = "ssh: connect to host 169.254.10.2 port 22: No route to host"
    text = ssh.explain("mac-b", err, system="Darwin", mac_version="15.1")
    assert "is it on" in text and "Privacy & Security > Local Network" in text and "\n" not in text
    assert "Local Network" not in ssh.explain("mac-b", err, system="Darwin", mac_version="14.6.1")
    assert "Local Network" not in ssh.explain("mac-b", err, system="Linux", mac_version="")
    assert "Local Network" not in ssh.explain(
        "mac-b",
        "ssh: connect to host x port 22: Connection timed out",
        system="Darwin",
        mac_version="15.1",
    )


@pytest.mark.skipif(sys.platform == "darwin", reason="Linux's side; macOS's below")
def test_keep_awake_does_nothing_off_macos():
    assert platform.keep_awake(os.getpid()) is None


@pytest.mark.skipif(sys.platform != "darwin", reason="caffeinate is macOS's")
def test_keep_awake_holds_until_the_process_exits():
    child = subprocess.Popen(["sleep", "30"])
    awake = platform.keep_awake(child.pid)
    assert awake.poll() is None
    child.kill()
    child.wait()
    assert awake.wait(timeout=10) == 0


def run_script(shell: str, root: Path, path: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": path} if path else None
    return subprocess.run(
        [shell, "-c", SCRIPT, "sh", str(root), str(root / "cache")],
        input="a.txt\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("shell", SHELLS)
@LINUX
def test_facts_script_on_this_machine(shell, tmp_path):
    (tmp_path / "launch.sh").write_text("")
    (tmp_path / "a.txt").write_text("a\n")
    p = run_script(shell, tmp_path)
    assert p.stderr == ""
    f = parse("here", p.stdout)
    total, _ = platform.parse_meminfo(Path("/proc/meminfo").read_text())
    assert f.memory_gb == total / 2**30 and 0 < f.free_gb <= f.memory_gb
    assert f.interfaces["lo"].addresses == ["127.0.0.1"] and set(f.addresses) == {
        a for _, a in platform.interface_addresses()
    }
    assert f.firewall is None and f.system.startswith("Linux") and f.checkout
    assert f.sums == {"a.txt": "87428fc522803d31065e7bce3cf03fe475096631e5e07bbd7a0fde60c4cf25c7"}


@pytest.mark.parametrize("shell", SHELLS)
def test_facts_script_on_a_mac_replaying_its_commands(shell, tmp_path):
    # uname, sysctl, vm_stat and ifconfig answer as the recorded Macs did; everything else is real.
    shims = tmp_path / "bin"
    shims.mkdir()
    answers = {
        "uname": 'case "$1" in -s) echo Darwin;; -m) echo arm64;; *) echo Darwin;; esac',
        "sysctl": f'cat "{MAC}/hw_memsize_16gb.txt"',
        "vm_stat": f'cat "{MAC}/vm_stat_apple_silicon.txt"',
        "ifconfig": (
            f'cat "{MAC}/ifconfig_apple_silicon_ports.txt" "{MAC}/ifconfig_mac_mini_bridge0.txt"'
        ),
        "pmset": f'cat "{MAC}/pmset_g_desktop.txt"',
    }
    for name, body in answers.items():
        (shims / name).write_text(f"#!/bin/sh\n{body}\n")
        (shims / name).chmod(0o755)
    p = run_script(shell, tmp_path, f"{shims}:{os.environ['PATH']}")
    f = parse("mac-b", p.stdout)
    assert (f.system, f.memory_gb, f.free_gb) == (
        "Darwin arm64",
        16.0,
        (3857 + 443760 + 1075 + 17340) * 16384 / 2**30,
    )
    assert {k: i.addresses for k, i in f.interfaces.items() if i.addresses} == {
        "lo0": ["127.0.0.1"],
        "bridge0": ["10.25.0.1"],
    } and f.addresses == ("10.25.0.1", "127.0.0.1")
    assert not f.checkout and f.firewall is None  # no socketfilterfw on this machine
    assert f.power["autorestart"] == "0" and f.power["sleep"] == "1"


@pytest.mark.parametrize("shell", SHELLS)
def test_facts_script_asks_a_macs_firewall_about_the_environments_python(shell, tmp_path):
    # socketfilterfw answers as recorded, from a folder of its own (the script's path to it,
    # replaced); the environment's python reports the real binary behind it, as the real one does.
    py = "/Users/me/.local/share/uv/python/cpython-3.11.11-macos-aarch64-none/bin/python3.11"
    shims, fw = tmp_path / "bin", tmp_path / "socketfilterfw"
    shims.mkdir()
    (shims / "uname").write_text('#!/bin/sh\ncase "$1" in -s) echo Darwin;; *) echo arm64;; esac\n')
    fw.write_text(
        f'#!/bin/sh\ncase "$1" in\n  --getglobalstate) cat "{MAC}/firewall_enabled.txt";;\n'
        f'  --getblockall) cat "{MAC}/firewall_blockall_disabled.txt";;\n'
        f'  --getstealthmode) cat "{MAC}/firewall_stealth_off.txt";;\n'
        f'  --getappblocked) [ "$2" = "{py}" ] && cat '
        f'"{MAC}/appblocked_not_listed.txt";;\nesac\n'
    )
    (tmp_path / "launch.sh").write_text("")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").write_text(
        f"#!/bin/sh\necho python={py}\necho versions=0.32.4 0.32.2\n"
    )
    for f in (shims / "uname", fw, tmp_path / ".venv" / "bin" / "python"):
        f.chmod(0o755)
    script = SCRIPT.replace("/usr/libexec/ApplicationFirewall/socketfilterfw", str(fw))
    p = subprocess.run(
        [shell, "-c", script, "sh", str(tmp_path), str(tmp_path / "cache")],
        input="",
        text=True,
        capture_output=True,
        env={**os.environ, "PATH": f"{shims}:{os.environ['PATH']}"},
        timeout=60,
    )
    f = parse("mac-b", p.stdout)
    assert f.python == py and f.fw == macos_settings.Firewall(True, False, False, False), p.stdout
    assert "does not let" in macos_settings.firewall_blocks(f.fw, f.python)


def test_facts_parse_every_section():
    out = (
        "hostname=mac-b\nsystem=Darwin "
        f"arm64\nmemsize<<\n{rec('hw_memsize_16gb.txt')}>>\nvm_stat<<\n{rec('vm_stat_intel.txt')}>>\nifconfig<<\n{rec('ifconfig_v_link_local.txt')}>>\nfirewall<<\n{rec('firewall_enabled.txt')}>>\nblockall<<\n{rec('firewall_blockall_disabled.txt')}>>\nstealth<<\n{rec('firewall_stealth_on.txt')}>>\nappblocked<<\n{rec('appblocked_blocked.txt')}>>\npmset<<\n{rec('pmset_g_macbook.txt')}>>\nuv=/Users/me/.local/bin/uv\n"
    )
    f = parse("mac-b", out)
    assert f.fw == macos_settings.Firewall(True, False, True, False) and f.power["lidwake"] == "1"
    assert f.memory_gb == 16.0 and {
        k: i.addresses for k, i in f.interfaces.items() if i.addresses
    } == {"lo0": ["127.0.0.1"], "en1": ["169.254.243.94"]}
    assert f.firewall is True and f.uv == "/Users/me/.local/bin/uv"
    # sysctl and vm_stat said nothing
    bare = parse("mac-c", "hostname=mac-c\nmemsize<<\n>>\nvm_stat<<\n>>\n")
    assert (bare.memory_gb, bare.addresses, bare.firewall) == (0.0, (), None)


def test_link_probe_runs_the_environment_python_and_knows_a_busy_port():
    # Both ends on this machine, as for a ring's local ranks; the probe is the one `check` runs on
    # hosts.
    port = free_port(2)
    a, b = (
        SimpleNamespace(ssh=n, local=True, address="127.0.0.1", port=p)
        for n, p in (("a", port), ("b", port + 1))
    )
    got = measure_pair(None, a, b, mb=4)
    # loopback sends it all within the time
    assert set(got) == {"rtt_ms", "gbit_s", "mb"} and got["mb"] == 4
    assert measure_pair(None, a, b, mb=4, seconds=0)["mb"] == 0  # out of time: it sends no more
    assert measure_pair(None, a, b, mb=4, root="/nonexistent") == {
        "error": "no project environment at /nonexistent/.venv/bin/python (./launch.sh setup there)"
    }
    with socket.socket() as busy:
        # the probe's own listener may be in TIME_WAIT
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", b.port))
        busy.listen()
        # EADDRINUSE, 48 or 98
        assert "is the ring running? ./launch.sh stop" in measure_pair(None, a, b, mb=4)["error"]
