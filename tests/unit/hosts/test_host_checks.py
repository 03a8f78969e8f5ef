"""What `check` makes of each host: the facts a host reports, parsed; the warnings and refusals
drawn from them (a Mac's firewall, ring addresses that misroute, sleep); and the ranks' agreement
on model, code and versions."""

import os

from hostsutil import hosts_from

from mlx_ring.hosts.facts import parse
from mlx_ring.hosts.identity import disagreement


def test_facts_parse():
    out = (
        "hostname=mac-b\nsystem=Darwin arm64\nmeminfo<<\nMemTotal: 16777216 kB\nMemAvailable: "
        "8388608 kB\n>>\nip_addr<<\n1: lo    inet 127.0.0.1/8 scope host lo\n2: en0    inet "
        "10.0.0.2/24 brd 10.0.0.255 scope global "
        "en0\n>>\nuv=/Users/me/.local/bin/uv\ncheckout=yes\nversions=0.32.4 0.32.2\nsums<<\nabc  "
        "server.py\ndef  mlx_ring/a b.py\n>>\nblobs=aa.safetensors bb.safetensors\nhosted=m1 ff\n"
    )
    f = parse("mac-b", out)
    assert (f.hostname, f.system, f.memory_gb, f.free_gb, f.addresses) == (
        "mac-b",
        "Darwin arm64",
        16.0,
        8.0,
        ("10.0.0.2", "127.0.0.1"),
    )
    assert (
        f.checkout
        and f.versions == "0.32.4 0.32.2"
        and f.sums == {"server.py": "abc", "mlx_ring/a b.py": "def"}
    )
    assert (
        f.blobs == {"aa.safetensors", "bb.safetensors"}
        and f.hosted == {"m1": "ff"}
        and not f.openblas
    )


def test_disagreement_names_the_host_that_differs():
    row = {"host": "mac-a", "model": "m1", "code": "c1", "mlx": "0.32.4", "mlx-lm": "0.32.2"}
    assert disagreement([row, dict(row, host="mac-b")]) is None
    text = disagreement([row, dict(row, host="mac-b"), dict(row, host="mac-c", model="m2")])
    assert (
        text.startswith("rank 2 on host mac-c has model m2 but rank 0 on mac-a has m1;")
        and "set MODEL once" in text
    )
    assert "rank 1 on host mac-b has mlx 0.31.0" in disagreement(
        [row, dict(row, host="mac-b", mlx="0.31.0")]
    )


def test_check_warns_of_a_macs_firewall_and_of_misrouting_ring_addresses(tmp_path):
    from mlx_ring.hosts.facts import Facts
    from mlx_ring.launcher.preflight import Preflight, warnings

    mac = Facts(
        "mini-2.local",
        system="Darwin arm64",
        firewall=True,
        python="/Users/Shared/py/bin/python3.11",
    )
    ring = Preflight(
        None,
        None,
        hosts_from(
            tmp_path,
            [
                {"ssh": "mini-1", "ips": ["192.168.1.10"]},
                {"ssh": "mini-2.local", "ips": ["169.254.7.2"]},
            ],
        ),
        None,
        {"mini-1": Facts("mini-1", system="Darwin arm64", firewall=False), "mini-2.local": mac},
        [],
    )
    said = warnings(ring)
    assert len(said) == 2 and "169.254.7.2" in said[0]
    assert (
        said[1].startswith("mini-2.local: the macOS Application Firewall is on")
        and "--add /Users/Shared/py/bin/python3.11 --unblockapp /Users/Shared/py/bin/python3.11"
        in said[1]
    )


def test_a_firewall_that_drops_the_ring_stops_it_and_a_mac_that_sleeps_is_warned_of(tmp_path):
    from mlx_ring.hosts.facts import Facts
    from mlx_ring.launcher.preflight import Preflight, firewall_problems, warnings
    from mlx_ring.macos_settings import Firewall, parse_pmset

    mac_dir = os.path.join(os.path.dirname(__file__), "..", "..", "data", "macos")
    py = "/Users/me/.local/share/uv/python/cpython-3.11.11-macos-aarch64-none/bin/python3.11"
    blocked = Facts(
        "mini-2.local",
        system="Darwin arm64",
        firewall=True,
        python=py,
        fw=Firewall(True, False, False, False),
        power=parse_pmset(open(os.path.join(mac_dir, "pmset_g_desktop.txt")).read()),
    )
    here = Facts(
        "127.0.0.1",
        system="Darwin arm64",
        firewall=True,
        python=py,
        fw=Firewall(True, False, True, True),
    )
    entries = [
        {"ssh": "127.0.0.1", "ips": ["192.168.1.10"]},
        {"ssh": "mini-2.local", "ips": ["192.168.1.11"]},
    ]
    ring = Preflight(
        None,
        None,
        hosts_from(tmp_path, entries),
        None,
        {"127.0.0.1": here, "mini-2.local": blocked},
        [],
    )
    firewall_problems(ring)
    assert len(ring.problems) == 1 and ring.problems[0].startswith(
        f"mini-2.local: the macOS Application Firewall does not let {py} accept "
        "incoming connections"
    )
    assert f"--add {py} --unblockapp {py}" in ring.problems[0]
    # the refusal is not repeated as a warning; stealth mode and sleep are warned of
    said = warnings(ring)
    assert not any("does not let" in w for w in said)
    assert any(
        w.startswith("this machine: the macOS Application Firewall is in stealth mode")
        for w in said
    )
    assert any(
        w.startswith("mini-2.local: it goes to sleep after 1 idle minute(s)")
        and "sudo pmset -a sleep 0" in w
        for w in said
    ), said
    # One machine: the ranks talk over loopback, which the firewall lets through.
    alone = Preflight(
        None,
        None,
        hosts_from(tmp_path, [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * 2),
        None,
        {
            "127.0.0.1": Facts(
                "127.0.0.1", firewall=True, python=py, fw=Firewall(True, True, True, False)
            )
        },
        [],
    )
    firewall_problems(alone)
    assert alone.problems == [] and warnings(alone) == []
