"""What `check` runs on each host: the host facts script under dash and bash 3.2, on this machine
and with macOS's commands replaying the recordings, and its output parsed; and the link probe,
which runs the host's environment Python and knows a busy port by errno.EADDRINUSE."""

import os
import shutil
import socket
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from platformutil import LINUX, MAC, rec

from mlx_ring import macos_settings, platform
from mlx_ring.hosts.facts import SCRIPT, parse
from mlx_ring.hosts.link import measure_pair
from mlx_ring.ring.launch import free_port

SHELLS = [s for s in ("dash", "/work/shared/mac/bash-3.2") if shutil.which(s) or Path(s).exists()]


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
    # Both ends on this machine, as for a ring's local ranks; the probe is the one
    # `check` runs on hosts.
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
