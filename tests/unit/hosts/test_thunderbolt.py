"""Thunderbolt addressing on recorded macOS outputs (tests/data/macos/thunderbolt/README.md names
each source): the per-cable addresses and commands match MLX's own configure_ring, the hosts.json
is in ring order with each rank's address on the cable from its predecessor, and the hostfile
warnings fire where the addresses misroute or loop."""

import io
import json
from argparse import Namespace
from pathlib import Path

import pytest

from mlx_ring.hostfile import format_hostfile, load_hosts
from mlx_ring.hosts import address_checks, mac_facts
from mlx_ring.hosts import thunderbolt as tb

DATA = Path(__file__).resolve().parents[2] / "data" / "macos" / "thunderbolt"
TWO = {"127.0.0.1": "two-macs/mbp", "studio.local": "two-macs/studio"}
THREE = {
    "127.0.0.1": "three-macs/mini-a",
    "mini-b.local": "three-macs/mini-b",
    "mini-c.local": "three-macs/mini-c",
}


def facts(
    host: str,
    stem: str,
    ifconfig: str = "ifconfig",
    system: str = "Darwin",
    services: str = "services",
    edit=lambda text: text,
) -> mac_facts.MacFacts:
    """`stem`'s recordings as the facts script prints them on that Mac (`edit`: a
    change to its ifconfig)."""

    def read(suffix):
        return (DATA / f"{stem}.{suffix}").read_text()

    out = (
        f"system={system}\n--- thunderbolt\n{read('system_profiler.json')}--- "
        f"ports\n{read('networksetup.txt')}"
        f"--- services\n{read(services + '.txt')}--- ifconfig\n{edit(read(ifconfig + '.txt'))}"
    )
    return mac_facts.parse_facts(host, out)


def entries_for(macs: dict, order=None) -> list[dict]:
    return [
        {"ssh": name, "ips": ["169.254.0.1"], "memory_gb": 16 + i}
        for i, name in enumerate(order or macs)
    ]


def hosts_from(tmp_path, entries):
    if isinstance(entries, dict):  # ssh name -> ring address
        entries = [{"ssh": name, "ips": [ip]} for name, ip in entries.items()]
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps(entries))
    return load_hosts(path, 32323)


def test_two_macs_one_cable_gets_one_subnet():
    entries = entries_for(TWO)
    p = tb.propose(entries, [facts(n, s) for n, s in TWO.items()])
    # The MacBook's cabled receptacle 1 is "Thunderbolt 1" (en1); the Studio's receptacle 2 is en3.
    # Each cabled port gets a service of its own with a static address: saved settings, kept across
    # restarts; the bridge service goes off, and bridge0 down for now.
    assert p.commands == {
        "127.0.0.1": [
            "networksetup -setnetworkserviceenabled 'Thunderbolt Bridge' off",
            "ifconfig bridge0 down",
            "networksetup -createnetworkservice 'mlx-ring Thunderbolt 1' 'Thunderbolt 1'",
            "networksetup -setmanual 'mlx-ring Thunderbolt 1' 192.168.0.1 255.255.255.252",
        ],
        "studio.local": [
            "networksetup -setnetworkserviceenabled 'Thunderbolt Bridge' off",
            "ifconfig bridge0 down",
            "networksetup -createnetworkservice 'mlx-ring Thunderbolt 2' 'Thunderbolt 2'",
            "networksetup -setmanual 'mlx-ring Thunderbolt 2' 192.168.0.2 255.255.255.252",
        ],
    }
    assert p.addresses == {
        "127.0.0.1": [("en1", "192.168.0.1")],
        "studio.local": [("en3", "192.168.0.2")],
    }
    assert p.entries == [
        {"ssh": "127.0.0.1", "ips": ["192.168.0.1"], "memory_gb": 16},
        {"ssh": "studio.local", "ips": ["192.168.0.2"], "memory_gb": 17},
    ]
    assert p.cables == [("127.0.0.1", "en1", "studio.local", "en3")]


