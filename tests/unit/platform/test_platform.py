"""mlx_ring.platform: each parser on recorded macOS outputs and on this Linux machine's own files
(memory, interfaces and their addresses, boot ids, the ephemeral port range, resident memory) and
keeping a Mac awake; mlx_ring.platform_disk: the prompt cache's folder, backup exclusion and
open-file limit."""

import ctypes
import mmap
import os
import resource
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from platformutil import LINUX, rec

from mlx_ring import platform, platform_disk


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
    # macOS prints the mask in hex (`netmask 0xffffff00`): what the Thunderbolt
    # subnets must not overlap.
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
    # Mapped apart from malloc, whose heap may keep freed memory resident (and
    # did, after other tests).
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
    # <mach/task_info.h>: three 64-bit sizes, two time_value_t, policy,
    # suspend_count, under pack(4).
    assert (
        ctypes.sizeof(platform.MachTaskBasicInfo) == 48
        and platform.MACH_TASK_BASIC_INFO_COUNT == 12
    )
    assert platform.MachTaskBasicInfo.resident_size.offset == 8


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


def test_the_prompt_cache_lives_where_each_system_keeps_caches(tmp_path):
    # Spotlight skips *.noindex folders; elsewhere the blocks go under CACHE_DIR
    assert platform_disk.prompt_cache_folder(
        "Darwin", Path("/Users/me"), cache_dir=tmp_path
    ) == Path("/Users/me/Library/Caches/mlx-ring.noindex/prompt-blocks")
    assert platform_disk.prompt_cache_folder("Linux", Path("/home/me"), cache_dir=tmp_path) == (
        tmp_path / "prompt-blocks"
    )


def shim(folder: Path, name: str, body: str) -> None:
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(f"#!/bin/sh\n{body}\n")
    (folder / name).chmod(0o755)


def test_only_a_mac_excludes_the_cache_from_backups(tmp_path, monkeypatch, caplog):
    calls, shims = tmp_path / "calls.txt", tmp_path / "bin"
    shim(shims, "tmutil", f'echo "$@" >> "{calls}"')  # tmutil prints nothing when it succeeds
    monkeypatch.setenv("PATH", f"{shims}:{os.environ['PATH']}")
    platform_disk.exclude_from_backups(tmp_path / "blocks", "Linux")
    assert not calls.exists()
    platform_disk.exclude_from_backups(tmp_path / "blocks", "Darwin")
    assert calls.read_text() == f"addexclusion {tmp_path / 'blocks'}\n" and not caplog.text


def test_a_failed_backup_exclusion_is_logged_and_serving_goes_on(tmp_path, monkeypatch, caplog):
    shim(tmp_path / "bin", "tmutil", 'echo "tmutil: the item could not be excluded" >&2; exit 1')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    platform_disk.exclude_from_backups(tmp_path, "Darwin")
    assert "could not be excluded" in caplog.text
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no tmutil at all
    platform_disk.exclude_from_backups(tmp_path, "Darwin")
    assert caplog.text.count("Time Machine") == 2


def test_open_files_are_raised_as_far_as_the_hard_limit_allows():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(soft, 256)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
        want = low * 4 if hard == resource.RLIM_INFINITY else min(low * 4, hard)
        assert (
            platform_disk.raise_open_files(want)
            == want
            == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        )
        assert platform_disk.raise_open_files(low) == want  # never lowered
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("refusal", [OSError(22, "Invalid argument"), ValueError("too large")])
def test_a_macs_unlimited_hard_limit_is_stepped_down_to_what_the_kernel_takes(monkeypatch, refusal):
    # macOS reports (256, RLIM_INFINITY) and refuses a soft limit over kern.maxfilesperproc
    infinity, limits, tried = 2**63 - 1, [256, 2**63 - 1], []

    def setrlimit(which, pair):
        tried.append(pair[0])
        if pair[0] > 24576:
            raise refusal
        limits[:] = pair

    fake = SimpleNamespace(
        RLIMIT_NOFILE=resource.RLIMIT_NOFILE,
        RLIM_INFINITY=infinity,
        getrlimit=lambda which: tuple(limits),
        setrlimit=setrlimit,
    )
    monkeypatch.setattr(platform_disk, "resource", fake)
    assert platform_disk.raise_open_files(65536) == 16384 and tried == [65536, 32768, 16384]
    assert platform_disk.raise_open_files() == 16384  # already above what is wanted
    limits[:] = [256, 1024]  # a hard limit that is a number (eradman/entr#142)
    assert platform_disk.raise_open_files() == 1024 and tried[-1] == 1024
