"""What `check` says about RDMA over Thunderbolt (JACCL), read from recorded macOS outputs
(tests/data/macos/README.md names each source): the devices each Mac has and their ports' state, a
device hosts.json names that a Mac lacks (a problem, with the fix), a port that is down (a warning),
and on a TCP ring of Macs whether JACCL could carry it and how to turn it on."""

from pathlib import Path

from mlx_ring.hostfile import Host
from mlx_ring.hosts.facts import parse
from mlx_ring.hosts.rdma import rdma_notes, rdma_problems
from mlx_ring.macos_settings import (
    format_rdma,
    parse_ibv_devices,
    parse_ibv_devinfo,
    parse_macos_version,
    rdma_advice,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "macos"


def read(name: str) -> str:
    return (DATA / name).read_text()


def test_devices_and_port_states_are_read_from_apples_recorded_outputs():
    assert parse_ibv_devices(read("ibv_devices_mac_mini.txt")) == [
        "rdma_en2",
        "rdma_en3",
        "rdma_en4",
    ]
    assert parse_ibv_devices(read("ibv_devices_none.txt")) == []
    assert parse_ibv_devinfo(read("ibv_devinfo_active.txt")) == dict.fromkeys(
        ["rdma_en2", "rdma_en3", "rdma_en4"], "PORT_ACTIVE"
    )
    assert parse_ibv_devinfo(read("ibv_devinfo_one_down.txt")) == {
        "rdma_en2": "PORT_ACTIVE",
        "rdma_en3": "PORT_DOWN",
        "rdma_en4": "PORT_DOWN",
    }
    assert parse_macos_version(read("sw_vers_26_2.txt")) == (26, 2)
    assert (
        parse_macos_version(read("sw_vers_15.txt")) == (15, 7, 2) and parse_macos_version("") == ()
    )


def mac(host: str, devices: str, devinfo: str = "", version: str = "sw_vers_26_2.txt"):
    """A Mac's facts as the facts script prints them."""
    name = "studio" if host == "127.0.0.1" else host.split(".")[0]  # this Mac: its own host name
    out = (
        f"hostname={name}\nsystem=Darwin arm64\nsw_vers<<\n{read(version)}>>\n"
        f"ibv_devices<<\n{read(devices)}>>\nibv_devinfo<<\n{read(devinfo) if devinfo else ''}>>\n"
    )
    return parse(host, out)


def test_the_facts_script_output_gives_each_macs_devices_and_the_check_column():
    f = mac("mini-b.local", "ibv_devices_mac_mini.txt", "ibv_devinfo_one_down.txt")
    assert f.macos == (26, 2) and f.rdma == {
        "rdma_en2": "PORT_ACTIVE",
        "rdma_en3": "PORT_DOWN",
        "rdma_en4": "PORT_DOWN",
    }
    assert format_rdma(f.rdma) == "rdma_en2, rdma_en3 (down), rdma_en4 (down)"
    assert format_rdma(mac("m", "ibv_devices_none.txt").rdma) == "none"
    assert parse("gpu-box", "system=Linux x86_64\n").rdma == {}


def test_a_mac_without_devices_is_told_to_run_rdma_ctl_in_recovery_or_to_update_macos():
    enable = "turn RDMA over Thunderbolt on once in macOS Recovery"
    assert rdma_advice((26, 2), {}).startswith(
        "it has no RDMA devices (`ibv_devices` lists none): on a Mac with "
        f"Thunderbolt 5 ports, {enable}"
    )
    assert "`rdma_ctl enable` there and restart" in rdma_advice((26, 2), {})
    old = rdma_advice((15, 7, 2), {})
    assert old.startswith(
        "it has no RDMA devices: RDMA over Thunderbolt needs macOS 26.2 or later (it runs 15.7.2)"
    )
    assert rdma_advice((26, 2), {"rdma_en2": "PORT_ACTIVE"}) is None


def host(rank: int, ssh: str, rdma: tuple) -> Host:
    return Host(rank, ssh, f"10.0.1.{rank}", f"10.0.1.{rank}", 32323 + rank, {}, rdma)


def test_a_device_hosts_json_names_that_a_mac_lacks_stops_the_start_with_the_fix():
    hosts = [
        host(0, "127.0.0.1", (None, "rdma_en2", "rdma_en3")),
        host(1, "mini-b.local", ("rdma_en2", None, "rdma_en5")),
        host(2, "mini-c.local", (["rdma_en2", "rdma_en3"], "rdma_en4", None)),
    ]
    facts = {
        "127.0.0.1": mac("127.0.0.1", "ibv_devices_mac_mini.txt", "ibv_devinfo_active.txt"),
        "mini-b.local": mac("mini-b.local", "ibv_devices_mac_mini.txt", "ibv_devinfo_one_down.txt"),
        "mini-c.local": mac("mini-c.local", "ibv_devices_none.txt", version="sw_vers_15.txt"),
    }
    problems, warned = rdma_problems(hosts, facts)
    assert problems == [
        "mini-b.local (rank 1): hosts.json gives it RDMA device(s) rdma_en5, but `ibv_devices` "
        "there lists rdma_en2, rdma_en3, rdma_en4; a cable may have moved to another port: run "
        "`mlx.distributed_config --over thunderbolt --backend jaccl` (or jaccl-ring) again",
        "mini-c.local (rank 2): hosts.json gives it RDMA device(s) rdma_en2, rdma_en3, rdma_en4, "
        "but `ibv_devices` there lists none; it has no RDMA devices: RDMA over Thunderbolt needs "
        "macOS 26.2 or later (it runs 15.7.2) and Thunderbolt 5 ports; after updating, turn RDMA "
        "over Thunderbolt on once in macOS Recovery (hold the power button while it starts, "
        "Options, then Utilities > Terminal), run `rdma_ctl enable` there and restart; "
        "`ibv_devices` then lists its rdma_en* devices",
    ]
    assert warned == []  # rank 1's down ports are not the ones it uses
    hosts[1] = host(1, "mini-b.local", ("rdma_en3", None, "rdma_en2"))
    problems, warned = rdma_problems(hosts[:2], facts)
    assert problems == [] and warned == [
        "mini-b.local (rank 1): RDMA device rdma_en3's port is PORT_DOWN (its cable is "
        "out, or the Mac at the other end has not turned RDMA on)"
    ]
    linux = {"127.0.0.1": parse("127.0.0.1", "system=Linux x86_64\n")}
    assert rdma_problems(hosts[:1], linux)[0][0].startswith(
        "this machine (rank 0) is not a Mac (Linux x86_64), but hosts.json gives it RDMA devices"
    )


def test_check_on_a_tcp_ring_of_macs_says_whether_jaccl_could_carry_it():
    hosts = [host(0, "127.0.0.1", ()), host(1, "mini-b.local", ())]
    both = {
        "127.0.0.1": mac("127.0.0.1", "ibv_devices_mac_mini.txt"),
        "mini-b.local": mac("mini-b.local", "ibv_devices_mac_mini.txt"),
    }
    assert rdma_notes(hosts, both, "ring") == [
        "every Mac has RDMA over Thunderbolt devices: `mlx.distributed_config --over thunderbolt "
        "--backend jaccl --hosts studio,mini-b.local --output-hostfile hosts.json` writes a "
        "hostfile that runs the ring over it (JACCL; --backend jaccl-ring where each Mac is cabled "
        "only to its neighbours)"
    ]
    assert rdma_notes(hosts, both, "jaccl") == []  # already on it
    one = {**both, "mini-b.local": mac("mini-b.local", "ibv_devices_none.txt")}
    notes = rdma_notes(hosts, one, "ring")
    assert (
        notes[0]
        == "RDMA over Thunderbolt 5 (JACCL) links Macs cabled to each other faster than TCP:"
    )
    assert notes[1:] == ["  mini-b.local: " + rdma_advice((26, 2), {})]