def test_three_macs_in_a_triangle_keep_hosts_json_order():
    p = tb.propose(entries_for(THREE), [facts(n, s) for n, s in THREE.items()])
    # a.r1-b.r2, b.r1-c.r2, c.r1-a.r2 (en2 = receptacle 1, en3 = 2): MLX numbers
    # cables in port order.
    assert p.addresses["127.0.0.1"] == [("en2", "192.168.0.1"), ("en3", "192.168.0.5")]
    assert p.commands["127.0.0.1"][-2:] == [
        "networksetup -createnetworkservice 'mlx-ring Thunderbolt 2' 'Thunderbolt 2'",
        "networksetup -setmanual 'mlx-ring Thunderbolt 2' 192.168.0.5 255.255.255.252",
    ]
    # Each rank's address is its end of the cable from the rank before it: mini-c reaches
    # rank 0 at .5.
    assert [(e["ssh"], e["ips"]) for e in p.entries] == [
        ("127.0.0.1", ["192.168.0.5"]),
        ("mini-b.local", ["192.168.0.2"]),
        ("mini-c.local", ["192.168.0.10"]),
    ]
    assert p.cables == [
        ("127.0.0.1", "en2", "mini-b.local", "en3"),
        ("mini-b.local", "en2", "mini-c.local", "en3"),
        ("mini-c.local", "en2", "127.0.0.1", "en3"),
    ]


def test_rank_0_stays_hosts_json_first_entry():
    order = ["studio.local", "127.0.0.1"]
    p = tb.propose(entries_for(TWO, order), [facts(n, TWO[n]) for n in order])
    assert [e["ssh"] for e in p.entries] == order
    # numbered from the first host's ports
    assert [e["ips"] for e in p.entries] == [["192.168.0.1"], ["192.168.0.2"]]


def test_hosts_json_order_that_is_not_cabled_as_a_ring_is_replaced_by_one_from_rank_0():
    # Four Macs cabled 0-2, 2-1, 1-3, 3-0: hosts.json's 0,1,2,3 has no 0-1 cable.
    cabled = {(0, 2), (2, 1), (1, 3), (3, 0)}
    matrix = [[int((i, j) in cabled or (j, i) in cabled) for j in range(4)] for i in range(4)]
    assert tb._ring_order(matrix, list("abcd")) in ([0, 2, 1, 3], [0, 3, 1, 2])
    assert tb._ring_order([[0, 1, 1], [1, 0, 1], [1, 1, 0]], list("abc")) == [0, 1, 2]


@pytest.mark.parametrize("macs", [TWO, THREE], ids=["two", "three"])
def test_commands_and_hostfile_are_what_mlx_configure_ring_produces(
    macs, tmp_path, monkeypatch, capsys
):
    cfg = tb.mlx_config
    mac_facts = [facts(n, s) for n, s in macs.items()]
    p = tb.propose(entries_for(macs), mac_facts)
    hosts = [cfg.Host(i, n, [], []) for i, n in enumerate(macs)]
    tb_hosts = [tb.thunderbolt_host(m) for m in mac_facts]
    index = {port.uuid: (i, j) for i, h in enumerate(tb_hosts) for j, port in enumerate(h.ports)}
    ring = cfg.extract_rings(cfg.make_connectivity_matrix(tb_hosts, index))[0]
    # its "Enter to continue" prompts
    monkeypatch.setattr("sys.stdin", io.StringIO("\n" * len(macs)))
    out = tmp_path / "mlx-hostfile.json"
    cfg.configure_ring(
        Namespace(verbose=False, auto_setup=False, output_hostfile=str(out), env=[]),
        hosts,
        cfg.IPConfigurator(hosts, tb_hosts, index),
        ring,
        [cfg.SSHInfo(True, False)] * len(macs),
    )
    printed = capsys.readouterr().out
    # the same address on the same port as MLX's ifconfig lines
    for name, pairs in p.addresses.items():
        mlx = printed.split(f"Setup for {name}\n")[1].split("\n\n")[0]
        assert [
            tuple(line.split()[2:5:2]) for line in mlx.splitlines() if " inet " in line
        ] == pairs
    mlx_hosts = json.loads(out.read_text())["hosts"]
    assert [(h["ssh"], h["ips"]) for h in mlx_hosts] == [(e["ssh"], e["ips"]) for e in p.entries]


def test_printed_proposal_holds_the_commands_and_the_hosts_json_it_writes():
    p = tb.propose(entries_for(THREE), [facts(n, s) for n, s in THREE.items()])
    text = tb.format_proposal(p)
    assert text.startswith(
        "Thunderbolt ring (rank order): 127.0.0.1 -> mini-b.local -> mini-c.local -> 127.0.0.1\n"
    )
    assert (
        "# on this Mac (an administrator's sudo; lasts across restarts):\n"
        "sudo networksetup -setnetworkserviceenabled 'Thunderbolt Bridge' off\n"
    ) in text
    assert (
        "# on mini-c.local" in text
        and "sudo networksetup -setmanual 'mlx-ring Thunderbolt 2' 192.168.0.10 255.255.255.252"
        in text
    )
    written = format_hostfile(p.entries)
    assert text.endswith(written.rstrip())
    assert json.loads(written) == p.entries
    assert json.loads(written)[2] == {
        "ssh": "mini-c.local",
        "ips": ["192.168.0.10"],
        "memory_gb": 18,
    }


def test_a_line_of_macs_is_not_a_ring():
    macs = [facts(n, s) for n, s in THREE.items()]
    unplug = {("127.0.0.1", "2"), ("mini-c.local", "1")}  # both ends of the mini-c <-> mini-a cable
    for m in macs:
        for bus in m.thunderbolt["SPThunderboltDataType"]:
            if (m.host, bus["receptacle_1_tag"]["receptacle_id_key"]) in unplug:
                bus.pop("_items")
    with pytest.raises(
        ValueError,
        match=r"no Thunderbolt ring runs through all 3 Macs \(cables found: "
        r"127.0.0.1-mini-b.local, "
        r"mini-b.local-mini-c.local\); cable each Mac",
    ):
        tb.propose(entries_for(THREE), macs)


def test_a_linux_host_is_named_in_one_sentence():
    linux = mac_facts.parse_facts("gpu-box", "system=Linux\n--- ifconfig\n")
    with pytest.raises(
        ValueError, match=r"^gpu-box is not a Mac \(Linux\): Thunderbolt addressing is for Macs"
    ):
        tb.propose(
            entries_for({"127.0.0.1": 0, "gpu-box": 0}),
            [facts("127.0.0.1", TWO["127.0.0.1"]), linux],
        )


def test_without_mlx_config_says_so(monkeypatch):
    monkeypatch.setattr(tb, "mlx_config", None)
    with pytest.raises(
        ValueError,
        match=r"lacks mlx._distributed_utils.config, the code behind `mlx.distributed_conf",
    ):
        tb.propose(entries_for(TWO), [facts(n, s) for n, s in TWO.items()])


def test_ifconfig_parse_sees_bridge_members_and_state():
    before = tb.parse_ifconfig_interfaces((DATA / "three-macs/mini-b.ifconfig.txt").read_text())
    after = tb.parse_ifconfig_interfaces(
        (DATA / "three-macs/mini-b.ifconfig-applied.txt").read_text()
    )
    assert (before["bridge0"].up, before["bridge0"].addresses, before["bridge0"].members) == (
        True,
        ["169.254.77.3"],
        ["en2", "en3", "en4"],
    )
    assert not after["bridge0"].up and after["en3"].addresses == ["192.168.0.2"] and after["en0"].up


def test_link_local_addresses_are_warned_about_with_the_fix(tmp_path):
    hosts = hosts_from(tmp_path, {"127.0.0.1": "169.254.37.12", "studio.local": "169.254.201.7"})
    ifs = {n: facts(n, s).interfaces for n, s in TWO.items()}
    # two Macs on bridge0 make no loop: only the routing warning
    (warning,) = address_checks.hostfile_warnings(hosts, ifs)
    assert warning.startswith(
        "link-local ring address(es) rank 0 (127.0.0.1) 169.254.37.12, rank 1 (studio.local) "
        "169.254.201.7: macOS keeps one route for 169.254/16"
    )
    assert warning.endswith(
        "`./launch.sh hosts --over thunderbolt` prints the commands and the hosts.json "
        "(then `--apply` and `--write`)"
    )
    assert address_checks.hostfile_warnings(hosts) == [warning]


def test_bridge0_in_a_ring_of_three_is_a_loop(tmp_path):
    hosts = hosts_from(
        tmp_path,
        {
            "127.0.0.1": "169.254.12.40",
            "mini-b.local": "169.254.77.3",
            "mini-c.local": "169.254.140.251",
        },
    )
    ifs = {n: facts(n, s).interfaces for n, s in THREE.items()}
    link_local, loop = address_checks.hostfile_warnings(hosts, ifs)
    assert link_local.startswith("link-local ring address(es) rank 0 (127.0.0.1) 169.254.12.40,")
    assert loop.startswith(
        "rank(s) 0 (127.0.0.1), 1 (mini-b.local), 2 (mini-c.local) use Thunderbolt Bridge "
        "(bridge0) addresses in a ring of 3 Macs: bridge0 joins every Thunderbolt port"
    )
    assert "layer-2 loop (a broadcast storm); give each cable its own subnet" in loop
    # without interfaces, bridge0 cannot be told apart
    assert address_checks.hostfile_warnings(hosts) == [link_local]


def test_bridge0_up_everywhere_loops_even_when_the_ring_uses_other_addresses(tmp_path):
    hosts = hosts_from(
        tmp_path,
        {
            "127.0.0.1": "192.168.1.40",
            "mini-b.local": "192.168.1.41",
            "mini-c.local": "192.168.1.42",
        },
    )
    ifs = {n: facts(n, s).interfaces for n, s in THREE.items()}
    (loop,) = address_checks.hostfile_warnings(hosts, ifs)
    assert loop.startswith(
        "Thunderbolt Bridge (bridge0) is up with its Thunderbolt ports on every host in a ring of 3"
    )
    ifs["mini-b.local"] = facts(
        "mini-b.local", THREE["mini-b.local"], "ifconfig-applied"
    ).interfaces
    assert (
        address_checks.hostfile_warnings(hosts, ifs) == []
    )  # one Mac with bridge0 down breaks the loop


def test_the_applied_proposal_draws_no_warning(tmp_path):
    p = tb.propose(entries_for(THREE), [facts(n, s) for n, s in THREE.items()])
    hosts = hosts_from(tmp_path, p.entries)
    ifs = {n: facts(n, s, "ifconfig-applied").interfaces for n, s in THREE.items()}
    assert address_checks.hostfile_warnings(hosts, ifs) == []
    for h in hosts:  # each rank holds its own address afterwards (what `check` verifies)
        assert h.address in {a for i in ifs[h.ssh].values() for a in i.addresses}


def test_the_facts_script_reads_a_mac_through_its_commands(tmp_path, monkeypatch):
    # No Mac here: the macOS commands the script runs print the recordings (uname says Darwin).
    stem = DATA / THREE["mini-b.local"]
    shims = {
        "uname": "echo Darwin",
        "system_profiler": f"cat '{stem}.system_profiler.json'",
        "networksetup": f"case $1 in -listallhardwareports) cat '{stem}.networksetup.txt';; "
        f"-listnetworkserviceorder) cat '{stem}.services.txt';; *) exit 1;; esac",
        "ifconfig": f"cat '{stem}.ifconfig.txt'",
    }
    for name, body in shims.items():
        (tmp_path / name).write_text(f"#!/bin/sh\n{body}\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    (got,) = tb.gather(tmp_path / "unused_ssh_config", [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}])
    assert got == facts("127.0.0.1", THREE["mini-b.local"])
    assert got.interfaces["bridge0"].members == ["en2", "en3", "en4"]


def test_bridge0_addresses_are_warned_about_even_where_one_mac_took_bridge0_down(tmp_path):
    hosts = hosts_from(
        tmp_path,
        {
            "127.0.0.1": "169.254.12.40",
            "mini-b.local": "192.168.0.2",
            "mini-c.local": "169.254.140.251",
        },
    )
    ifs = {n: facts(n, s).interfaces for n, s in THREE.items()}
    ifs["mini-b.local"] = facts(
        "mini-b.local", THREE["mini-b.local"], "ifconfig-applied"
    ).interfaces
    link_local, bridged = address_checks.hostfile_warnings(hosts, ifs)
    assert "rank 1" not in link_local
    assert bridged.startswith(
        "rank(s) 0 (127.0.0.1), 2 (mini-c.local) use Thunderbolt Bridge (bridge0) addresses in a "
        "ring of 3 Macs"
    )
